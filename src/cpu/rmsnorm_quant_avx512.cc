// fp8ref CPU backend — rmsnorm_quant steps 5–9 for bf16 rows with AVX-512 BF16 + VBMI (rmsnorm_quant_avx512.h).
//
// Why a second kernel: on AMD Zen 4 (and any core that runs 512-bit operations at two per cycle) the Highway path's
// fused per-group loop (NormQuantBf16) spends ~22 cycles per 16 values — the scalar scale chain of each group, spills
// of its 16 live vectors, and 4-instruction bf16 roundings. Here the row takes two passes through L1:
//   A (norm_pass): 32 values per step from one 64-byte load of bf16 pairs (the even elements by a shift, the odd by a
//     mask: no widening shuffle), a = z·r, bf16(a) for dtype-twice and y = bf16(…·w) each by one vcvtne2ps2bf16 per
//     32 values, y stored packed (bf16), the group's max |y| as a u16 max; 32-lane u16 minimum of the nonzero |x|;
//     one line of a later row's inputs prefetched into L2 per step (the caller passes the next row).
//   (the caller: the groups' scales in lanes, RowGroupScales)
//   B (quant_pass): y widened back by a shift or a mask, the quotient as the Highway path computes it (Markstein's
//     one correction for x/s, fp8_lanes-inl.h MarksteinDiv1; or y·RN(1/s)), |q| clamped to max and its sign dropped by
//     one vrangeps, the e4m3fn code by one f32 add of C' = 2^(E+20) + 8·(E+6) ulps (fp8_lanes-inl.h CastE4m3Mag's
//     portable form: the code is the low byte of the sum; C' by one dword permutation of the exponent), 64 codes put
//     back in element order by two vpermt2b and a blend, y's sign (bit 7 of its bf16 word's high byte, gathered by a
//     third vpermt2b) ORed in (Coder; quant_bf16 runs it on x itself for the group quant, src/cpu/quant_cpu.cc).
//     Outputs of 16 MiB and more: non-temporal stores (LineStream).
// Lane order. Each step permutes the 32 values of its chunk: the pair load puts elements 2i in vector 0 and 2i + 1 in
// vector 1; vcvtne2ps2bf16(v1, v0) packs vector 0 into words 0–15 and vector 1 into words 16–31; the next widening
// takes words 2i and 2i + 1 again. make_plan follows each element through these steps, permutes the weights to the
// lanes that multiply them and builds the byte index that puts the codes back in order. Every step between is
// element-wise, so the values are the Highway path's bit for bit (tests/test_rmsnorm_quant.cc compares both with the
// reference on every case).
// Exactness of vcvtne2ps2bf16: RNE as (b + 0x7FFF + lsb) >> 16 for normal values, Inf kept, NaN quieted — but a
// subnormal input becomes ±0. norm_pass therefore proves per row that no nonzero value there is subnormal: with zmin
// the smallest nonzero |z| and wmin the smallest nonzero |w| (make_plan), RN(zmin·r) >= 2^-126 and
// bf16(RN(zmin·r))·wmin >= 2^-126 (dtype-twice; RN(zmin·r)·wmin for dtype-once) bound every a and every product from
// below (rounding is monotone). A row that fails (values near 2^-126 of the largest) goes the Highway way. Not needed
// (Plan::flush_ok, session 28) where the quant spec's scale guard keeps every scale far above anything the flush can
// change: those y have the code ±0 either way (flush_subnormal_harmless) — vLLM's min-scale; its cub pass then skips
// the smallest-|x| scan (3 of its instructions per 32 values).
// Measured (bench/RESULTS.md, session 16), Zen 4, bf16 [4096, 7168], vllm-rmsnorm-quant: 2 threads 7.56 -> 5.50 ms;
// one thread in cache 1.64 -> 1.10 cycles per value; session 17, each row's quant pass deferred into the next row to
// hide the rsqrt table's miss (rmsnorm_quant_cpu.cc): 4.83 ms. Not kept: the same passes for weight=f32 (y in f32
// through L1: slower than the Highway path, 5.94 vs 5.35 ms). Kept since session 25 (Xeon with AMX): weight=f32 as
// two passes that compute y from x each time (amax_pass, wquant_pass): aiter-rmsnorm-quant one thread in cache
// 0.166 -> 0.150 ms per [64, 7168], 2 threads 5.74–5.92 -> 5.24–5.33 ms (with the f64 Σx² and rsqrt of the caller).
#include "cpu/rmsnorm_quant_avx512.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

// GCC 12 flags its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define FP8REF_RQ512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,avx512bf16")))

namespace fp8ref::cpu {

// leaf 1 ECX FMA (12), OSXSAVE (27), F16C (29); leaf 7.0 EBX AVX512F (16), DQ (17), BW (30), VL (31), ECX AVX512_VBMI
// (1); leaf 7.1 EAX AVX512_BF16 (5); XCR0 with the SSE, AVX and AVX-512 state (bits 1, 2, 5–7). (CPUID rather than
// __builtin_cpu_supports: GCC's and clang's know different feature names.)
bool cpu_has_avx512bf16() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !((c >> 12) & 1) || !((c >> 27) & 1) || !((c >> 29) & 1)) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((b >> 16) & 1) || !((b >> 17) & 1) || !((b >> 30) & 1) || !((b >> 31) & 1) || !((c >> 1) & 1)) return false;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !((a >> 5) & 1)) return false;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    return (xlo & 0xE6u) == 0xE6u;
  }();
  return ok;
}

namespace {
std::atomic<bool> g_kernels_off{false};
}  // namespace
bool avx512bf16_kernels() { return cpu_has_avx512bf16() && !g_kernels_off.load(std::memory_order_relaxed); }
void set_avx512bf16_kernels_for_test(bool on) { g_kernels_off.store(!on, std::memory_order_relaxed); }

namespace rq512 {
namespace {

float f32_of(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// C' per biased exponent e in [121, 135] (the magnitude's, at least 2^-6's), at index e mod 16: bits(2^(e-127+20)) +
// 8·(e − 121) — fp8_lanes-inl.h CastE4m3Mag's portable form, whose low byte after the add is the code.
struct CastTable {
  alignas(64) uint32_t c[16];
  CastTable() : c{} {
    for (uint32_t e = 121; e <= 135; ++e) c[e % 16] = ((e + 20u) << 23) + 8u * (e - 121u);
  }
};
const CastTable kCast;

FP8REF_RQ512 inline uint16_t max_u16(__m512i v) {
  const __m256i m = _mm256_max_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  const __m128i m2 = _mm_max_epu16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  return static_cast<uint16_t>(~_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m2, _mm_set1_epi32(-1)))));
}

// kGuard: 2 the smallest nonzero |z| taken here, 1 the caller's (zmin1: bf16 z), 0 none needed (Plan::flush_ok)
template <int kMode, ZKind kZ, int kGuard>
FP8REF_RQ512 bool norm_pass_t(const Plan& p, const uint16_t* x, const uint16_t* res, const float* zf, size_t K, size_t G,
                              float r, uint16_t* y, float* gmax, uint32_t zmin1, const uint16_t* pf_x,
                              const uint16_t* pf_r) {
  const __m512 vr = _mm512_set1_ps(r);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)), abs16 = _mm512_set1_epi16(0x7FFF);
  const __m512i one16 = _mm512_set1_epi16(1), abs32 = _mm512_set1_epi32(0x7FFFFFFF), one32 = _mm512_set1_epi32(1);
  // the smallest nonzero |z| less one ulp (zero and −0 wrap to the largest value)
  __m512i zmin = _mm512_set1_epi32(-1);
  auto zmin32 = [&](__m512 v) FP8REF_RQ512 {
    zmin = _mm512_min_epu32(zmin, _mm512_and_si512(_mm512_sub_epi32(_mm512_castps_si512(v), one32), abs32));
  };
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    __m512i mx = _mm512_setzero_si512();
    for (size_t k = k0; k < k0 + G; k += 32) {
      __m512 v0, v1;
      if constexpr (kZ == ZKind::f32) {
        v0 = _mm512_loadu_ps(zf + k);
        v1 = _mm512_loadu_ps(zf + k + 16);
        if constexpr (kGuard == 2) {
          zmin32(v0);
          zmin32(v1);
        }
      } else {
        const __m512i u = _mm512_loadu_si512(x + k);
        v0 = _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
        v1 = _mm512_castsi512_ps(_mm512_and_si512(u, hi));
        if constexpr (kZ == ZKind::sum_f32) {
          const __m512i t = _mm512_loadu_si512(res + k);
          v0 = _mm512_add_ps(v0, _mm512_castsi512_ps(_mm512_slli_epi32(t, 16)));
          v1 = _mm512_add_ps(v1, _mm512_castsi512_ps(_mm512_and_si512(t, hi)));
          if constexpr (kGuard == 2) {
            zmin32(v0);
            zmin32(v1);
          }
        } else if constexpr (kGuard == 2) {  // on the bf16 pairs themselves (else the caller's zmin1)
          zmin = _mm512_min_epu16(zmin, _mm512_and_si512(_mm512_sub_epi16(u, one16), abs16));
        }
      }
      if ((k & 32) == 0) {  // the second half of the later row, a line per 64 values (quant_pass: the first)
        if (pf_x) _mm_prefetch(reinterpret_cast<const char*>(pf_x + K / 2 + k / 2), _MM_HINT_T1);
        if (pf_r) _mm_prefetch(reinterpret_cast<const char*>(pf_r + K / 2 + k / 2), _MM_HINT_T1);
      }
      const __m512i wu = _mm512_load_si512(p.wperm16 + k);
      const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(wu, 16)), w1 = _mm512_castsi512_ps(_mm512_and_si512(wu, hi));
      const __m512 a0 = _mm512_mul_ps(v0, vr), a1 = _mm512_mul_ps(v1, vr);
      __m512i yb;
      if constexpr (kMode == 2) {
        yb = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(a1, w1), _mm512_mul_ps(a0, w0));
      } else {
        const __m512i ab = (__m512i)_mm512_cvtne2ps_pbh(a1, a0);
        const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(ab, 16)), o = _mm512_castsi512_ps(_mm512_and_si512(ab, hi));
        yb = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(o, w1), _mm512_mul_ps(e, w0));
      }
      _mm512_store_si512(y + k, yb);
      mx = _mm512_max_epu16(mx, _mm512_and_si512(yb, abs16));
    }
    const uint16_t m = max_u16(mx);
    if (m >= 0x7F80u) return false;  // a NaN or an Inf in the group
    gmax[g] = f32_of(static_cast<uint32_t>(m) << 16);
  }
  if constexpr (kGuard == 0) return true;
  // no nonzero a = RN(z·r) or product below 2^-126 (see the top)
  float zmin_f;
  if constexpr (kZ == ZKind::bf16) {
    const uint16_t m = kGuard == 2 ? static_cast<uint16_t>(~max_u16(_mm512_xor_si512(zmin, _mm512_set1_epi32(-1))))
                             : static_cast<uint16_t>(zmin1);
    if (m == 0x7FFF) return true;  // every z is ±0
    zmin_f = f32_of(static_cast<uint32_t>(m + 1) << 16);
  } else {
    const uint32_t m = static_cast<uint32_t>(_mm512_reduce_min_epu32(zmin));
    if (m == 0x7FFFFFFFu) return true;
    zmin_f = f32_of(m + 1);
  }
  const float amin = zmin_f * r;
  if (!(amin >= 0x1p-126f)) return false;
  if (!std::isfinite(p.wmin)) return true;  // every w is ±0
  const float f = kMode == 1 ? f32_of(((bits_of(amin) + 0x7FFFu + ((bits_of(amin) >> 16) & 1u)) >> 16) << 16) : amin;
  return static_cast<double>(f) * static_cast<double>(p.wmin) >= 0x1p-126;
}

// Consecutive 64-byte vectors to dst at any alignment d = dst mod 64: every whole cache line by a non-temporal store
// (no read for ownership; the output is not read again here), the partial lines at both ends by masked stores (they
// hold the neighbouring rows' bytes, which another thread may be writing). Line j of the aligned destination takes
// the last d bytes of vector j − 1 and the first 64 − d of vector j (one vpermt2b).
struct LineStream {
  uint8_t* base;  // dst − d: 64-byte aligned
  unsigned d;
  __m512i idx, prev;
  size_t j = 0;
  FP8REF_RQ512 explicit LineStream(uint8_t* dst)
      : base(dst - (reinterpret_cast<uintptr_t>(dst) & 63)), d(static_cast<unsigned>(reinterpret_cast<uintptr_t>(dst) & 63)) {
    // byte i: 64 − d + i
    idx = _mm512_add_epi8(_mm512_set_epi8(63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44,
                                          43, 42, 41, 40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24,
                                          23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2,
                                          1, 0),
                          _mm512_set1_epi8(static_cast<char>(64 - d)));
    prev = _mm512_setzero_si512();
  }
  FP8REF_RQ512 void put(__m512i v) {
    const __m512i line = _mm512_permutex2var_epi8(prev, idx, v);
    if (j == 0 && d) _mm512_mask_storeu_epi8(base, ~__mmask64{0} << d, line);
    else _mm512_stream_si512(reinterpret_cast<__m512i*>(base + 64 * j), line);
    prev = v;
    ++j;
  }
  FP8REF_RQ512 void finish() {
    if (d) _mm512_mask_storeu_epi8(base + 64 * j, (__mmask64{1} << d) - 1, _mm512_permutex2var_epi8(prev, idx, prev));
  }
};

// order[o] (o < 64) = 2·j (+ 64 for u1's words): output byte o is the code of word j of u0 (u1). Word j (of u0; u1
// alike with c2, c3) has its code in the low byte of dword j/2 of c0 (j even: the even elements) or c1 (j odd):
// byte 2j of the pair (c0, c1) for j even, 64 + 2(j − 1) for j odd; the sign in the high byte of the word.
CodeOrder make_code_order(const uint8_t* order) {
  CodeOrder r;
  for (int o = 0; o < 64; ++o) {
    const int src = order[o], wi = src / 2, j = wi % 32;
    const uint8_t at = static_cast<uint8_t>(j % 2 == 0 ? 2 * j : 64 + 2 * (j - 1));
    if (wi < 32) {
      r.ia[o] = at;
    } else {
      r.ib[o] = at;
      r.kab |= uint64_t{1} << o;
    }
    r.is[o] = static_cast<uint8_t>(src + 1);
  }
  return r;
}

// The codes of 64 bf16 values y (two 64-byte vectors of words, u0 and u1) as 64 bytes in a given order: q = RN(y / a)
// by Markstein's correction with b = RN(1/a) (kOp 0: x/s), RN(y · a) (1: x*(1/s), and y·2^-k), RN(RN(y · b) · a)
// (2: Triton's x/s); min(|q|, bound) with the sign dropped (vrangeps), the e4m3fn code by the C' add (its low byte);
// the codes gathered into byte order by two vpermt2b and a blend, y's sign bits (bit 7 of each word's high byte,
// gathered the same way) ORed in as bit 7. The bits of fp8_lanes' CastE4m3Mag and of ElemFastT's code().
// The order: a CodeOrder (make_code_order, built once per plan; per row it cost ~6 % of the pass). The four 16-lane
// code computations run stage by stage (interleaved in the source; GCC keeps the order on x86): four independent
// chains keep the vector pipes busy where one chain after another waits on its latency. Measured on Zen 4
// (bench_rmsnorm_passes, bench/RESULTS.md session 17): 0.46–0.50 cycles per value with one chain at a time, the sign
// by a vpmovw2m word mask and a masked add, the words packed by vpermt2w + vpermt2b; 0.43–0.48 as here.
template <int kOp>
struct Coder {
  __m512 va, vb, bound;
  __m512i hi, emin, sgnb, ctab, idxa, idxb, idxs;
  __mmask64 kab;  // output bytes taken from (c2, c3) rather than (c0, c1)
  FP8REF_RQ512 Coder(float mx, const CodeOrder& o) {
    hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    emin = _mm512_set1_epi32(0x3C800000);
    sgnb = _mm512_set1_epi8(static_cast<char>(0x80));
    ctab = _mm512_load_si512(kCast.c);
    bound = _mm512_set1_ps(mx);
    idxa = _mm512_load_si512(o.ia);
    idxb = _mm512_load_si512(o.ib);
    idxs = _mm512_load_si512(o.is);
    kab = o.kab;
    va = vb = _mm512_setzero_ps();
  }
  FP8REF_RQ512 void group(float a, float b) {
    va = _mm512_set1_ps(a);
    vb = _mm512_set1_ps(b);
  }
  FP8REF_RQ512 __m512i codes64(__m512i u0, __m512i u1) const {
    const __m512 y[4] = {_mm512_castsi512_ps(_mm512_slli_epi32(u0, 16)), _mm512_castsi512_ps(_mm512_and_si512(u0, hi)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(u1, 16)), _mm512_castsi512_ps(_mm512_and_si512(u1, hi))};
    return codes(y, [&]() FP8REF_RQ512 { return signs(u0, u1); });
  }
  // bit 7 of output byte o: the sign of word order[o] of (u0, u1) (the high byte of the word)
  FP8REF_RQ512 __m512i signs(__m512i u0, __m512i u1) const { return _mm512_permutex2var_epi8(u0, idxs, u1); }
  // The codes of the four lane vectors y (the lanes of codes64's: the even and odd words of u0, then of u1) with bit 7
  // of sg()'s output byte o as the sign of code o; y's own signs are dropped. (sg is called last: the gather stays
  // where codes64 always had it, after the cast.)
  template <class Sg>
  FP8REF_RQ512 __m512i codes(const __m512 (&y)[4], Sg sg) const {
    __m512 q[4];
    if constexpr (kOp == 0) {
      __m512 q0[4], e[4];
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) q0[i] = _mm512_mul_ps(y[i], vb);
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) e[i] = _mm512_fnmadd_ps(q0[i], va, y[i]);
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) q[i] = _mm512_fmadd_ps(e[i], vb, q0[i]);
    } else if constexpr (kOp == 1) {
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) q[i] = _mm512_mul_ps(y[i], va);
    } else {
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) q[i] = _mm512_mul_ps(y[i], vb);
      _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) q[i] = _mm512_mul_ps(q[i], va);
    }
    __m512 m[4];
    __m512i e[4], c[4];
    // min(|q|, bound), sign cleared; the exponent index (at least 2^-6's: bits 23..26 of the clamped m, moved to
    // bits 0..3 for vpermd by a rotate — Zen 4 runs rotates on the FMA pipes and shifts beside vrangeps and vaddps,
    // which this chain keeps busy: bench_rmsnorm_passes 0.432 -> 0.427 cycles per value, session 20); the code in the
    // low byte of m + C'
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i) m[i] = _mm512_range_ps(q[i], bound, 0x0A);
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i)
      e[i] = _mm512_rol_epi32(_mm512_max_epu32(_mm512_castps_si512(m[i]), emin), 9);
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; ++i)
      c[i] = _mm512_castps_si512(_mm512_add_ps(m[i], _mm512_castsi512_ps(_mm512_permutexvar_epi32(e[i], ctab))));
    const __m512i codes = _mm512_mask_blend_epi8(kab, _mm512_permutex2var_epi8(c[0], idxa, c[1]),
                                                 _mm512_permutex2var_epi8(c[2], idxb, c[3]));
    return _mm512_ternarylogic_epi32(codes, sg(), sgnb, 0xF8);  // codes | (sg & 0x80)
  }
};

template <int kOp>
FP8REF_RQ512 void quant_pass_t(const Plan& p, const uint16_t* y, size_t K, size_t G, const float* gsv, const float* grb,
                               float mx, uint8_t* q, bool stream, const uint16_t* pf_x, const uint16_t* pf_r) {
  LineStream out(q);
  Coder<kOp> cd(mx, p.order);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    cd.group(gsv[g], grb[g]);
    for (size_t k = k0; k < k0 + G; k += 64) {
      if (pf_x) _mm_prefetch(reinterpret_cast<const char*>(pf_x + k / 2), _MM_HINT_T1);  // (the first half: line k/64)
      if (pf_r) _mm_prefetch(reinterpret_cast<const char*>(pf_r + k / 2), _MM_HINT_T1);
      const __m512i c = cd.codes64(_mm512_load_si512(y + k), _mm512_load_si512(y + k + 32));
      if (stream) out.put(c);
      else _mm512_storeu_si512(q + k, c);
    }
  }
  if (stream) out.finish();
}

// Element order: output byte o is the code of element o (word o of (u0, u1))
alignas(64) constexpr uint8_t kLowBytes[64] = {
    0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
    44, 46, 48, 50, 52, 54, 56, 58, 60, 62, 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86,
    88, 90, 92, 94, 96, 98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126};
const CodeOrder kLowOrder = make_code_order(kLowBytes);

// weight=f32 (plan mode 0: y = RN(RN(z·r)·w), no bf16 rounding; aiter-rmsnorm-quant), bf16 z = x. The weights are
// |w|: RNE products are symmetric in sign, so RN(RN(z·r)·|w|) = ±|y| (r > 0) — pass A takes it from |z|, pass B
// from z, whose sign Coder drops — and y's sign is z's XOR w's (a zero product's too), which pass B ORs into the codes.
// |w| sits in the lanes of make_plan's bf16 z (vector 0 the even elements of each 32-chunk, vector 1 the odd ones) —
// the lanes of Coder's (u0, u1) as well, so pass B puts the codes in element order with kLowBytes. y is not stored:
// pass B computes it again from x (two multiplies per 16 values where a store and a load of f32 y through L1 cost
// more: session 16 measured that form slower than the Highway path).
// Pass A: the f32 bits of max |y| per group into gmax; false for a group whose max is Inf or NaN (a NaN's bits, either
// sign, are above Inf's as u32).
// y = RN(RN(z·r)·|w|) of the 32 bf16 values in u at their weights w (the plan's |w| of that 32-chunk): the even
// elements into y0, the odd ones into y1
FP8REF_RQ512 inline void y_f32(__m512i u, __m512 vr, const float* w, __m512& y0, __m512& y1) {
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  y0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), vr), _mm512_load_ps(w));
  y1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(u, hi)), vr), _mm512_load_ps(w + 16));
}
FP8REF_RQ512 bool amax_pass_t(const Plan& p, const uint16_t* x, size_t K, size_t G, float r, float* gmax,
                              const uint16_t* pf_x) {
  const __m512 vr = _mm512_set1_ps(r);
  const __m512i mag = _mm512_set1_epi16(0x7FFF);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    __m512i m0 = _mm512_setzero_si512(), m1 = m0;
    for (size_t k = k0; k < k0 + G; k += 32) {
      if (pf_x && (k & 32) == 0)  // the first half of the later row, a line per 64 values (wquant_pass: the second)
        _mm_prefetch(reinterpret_cast<const char*>(pf_x + k / 2), _MM_HINT_T1);
      __m512 y0, y1;
      y_f32(_mm512_and_si512(_mm512_loadu_si512(x + k), mag), vr, p.wperm + k, y0, y1);
      m0 = _mm512_max_epu32(m0, _mm512_castps_si512(y0));
      m1 = _mm512_max_epu32(m1, _mm512_castps_si512(y1));
    }
    const uint32_t m = static_cast<uint32_t>(_mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1)));
    if (m >= 0x7F800000u) return false;  // a NaN or an Inf in the group (a NaN's bits, either sign, are above Inf's)
    gmax[g] = f32_of(m);
  }
  return true;
}

// Pass B: y again, q = RN(|y| · ga[g]) (x*(1/s)), the codes as quant_pass's, signed by x's sign XOR w's (p.wsign).
template <bool kWsign>
FP8REF_RQ512 void wquant_pass_t(const Plan& p, const uint16_t* x, size_t K, size_t G, float r, const float* ga,
                                float mx, uint8_t* q, bool stream, const uint16_t* pf_x) {
  LineStream out(q);
  Coder<1> cd(mx, kLowOrder);
  const __m512 vr = _mm512_set1_ps(r);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    cd.group(ga[g], 0.0f);
    for (size_t k = k0; k < k0 + G; k += 64) {
      if (pf_x) _mm_prefetch(reinterpret_cast<const char*>(pf_x + K / 2 + k / 2), _MM_HINT_T1);  // (line K/64 + k/64)
      const __m512i u0 = _mm512_loadu_si512(x + k), u1 = _mm512_loadu_si512(x + k + 32);
      __m512 y[4];
      y_f32(u0, vr, p.wperm + k, y[0], y[1]);
      y_f32(u1, vr, p.wperm + k + 32, y[2], y[3]);
      const __m512i c = cd.codes(y, [&]() FP8REF_RQ512 {
        const __m512i sg = cd.signs(u0, u1);
        return kWsign ? _mm512_xor_si512(sg, _mm512_loadu_si512(p.wsign + k)) : sg;
      });
      if (stream) out.put(c);
      else _mm512_storeu_si512(q + k, c);
    }
  }
  if (stream) out.finish();
}

template <int kOp>
FP8REF_RQ512 bool quant_bf16_t(const uint16_t* x, size_t n, size_t G, const float* a, const float* b, float bound,
                               uint8_t* q, const uint16_t* nx, uint32_t* namax, size_t ahead) {
  Coder<kOp> cd(bound, kLowOrder);
  const __m512i mag16 = _mm512_set1_epi16(0x7FFF);
  bool next_all = nx != nullptr;
  for (size_t k0 = 0, g = 0; k0 < n; k0 += G, ++g) {
    cd.group(a[g], b[g]);
    __m512i nacc = _mm512_setzero_si512();
    for (size_t k = k0; k < k0 + G; k += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(x + k + ahead), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(x + k + ahead + 32), _MM_HINT_T1);
      if (nx)
        nacc = _mm512_max_epu16(nacc, _mm512_max_epu16(_mm512_and_si512(_mm512_loadu_si512(nx + k), mag16),
                                                        _mm512_and_si512(_mm512_loadu_si512(nx + k + 32), mag16)));
      _mm512_storeu_si512(q + k, cd.codes64(_mm512_loadu_si512(x + k), _mm512_loadu_si512(x + k + 32)));
    }
    if (nx) {
      const uint16_t m = max_u16(nacc);
      if (m >= 0x7F80u) {  // an Inf or NaN in the next chunk: the caller scans it
        next_all = false;
        nx = nullptr;
      } else {
        namax[g] = static_cast<uint32_t>(m) << 16;
      }
    }
  }
  return next_all;
}

// make_plan's loops in lanes (a one-row call spent ~3x its passes' time in the scalar ones: session 22): wperm per
// 32-chunk by two two-table permutes; the smallest nonzero |w| as a u32 minimum of (bits(|w|) − 1), zero wrapping to
// the largest — the scalar loop's min over 0 < |w| < +Inf (NaN and Inf bits are >= Inf's: none such, +Inf).
FP8REF_RQ512 float permute_weights(const float* wf, size_t K, const int32_t* i0, const int32_t* i1, float* wperm,
                                   uint32_t* wmax_bits) {
  const __m512i x0 = _mm512_load_si512(i0), x1 = _mm512_load_si512(i1);
  const __m512i abs32 = _mm512_set1_epi32(0x7FFFFFFF), one32 = _mm512_set1_epi32(1);
  __m512i mn = _mm512_set1_epi32(-1), mx = _mm512_setzero_si512();
  for (size_t c = 0; c < K; c += 32) {
    const __m512 lo = _mm512_loadu_ps(wf + c), hi = _mm512_loadu_ps(wf + c + 16);
    _mm512_storeu_ps(wperm + c, _mm512_permutex2var_ps(lo, x0, hi));
    _mm512_storeu_ps(wperm + c + 16, _mm512_permutex2var_ps(lo, x1, hi));
    mn = _mm512_min_epu32(mn, _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(lo), abs32), one32));
    mn = _mm512_min_epu32(mn, _mm512_sub_epi32(_mm512_and_si512(_mm512_castps_si512(hi), abs32), one32));
    mx = _mm512_max_epu32(mx, _mm512_max_epu32(_mm512_and_si512(_mm512_castps_si512(lo), abs32),
                                               _mm512_and_si512(_mm512_castps_si512(hi), abs32)));
  }
  alignas(64) uint32_t l[16];
  _mm512_store_si512(l, mx);
  *wmax_bits = *std::max_element(l, l + 16);
  _mm512_store_si512(l, mn);
  const uint32_t m = *std::min_element(l, l + 16) + 1u;  // (all zero: wraps to 0)
  return m == 0 || m >= 0x7F800000u ? INFINITY : f32_of(m);
}

}  // namespace

void make_plan(int mode, ZKind zkind, const float* wf, size_t K, float* wperm, Plan* plan, uint8_t* wsign) {
  plan->mode = mode;
  plan->zkind = zkind;
  plan->wperm = wperm;
  plan->wsign = nullptr;
  // the element (within its 32-chunk) in each lane: v0/v1 after the load, W after the first pack, L0/L1 the lanes
  // that multiply the weights, Y the packed y (also the order of pass B's words)
  int v0[16], v1[16], W[32], L0[16], L1[16], Y[32];
  for (int i = 0; i < 16; ++i) {
    v0[i] = zkind == ZKind::f32 ? i : 2 * i;
    v1[i] = zkind == ZKind::f32 ? 16 + i : 2 * i + 1;
  }
  for (int j = 0; j < 32; ++j) W[j] = j < 16 ? v0[j] : v1[j - 16];
  for (int i = 0; i < 16; ++i) {
    L0[i] = mode != 1 ? v0[i] : W[2 * i];
    L1[i] = mode != 1 ? v1[i] : W[2 * i + 1];
  }
  for (int j = 0; j < 32; ++j) Y[j] = mode != 1 ? W[j] : (j < 16 ? L0[j] : L1[j - 16]);
  for (int j = 0; j < 32; ++j) {
    plan->idxb[Y[j]] = static_cast<uint8_t>(2 * j);
    plan->idxb[32 + Y[j]] = static_cast<uint8_t>(64 + 2 * j);
  }
  plan->order = make_code_order(plan->idxb);
  alignas(64) int32_t i0[16], i1[16];
  for (int i = 0; i < 16; ++i) {
    i0[i] = L0[i];
    i1[i] = L1[i];
  }
  plan->wmin = permute_weights(wf, K, i0, i1, wperm, &plan->wmax_bits);
  plan->flush_ok = false;
  if (mode != 0) {  // bf16 pairs in place: word 2i of a 32-chunk the weight of lane i of vector 0, 2i + 1 of vector 1
    plan->wperm = nullptr;  // (the f32 weights are overwritten: wperm16 holds them)
    auto* w16 = reinterpret_cast<uint16_t*>(wperm);
    for (size_t c = 0; c < K; c += 32) {
      float t[32];
      std::memcpy(t, wperm + c, sizeof t);
      for (int i = 0; i < 16; ++i) {
        w16[c + 2 * i] = static_cast<uint16_t>(bits_of(t[i]) >> 16);
        w16[c + 2 * i + 1] = static_cast<uint16_t>(bits_of(t[16 + i]) >> 16);
      }
    }
    plan->wperm16 = w16;
  } else {  // |w| in the lanes, and the signs in element order where any is set
    bool any = false;
    for (size_t k = 0; k < K; ++k) {
      const uint32_t b = bits_of(wf[k]);
      wsign[k] = static_cast<uint8_t>(b >> 24 & 0x80u);
      any = any || b >> 31;
    }
    for (size_t k = 0; k < K; ++k) wperm[k] = std::fabs(wperm[k]);
    if (any) plan->wsign = wsign;
  }
}

bool flush_subnormal_harmless(const Plan& plan, double s_min) {
  return s_min >= 0x1p-60 && plan.wmax_bits <= bits_of(0x1p50f);
}

void fence() { _mm_sfence(); }

bool norm_pass(const Plan& p, const uint16_t* x, const uint16_t* res, const float* zf, size_t K, size_t G, float r,
               uint16_t* y, float* gmax, uint32_t zmin1, const uint16_t* pf_x, const uint16_t* pf_r) {
#define FP8REF_RQ512_ARGS p, x, res, zf, K, G, r, y, gmax, zmin1, pf_x, pf_r
#define FP8REF_RQ512_NORM(M)                                                                                       \
  switch (p.zkind) {                                                                                               \
    case ZKind::bf16:                                                                                              \
      if (p.flush_ok) return norm_pass_t<M, ZKind::bf16, 0>(FP8REF_RQ512_ARGS);                                    \
      if (zmin1 < 0x10000u) return norm_pass_t<M, ZKind::bf16, 1>(FP8REF_RQ512_ARGS);                              \
      return norm_pass_t<M, ZKind::bf16, 2>(FP8REF_RQ512_ARGS);                                                    \
    case ZKind::sum_f32:                                                                                           \
      if (p.flush_ok) return norm_pass_t<M, ZKind::sum_f32, 0>(FP8REF_RQ512_ARGS);                                 \
      return norm_pass_t<M, ZKind::sum_f32, 2>(FP8REF_RQ512_ARGS);                                                 \
    default:                                                                                                       \
      if (p.flush_ok) return norm_pass_t<M, ZKind::f32, 0>(FP8REF_RQ512_ARGS);                                     \
      return norm_pass_t<M, ZKind::f32, 2>(FP8REF_RQ512_ARGS);                                                     \
  }
  if (p.mode == 1) FP8REF_RQ512_NORM(1)
  FP8REF_RQ512_NORM(2)
#undef FP8REF_RQ512_NORM
#undef FP8REF_RQ512_ARGS
}

bool amax_pass(const Plan& p, const uint16_t* x, size_t K, size_t G, float r, float* gmax, const uint16_t* pf_x) {
  return amax_pass_t(p, x, K, G, r, gmax, pf_x);
}

void wquant_pass(const Plan& p, const uint16_t* x, size_t K, size_t G, float r, const float* ga, float mx, uint8_t* q,
                 bool stream, const uint16_t* pf_x) {
  if (p.wsign) wquant_pass_t<true>(p, x, K, G, r, ga, mx, q, stream, pf_x);
  else wquant_pass_t<false>(p, x, K, G, r, ga, mx, q, stream, pf_x);
}

void quant_pass(const Plan& p, const uint16_t* y, size_t K, size_t G, const float* gsv, const float* grb, bool div,
                float mx, uint8_t* q, bool stream, const uint16_t* pf_x, const uint16_t* pf_r) {
  if (div) quant_pass_t<0>(p, y, K, G, gsv, grb, mx, q, stream, pf_x, pf_r);
  else quant_pass_t<1>(p, y, K, G, gsv, grb, mx, q, stream, pf_x, pf_r);
}

bool quant_bf16(const uint16_t* x, size_t n, size_t G, const float* a, const float* b, int op, float bound, uint8_t* q,
                const uint16_t* nx, uint32_t* namax, size_t ahead) {
  if (op == 0) return quant_bf16_t<0>(x, n, G, a, b, bound, q, nx, namax, ahead);
  if (op == 1) return quant_bf16_t<1>(x, n, G, a, b, bound, q, nx, namax, ahead);
  return quant_bf16_t<2>(x, n, G, a, b, bound, q, nx, namax, ahead);
}

}  // namespace rq512
}  // namespace fp8ref::cpu

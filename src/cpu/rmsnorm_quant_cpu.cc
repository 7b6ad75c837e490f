// fp8ref CPU backend — fused (residual add +) RMSNorm + FP8 group quantization (include/fp8ref/rmsnorm.h).
//
// Highway dynamic dispatch + OpenMP over rows; bit-identical to reference/rmsnorm_quant_ref.cc for every spec
// (tests/test_rmsnorm_quant.cc compares them over random and adversarial rows, every convention and field).
// Per row, in one thread, with the row held in three thread-local f32 buffers (L2-resident for K <= ~16k):
//   1. z = the (residual-added) row; bf16 loads/rounding in u32 lanes (RNE by integer code: b + 0x7FFF + lsb,
//      NaN quieted; with a residual on AVX-512 32 elements a step on bf16 pairs, LoadRowBf16), f16 element-wise
//      through ref::narrow (exact, not vectorised). bf16 rows on the vectorised group quant with variance exact or
//      cub write no f32 row: without a residual steps 2 and 5–6 read x itself and widen it in registers (ZBf16; z
//      is exactly the widened x); with a residual summed in f32 (residual-sum=f32) they recompute z = x + residual
//      from both rows (ZSum; the residual pass writes only residual_out, and for variance=exact sums z² on the
//      way, for variance=cub with T % 16 == 0 and K % 64 == 0 the cub partials) — unless residual_out overlaps x or
//      the residual (in place); with a residual summed in bf16 (residual-sum=dtype) the residual pass also writes
//      z's bf16 bits into a row of its own, which they read as ZBf16 (not on the AVX-512 BF16 passes). The same
//      holds for the quant specs below that run row by row. The f32 row is written only when a rarer
//      path needs it (the reference's exact sum, a NaN row).
//   2. the mean of squares:
//      exact    Σ z² in f64 lanes (z² is exact in f64; any order). For n non-negative terms the computed sum is
//               within γ_(n-1) = (n-1)u/(1-(n-1)u) of Σ (u = 2^-53; Higham, Accuracy and Stability, §4.2, any
//               summation tree), the f64 division adds one more u. If RN32 of the lower and the upper end of the
//               interval q·(1 ± (n+4)·2^-52) agree, that is RN32(Σ/n) (RN32 is monotone); otherwise (a quotient
//               within ~n·2^-52 of an f32 midpoint, rare) and for NaN/Inf rows: ref::mean_square_exact.
//      cub:T    the per-thread fma chains in f32 lanes, lane = thread (the vec4s split by LoadInterleaved4; bf16 rows
//               on AVX-512 by two dword permutations of bf16 pairs, ZBf16::Load4), then the
//               warp trees (full warps on AVX-512 in lanes, CubFullWarps: the same additions) and the warp sum as
//               the reference; on targets without native FMA the chains run in scalar std::fma.
//      f32-seq  a scalar std::fma chain (inherently sequential).
//   3.–4. u = v + eps; rsqrt: rn and cuda-rsqrtf use ref::rsqrt_rn / ref::rsqrt_cuda (scalar, once per row),
//         ieee 1/sqrtf.
//   5.–6. normalize and weight in f32 lanes (Mul; bf16 rounding as in 1). bf16 rows on the vectorised group quant
//         whose z holds no NaN (v not NaN) and whose r is not NaN, with y not exported (normed = null), take
//         NormWeightBf16Fast: weights widened once per thread, no NaN canonicalisation, bf16 RNE as
//         (b + 0x7FFF + lsb) & 0xFFFF0000 (every NaN there has zero low 16 bits, so it stays a NaN), group amax as a
//         u32 max of |y| bits with a rescan of groups that hold a NaN — the same amax, NaN flag and quotients. On AVX2
//         (NormWeightBf16Avx2), under a scale guard of at least 2^-60 and weights of at most 2^50, the roundings by
//         Veltkamp's split in three floating-point operations instead (SplitBf16Avx2; the same codes and scales).
//   7. the group quant, vectorised for the f32 kernels' specs (scale-dtype f32, scale-formula amax/max or
//      amax*(1/max), formula x/s or x*(1/s)): amax per group in lanes (NaN lanes masked to 0; amax-nan=propagate
//      tracks them apart), the scale per group in scalar f32 (the reference's steps 3–6), the quotient, the GPU NaN
//      model and the clamp in lanes (specialised per formula and clamp; a NaN-replacing clamp skips the
//      canonicalisation), then the cast: in lanes for RNE e4m3fn after such a clamp (RowQuant), else
//      cpu::encode_f32 (Highway, serial for a row). With the cast in lanes, groups that are finite and whose scale
//      allows it take no per-element range or NaN test (RowQuantFast: x/s by fp8_lanes::MarksteinDiv for s in
//      [2^-60, 2^60] with amax <= s·2^60, x*(1/s) with a finite RN(1/s); the clamp as a u32 min of |v|, the code by
//      fp8_lanes::CastE4m3Mag, the sign from y), and on bf16 fast rows steps 5–9 run fused per group
//      in registers (NormQuantBf16: no f32 y row; pipelined by one group, the scale chain of a group overlapping the
//      next group's y). On CPUs with AVX512_BF16 + VBMI (AVX-512 targets), bf16 rows whose y is rounded to bf16
//      (weight dtype-twice: vLLM; dtype-once) take two passes instead, y packed as bf16 through L1 and the roundings
//      by vcvtne2ps2bf16 under a per-row guard against subnormals (src/cpu/rmsnorm_quant_avx512.cc;
//      cpu::RmsNormPath::highway keeps them on the Highway path); the codes (and residual_out) of outputs of 16 MiB
//      and more go out by non-temporal stores at any alignment. Every other
//      quant spec (exact formulas, div=triton-nv, bf16/f16/ue8m0 scales) runs the CPU group quant (src/cpu/
//      quant_cpu.cc): at group and row granularity on each row right after its normalisation (row_quant, from
//      cache) by a per-thread cpu::RowQuantizer given the norm pass's group maxima (bf16 rows there take the AVX2
//      norm loop with y in element order, and the split under an amax floor), else cpu::quantize on the normed rows
//      after the loop.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/rmsnorm_quant_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "cpu/fp8_lanes-inl.h"
#include "cpu/quant_rows.h"
#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"
#include "fp8ref/rmsnorm.h"

#ifndef FP8REF_RMSNORM_QUANT_CPU_ONCE
#define FP8REF_RMSNORM_QUANT_CPU_ONCE
namespace fp8ref::rmsnorm_cpu_detail {
constexpr uint32_t kNan = 0x7FFFFFFFu;
inline float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
inline uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }
inline float gpu(float v) { return std::isnan(v) ? f32_of(kNan) : v; }
inline float fmax_nan_loses(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return a < b ? b : a;
}
inline float guard(const QuantSpec& q, float v, float floor) {
  if (q.amax_nan == AmaxNan::ignore) return fmax_nan_loses(v, floor);
  if (std::isnan(v) || std::isnan(floor)) return f32_of(kNan);
  return v < floor ? floor : v;
}
// Steps 3–5 of the group quant for the vectorised specs (scale-dtype f32): the group's scale s from its amax over
// the non-NaN |y| and whether it held a NaN. rcp_max = gpu(1 / max).
inline float group_scale(const QuantSpec& qs, float amax, bool nan, float rcp_max) {
  if (qs.amax_nan == AmaxNan::propagate && nan) amax = f32_of(kNan);
  if (qs.amax_floor) amax = guard(qs, amax, *qs.amax_floor);
  float s = qs.scale_formula == ScaleFormula::div ? gpu(amax / qs.fp8_max) : gpu(amax * rcp_max);
  if (qs.min_scale) s = guard(qs, s, *qs.min_scale);
  return s;
}
// Whether a finite group (max |y| = amax) quantizes by x/s without per-element tests: s in [2^-60, 2^60] and
// amax <= s·2^60 (the argument: quant_cpu.cc's FastGroups).
inline bool div_fast(float s, float amax) {
  return bits_of(s) - 0x21800000u <= 0x5D800000u - 0x21800000u && amax <= s * 0x1p60f;
}
// Where the variance and normalize passes read z (see ZF32, ZBf16, ZSum): kind 0 the f32 row p, 1 the bf16 row p,
// 2 the f32 sums of the bf16 rows p and p2.
struct ZRow {
  const void* p;
  const uint16_t* p2;
  int kind;
};
}  // namespace fp8ref::rmsnorm_cpu_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;

HWY_INLINE hn::Vec<DF> Canonical(hn::Vec<DF> v) {
  const DF df;
  const DU du;
  return hn::IfThenElse(hn::IsNaN(v), hn::BitCast(df, hn::Set(du, kCanonicalNan)), v);
}

// bf16 bits (in u32 lanes) -> f32
HWY_INLINE hn::Vec<DF> LoadBf16(const uint16_t* p) {
  const DF df;
  const DU du;
  const DU16 du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, p))));
}

using fp8_lanes::RoundBf16Bits;  // (src/cpu/fp8_lanes-inl.h)
using rmsnorm_cpu_detail::ZRow;
HWY_INLINE hn::Vec<DF> RoundBf16(hn::Vec<DF> v) {
  const DF df;
  return hn::BitCast(df, hn::ShiftLeft<16>(RoundBf16Bits(v)));
}

// The next row's bf16 inputs (x, and the residual when there is one; null: none), prefetched while the compute-heavy
// passes of this row run (NormWeightBf16Fast, NormQuantBf16), one line each per 32 elements: otherwise the next row's
// first pass (its residual add or its mean of squares) waits on memory with nothing to overlap.
struct NextRow {
  const uint16_t* x;
  const uint16_t* r;
  HWY_INLINE void At(size_t k) const {
    if (x && k % 32 == 0) {
      hwy::Prefetch(x + k);
      if (r) hwy::Prefetch(r + k);
    }
  }
};

// bf16 RNE of f32 lanes as f32 (low 16 bits cleared), for the fast paths where every NaN has zero low 16 bits (so
// that it stays a NaN): (b + 0x7FFF + lsb) & 0xFFFF0000, lsb = bit 16 of b. AVX-512: the lsb as a mask (vptestmd)
// and a masked add, one instruction fewer.
HWY_INLINE hn::Vec<DF> RoundBf16NoNan(hn::Vec<DF> v) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  const __m512i b = _mm512_castps_si512(v.raw);
  const __m512i t = _mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF));
  const __mmask16 odd = _mm512_test_epi32_mask(b, _mm512_set1_epi32(0x10000));
  const __m512i r = _mm512_mask_add_epi32(t, odd, t, _mm512_set1_epi32(1));
  return hn::Vec<DF>{_mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
#else
  const DF df;
  const DU du;
  const auto b = hn::BitCast(du, v);
  return hn::BitCast(df, hn::And(hn::Add(hn::Add(b, hn::Set(du, 0x7FFFu)), hn::And(hn::ShiftRight<16>(b), hn::Set(du, 1u))),
                                 hn::Set(du, 0xFFFF0000u)));
#endif
}

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
// RoundBf16NoNan on AVX2 without a shift: the lsb as the compare mask (b & 0x10000) == 0x10000, subtracted — the same
// value, all four operations on any of Zen 3's four vector pipes (shifts and shuffles run on two of them).
HWY_INLINE __m256i RoundBf16NoNanAvx2(__m256i b) {
  const __m256i bit = _mm256_set1_epi32(0x10000);
  const __m256i odd = _mm256_cmpeq_epi32(_mm256_and_si256(b, bit), bit);
  return _mm256_and_si256(_mm256_sub_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7FFF)), odd),
                          _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
}
// RN_bf16(a) as f32 by Veltkamp's split with C = 2^16 + 1: g = RN(a·C), RN_bf16(a) = g − RN(g − a) — three
// floating-point operations where RoundBf16NoNanAvx2 takes five integer ones that Zen 2 cannot overlap with its
// multiplies. Equal to it (ties to even included) for a = ±0 and 2^-126 <= |a| < 2^111, every such f32 (cpu::
// bf16_split_failures, tests/exhaustive_bf16_split.cc); below that range it keeps 8 significant bits where bf16's
// subnormals keep fewer (a nonzero a stays nonzero with its sign: the same sweep checks that on every subnormal),
// above it a·C overflows. NormWeightBf16Avx2's kFp rows stay inside it, or are harmless.
// (Not the product form g = RN(a1·(w·C)), g − RN(g − a1·w) with one FMA, one operation fewer: where the exact product
// is below 2^-150 it gives +0 for a negative product, whose integer rounding is −0 — code 0x00 for 0x80. Found in
// session 38 on vllm-rmsnorm-quant group:128 rows of tiny z·r under small weights; RN(a1·w) first keeps the sign.)
HWY_INLINE __m256 SplitBf16Avx2(__m256 a) {
  const __m256 g = _mm256_mul_ps(a, _mm256_set1_ps(65537.0f));
  return _mm256_sub_ps(g, _mm256_sub_ps(g, a));
}
#endif

#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
// s[0..3] += the squares of the 32 f32 of e and o in f64 lanes (each square exact): e's low and high 8, o's.
HWY_INLINE void AddSquaresF64(__m512 e, __m512 o, __m512d (&s)[4]) {
  const __m512d e0 = _mm512_cvtps_pd(_mm512_castps512_ps256(e)), e1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1));
  const __m512d o0 = _mm512_cvtps_pd(_mm512_castps512_ps256(o)), o1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(o, 1));
  s[0] = _mm512_fmadd_pd(e0, e0, s[0]);
  s[1] = _mm512_fmadd_pd(e1, e1, s[1]);
  s[2] = _mm512_fmadd_pd(o0, o0, s[2]);
  s[3] = _mm512_fmadd_pd(o1, o1, s[3]);
}
HWY_INLINE double ReduceF64(const __m512d (&s)[4]) {
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s[0], s[1]), _mm512_add_pd(s[2], s[3])));
}

// Consecutive 32-word vectors to dst (2-byte aligned) at d = (dst mod 64) / 2 words into a cache line: every whole
// line by a non-temporal store, the partial lines at both ends by masked stores (the neighbouring rows' words, another
// thread's perhaps). Line j of the aligned destination is the last d words of vector j − 1 and the first 32 − d of
// vector j (one vpermt2w). finish() writes what is pending: then every vector put is in memory.
struct WordLineStream {
  uint16_t* base;
  unsigned d;
  __m512i idx, prev;
  size_t j = 0;
  explicit WordLineStream(uint16_t* dst)
      : base(dst - (reinterpret_cast<uintptr_t>(dst) & 63) / 2),
        d(static_cast<unsigned>((reinterpret_cast<uintptr_t>(dst) & 63) / 2)) {
    alignas(64) uint16_t ix[32];
    for (unsigned i = 0; i < 32; ++i) ix[i] = static_cast<uint16_t>(32 - d + i);
    idx = _mm512_load_si512(ix);
    prev = _mm512_setzero_si512();
  }
  void put(__m512i v) {
    const __m512i line = _mm512_permutex2var_epi16(prev, idx, v);
    if (j == 0 && d) _mm512_mask_storeu_epi16(base, ~__mmask32{0} << d, line);
    else _mm512_stream_si512(reinterpret_cast<__m512i*>(base + 32 * j), line);
    prev = v;
    ++j;
  }
  void finish() {
    if (d && j)
      _mm512_mask_storeu_epi16(base + 32 * j, (__mmask32{1} << d) - 1, _mm512_permutex2var_epi16(prev, idx, prev));
    _mm_sfence();
  }
};
#endif

// Step 1 for bf16 rows. z[k] (f32; z null: not written); residual_out bits when a residual is given; zbf (not null,
// with dtype_sum): z's bf16 bits as well (residual_out's values, but never streamed: the caller's bf16 z row).
bool LoadRowBf16(const uint16_t* x, const uint16_t* res, size_t K, bool dtype_sum, float* z, uint16_t* res_out,
                 double* sumsq, bool stream, float* part, size_t T, uint16_t* zbf) {
  if (sumsq) *sumsq = -1.0;
  (void)stream;  // (AVX-512 and AVX2 only)
  (void)part;
  (void)T;
  bool done = false;
  const DF df;
  const DU16 du16;
  const size_t N = hn::Lanes(df);
  size_t k = 0;
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  // AVX-512 with a residual, 32 elements a step, on the bf16 pairs in 32-bit lanes (no widening permutations): the even
  // elements are the dwords << 16, the odd ones the dwords with the low half cleared; z = x + res per half (f32); a
  // step whose sum holds a NaN (a NaN input, Inf − Inf) goes to the generic loop below, before anything of it is
  // written (so res_out may alias res or x). Else no NaN to canonicalise, and the bf16 RNE of either half is
  // RoundBf16NoNan's (an overflow to ±Inf included); the two halves' results are joined into the pairs of res_out
  // by one shift and one or, and z (rounded first for dtype_sum) is put back
  // in element order by two dword permutations. sumsq (not null): Σ z² in f64 lanes as SumSquaresF64 (any order),
  // set when this loop covered the whole row (else left at -1: the caller sums z itself). stream: residual_out by
  // non-temporal stores at any (2-byte) alignment, WordLineStream (the caller asks for it on large tensors: no read
  // for ownership of lines that the next op would not find in cache anyway; bf16 [4096, 7168] with a residual on 2
  // threads, the same process alternating: 5–8 % faster in 5 of 6 rounds), fenced before returning. part (not null; T % 16 == 0,
  // K % 64 == 0): vLLM's cub partials part[t], t < T, as CubPartialsT computes them — every 64 elements are the 16
  // vec4s of threads t0 .. t0 + 15 (t0 = (k / 4) mod T), their lanes' v_j[l] = z[k + 4l + j] taken from the two steps'
  // halves by four dword permutations (j even: the even halves, j odd: the odd ones), each thread's chain in vec4
  // order. Returns whether this loop covered the whole row (then sumsq and part are set).
  if (part) std::memset(part, 0, T * sizeof(float));
  if (res) {
    const __m512i c_ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i c_od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    __m512 pe = _mm512_setzero_ps(), po = pe;  // the previous step's halves (the first 32 of a 64-element block)
    __m512d s4[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
    stream = stream && res_out && (reinterpret_cast<uintptr_t>(res_out) & 1) == 0;
    WordLineStream ws(stream ? res_out : nullptr);
    const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i i_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i i_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    for (; k + 32 <= K; k += 32) {
      const __m512i xb = _mm512_loadu_si512(reinterpret_cast<const void*>(x + k));
      const __m512i rb = _mm512_loadu_si512(reinterpret_cast<const void*>(res + k));
      __m512 ze = _mm512_add_ps(_mm512_castsi512_ps(_mm512_slli_epi32(xb, 16)),
                                _mm512_castsi512_ps(_mm512_slli_epi32(rb, 16)));
      __m512 zo = _mm512_add_ps(_mm512_castsi512_ps(_mm512_and_si512(xb, hi16)),
                                _mm512_castsi512_ps(_mm512_and_si512(rb, hi16)));
      if (_mm512_cmp_ps_mask(ze, zo, _CMP_UNORD_Q)) break;
      if (res_out || dtype_sum) {
        const __m512 be = RoundBf16NoNan(hn::Vec<DF>{ze}).raw, bo = RoundBf16NoNan(hn::Vec<DF>{zo}).raw;
        if (res_out || (zbf && dtype_sum)) {  // the pair (even, odd) = (be >> 16, bo)
          const __m512i pr = _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(be), 16), _mm512_castps_si512(bo));
          if (res_out && stream) ws.put(pr);
          else if (res_out) _mm512_storeu_si512(reinterpret_cast<void*>(res_out + k), pr);
          if (zbf && dtype_sum) _mm512_storeu_si512(reinterpret_cast<void*>(zbf + k), pr);
        }
        if (dtype_sum) {
          ze = be;
          zo = bo;
        }
      }
      if (z) {
        _mm512_storeu_ps(z + k, _mm512_permutex2var_ps(ze, i_lo, zo));
        _mm512_storeu_ps(z + k + 16, _mm512_permutex2var_ps(ze, i_hi, zo));
      }
      if (part) {
        if (k & 32) {
          float* acc_p = part + ((k - 32) / 4) % T;  // (this step is the second half of a 64-element block)
          const __m512 v0 = _mm512_permutex2var_ps(pe, c_ev, ze), v2 = _mm512_permutex2var_ps(pe, c_od, ze);
          const __m512 v1 = _mm512_permutex2var_ps(po, c_ev, zo), v3 = _mm512_permutex2var_ps(po, c_od, zo);
          __m512 acc = _mm512_loadu_ps(acc_p);
          acc = _mm512_fmadd_ps(v0, v0, acc);
          acc = _mm512_fmadd_ps(v1, v1, acc);
          acc = _mm512_fmadd_ps(v2, v2, acc);
          acc = _mm512_fmadd_ps(v3, v3, acc);
          _mm512_storeu_ps(acc_p, acc);
        } else {
          pe = ze;
          po = zo;
        }
      }
      if (sumsq) AddSquaresF64(ze, zo, s4);
    }
    if (stream) ws.finish();
    done = k == K;
    if (sumsq && done) *sumsq = ReduceF64(s4);
  }
  // (a step that broke out above, the steps after it and the tail: the generic loops)
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  // AVX2 with a residual and no f32 row (z null: the sum not rounded, the caller's ZSum path; or rounded, dtype_sum,
  // the rounded pairs also into zbf, the caller's bf16 z row — residual_out may be streamed), 32 elements a step, as
  // the AVX-512 loop above and in vec4 order from the start: the bf16 pairs of x and of res (dwords) split by one
  // shufps each into E = the pairs of vec4s 0, 1, 4, 5 | 2, 3, 6, 7 of the step (each vec4's elements 0, 1) and O
  // (elements 2, 3), and each widened in place (<< 16: the even element, & 0xFFFF0000: the odd one), so v_j = z of
  // element j of the 8 vec4s in the lane order 0, 1, 4, 5, 2, 3, 6, 7: the order of the cub partials in this loop
  // (part, permuted so in memory per 8 threads, put back by one qword permutation per 8 at the end) and of the
  // rounded pairs, which unpacklo/unpackhi_epi32(E', O') put back in element order. A step whose sum holds a NaN goes
  // to the generic loop before anything of it is written; sumsq: Σ z² in f64 lanes (any order); stream: residual_out
  // by non-temporal stores (32-byte aligned), fenced before returning. Against the generic loop and a separate
  // CubPartials pass (which read x and res twice, with the widening permutations): see bench/RESULTS.md, session 13.
  if (res && !z && K % 32 == 0) {
    const bool cub = part && T % 8 == 0;
    if (cub) std::memset(part, 0, T * sizeof(float));
    stream = stream && res_out && (reinterpret_cast<uintptr_t>(res_out) & 31) == 0;
    const __m256i hi16 = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    auto sq = [&](__m256 v, __m256d& a, __m256d& b) HWY_ATTR __attribute__((always_inline)) {
      const __m256d l = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), h = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      a = _mm256_fmadd_pd(l, l, a);
      b = _mm256_fmadd_pd(h, h, b);
    };
    for (; k + 32 <= K; k += 32) {
      const __m256 xa = _mm256_loadu_ps(reinterpret_cast<const float*>(x + k));
      const __m256 xb = _mm256_loadu_ps(reinterpret_cast<const float*>(x + k + 16));
      const __m256 ra = _mm256_loadu_ps(reinterpret_cast<const float*>(res + k));
      const __m256 rb = _mm256_loadu_ps(reinterpret_cast<const float*>(res + k + 16));
      const __m256i ex = _mm256_castps_si256(_mm256_shuffle_ps(xa, xb, 0x88));
      const __m256i ox = _mm256_castps_si256(_mm256_shuffle_ps(xa, xb, 0xDD));
      const __m256i er = _mm256_castps_si256(_mm256_shuffle_ps(ra, rb, 0x88));
      const __m256i orr = _mm256_castps_si256(_mm256_shuffle_ps(ra, rb, 0xDD));
      auto lo = [](__m256i p) HWY_ATTR { return _mm256_castsi256_ps(_mm256_slli_epi32(p, 16)); };
      auto hi = [&](__m256i p) HWY_ATTR { return _mm256_castsi256_ps(_mm256_and_si256(p, hi16)); };
      __m256 v0 = _mm256_add_ps(lo(ex), lo(er)), v1 = _mm256_add_ps(hi(ex), hi(er));
      __m256 v2 = _mm256_add_ps(lo(ox), lo(orr)), v3 = _mm256_add_ps(hi(ox), hi(orr));
      const __m256 u = _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q), _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q));
      if (_mm256_movemask_ps(u)) break;
      if (res_out || dtype_sum) {  // the pairs (RN(v0) >> 16 | RN(v1)) and (RN(v2) >> 16 | RN(v3)), in element order
        const __m256i b0 = RoundBf16NoNanAvx2(_mm256_castps_si256(v0)), b1 = RoundBf16NoNanAvx2(_mm256_castps_si256(v1));
        const __m256i b2 = RoundBf16NoNanAvx2(_mm256_castps_si256(v2)), b3 = RoundBf16NoNanAvx2(_mm256_castps_si256(v3));
        const __m256i pe = _mm256_or_si256(_mm256_srli_epi32(b0, 16), b1);
        const __m256i po = _mm256_or_si256(_mm256_srli_epi32(b2, 16), b3);
        const __m256i o0 = _mm256_unpacklo_epi32(pe, po), o1 = _mm256_unpackhi_epi32(pe, po);
        if (res_out && stream) {
          _mm256_stream_si256(reinterpret_cast<__m256i*>(res_out + k), o0);
          _mm256_stream_si256(reinterpret_cast<__m256i*>(res_out + k + 16), o1);
        } else if (res_out) {
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(res_out + k), o0);
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(res_out + k + 16), o1);
        }
        if (dtype_sum) {
          if (zbf) {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(zbf + k), o0);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(zbf + k + 16), o1);
          }
          v0 = _mm256_castsi256_ps(b0);
          v1 = _mm256_castsi256_ps(b1);
          v2 = _mm256_castsi256_ps(b2);
          v3 = _mm256_castsi256_ps(b3);
        }
      }
      if (cub) {  // threads t0 .. t0 + 7 (t0 = (k / 4) mod T), each chain in vec4 order
        float* acc_p = part + (k / 4) % T;
        __m256 acc = _mm256_loadu_ps(acc_p);
        acc = _mm256_fmadd_ps(v0, v0, acc);
        acc = _mm256_fmadd_ps(v1, v1, acc);
        acc = _mm256_fmadd_ps(v2, v2, acc);
        acc = _mm256_fmadd_ps(v3, v3, acc);
        _mm256_storeu_ps(acc_p, acc);
      }
      if (sumsq) {
        sq(v0, s0, s1);
        sq(v1, s2, s3);
        sq(v2, s0, s1);
        sq(v3, s2, s3);
      }
    }
    if (stream) _mm_sfence();
    done = k == K;
    if (cub && done)  // the partials in thread order (qwords 0, 2, 1, 3 of each 8: its own inverse)
      for (size_t t = 0; t < T; t += 8)
        _mm256_storeu_pd(reinterpret_cast<double*>(part + t),
                         _mm256_permute4x64_pd(_mm256_loadu_pd(reinterpret_cast<const double*>(part + t)), 0xD8));
    if (sumsq && done) {
      alignas(32) double t4[4];
      _mm256_store_pd(t4, _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
      *sumsq = (t4[0] + t4[1]) + (t4[2] + t4[3]);
    }
    done = done && (cub || !part);
  }
#endif
  for (; k + N <= K; k += N) {
    auto v = LoadBf16(x + k);
    if (res) {
      v = Canonical(hn::Add(v, LoadBf16(res + k)));
      const auto bits = RoundBf16Bits(v);
      if (dtype_sum) v = hn::BitCast(df, hn::ShiftLeft<16>(bits));
      if (res_out) hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<DF>(), bits)), du16, res_out + k);
      if (zbf && dtype_sum) hn::StoreU(hn::DemoteTo(du16, hn::BitCast(hn::RebindToSigned<DF>(), bits)), du16, zbf + k);
    }
    if (z) hn::StoreU(v, df, z + k);
  }
  for (; k < K; ++k) {
    uint32_t b = static_cast<uint32_t>(x[k]) << 16;
    float v;
    std::memcpy(&v, &b, 4);
    if (res) {
      uint32_t rb = static_cast<uint32_t>(res[k]) << 16;
      float r;
      std::memcpy(&r, &rb, 4);
      v = v + r;
      if (std::isnan(v)) {
        const uint32_t c = kCanonicalNan;
        std::memcpy(&v, &c, 4);
      }
      uint32_t vb;
      std::memcpy(&vb, &v, 4);
      const uint16_t h = static_cast<uint16_t>(ref::narrow(Format::f32, vb, Format::bf16));
      if (dtype_sum) {
        const uint32_t w = static_cast<uint32_t>(h) << 16;
        std::memcpy(&v, &w, 4);
      }
      if (res_out) res_out[k] = h;
      if (zbf && dtype_sum) zbf[k] = h;
    }
    if (z) z[k] = v;
  }
  return done;
}

// z as the variance and normalize passes read it: the f32 row LoadRowBf16 wrote (ZF32), or — bf16 rows without a
// residual — the bf16 input itself, widened in registers (ZBf16: z is exactly the widened x; no f32 row written).
struct ZF32 {
  const float* p;
  HWY_INLINE hn::Vec<DF> Load(size_t k) const { return hn::LoadU(DF(), p + k); }
  HWY_INLINE float At(size_t k) const { return p[k]; }
  template <class D>  // Lanes(d) f32 values (d: f32 lanes of any width)
  HWY_INLINE hn::Vec<D> LoadF(D d, size_t k) const { return hn::LoadU(d, p + k); }
  HWY_INLINE void Load4(size_t k, hn::Vec<DF>& v0, hn::Vec<DF>& v1, hn::Vec<DF>& v2, hn::Vec<DF>& v3) const {
    hn::LoadInterleaved4(DF(), p + k, v0, v1, v2, v3);
  }
};
struct ZBf16 {
  const uint16_t* p;
  // track: Load4 and At also take min((|x| − 1) mod 2^16) over the words they read (AVX-512: for the passes' guard,
  // rmsnorm_quant_avx512.h norm_pass's zmin1; ±0 wraps to 0x7FFF), in zm (vector) and zs (scalar)
  bool track = false;
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  mutable __m512i zm = _mm512_set1_epi32(-1);
#endif
  mutable uint16_t zs = 0xFFFF;
  HWY_INLINE hn::Vec<DF> Load(size_t k) const { return LoadBf16(p + k); }
  template <class D>
  HWY_INLINE hn::Vec<D> LoadF(D d, size_t k) const {
    const hn::RebindToUnsigned<D> d32;
    const hn::Rebind<uint16_t, D> d16h;
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(d32, hn::LoadU(d16h, p + k))));
  }
  HWY_INLINE float At(size_t k) const {
    if (track) zs = std::min<uint16_t>(zs, static_cast<uint16_t>((p[k] - 1u) & 0x7FFFu));
    const uint32_t b = static_cast<uint32_t>(p[k]) << 16;
    float f;
    std::memcpy(&f, &b, 4);
    return f;
  }
  HWY_INLINE void Load4(size_t k, hn::Vec<DF>& v0, hn::Vec<DF>& v1, hn::Vec<DF>& v2, hn::Vec<DF>& v3) const {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
    // AVX-512: the 64 values as two vectors of bf16 pairs (dword l of a = p[k + 2l], p[k + 2l + 1]); the even dwords
    // of a:b hold (z[4l], z[4l+1]) for lane l, the odd ones (z[4l+2], z[4l+3]) — two dword permutations, then each
    // half widened in place (low half << 16, high half masked): 10 instructions where LoadInterleaved4 takes ~22.
    const __m512i a = _mm512_loadu_si512(reinterpret_cast<const void*>(p + k));
    const __m512i b = _mm512_loadu_si512(reinterpret_cast<const void*>(p + k + 32));
    if (track) {  // (three instructions per 32 values here cost less than in norm_pass, measured: session 20)
      const __m512i one16 = _mm512_set1_epi16(1), abs16 = _mm512_set1_epi16(0x7FFF);
      zm = _mm512_min_epu16(zm, _mm512_and_si512(_mm512_sub_epi16(a, one16), abs16));
      zm = _mm512_min_epu16(zm, _mm512_and_si512(_mm512_sub_epi16(b, one16), abs16));
    }
    const __m512i e = _mm512_permutex2var_epi32(
        a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
    const __m512i o = _mm512_permutex2var_epi32(
        a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
    const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    v0 = hn::Vec<DF>{_mm512_castsi512_ps(_mm512_slli_epi32(e, 16))};
    v1 = hn::Vec<DF>{_mm512_castsi512_ps(_mm512_and_si512(e, hi))};
    v2 = hn::Vec<DF>{_mm512_castsi512_ps(_mm512_slli_epi32(o, 16))};
    v3 = hn::Vec<DF>{_mm512_castsi512_ps(_mm512_and_si512(o, hi))};
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
    // AVX2, the same scheme on 32 values: the even / odd dwords of a:b by one shufps each (per 128-bit lane: a's two,
    // then b's two), put in lane order by one vpermpd; 8 instructions where LoadInterleaved4 takes ~16.
    const __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(p + k));
    const __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(p + k + 16));
    const __m256i e = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0x88)), 0xD8);
    const __m256i o = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8);
    const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    v0 = hn::Vec<DF>{_mm256_castsi256_ps(_mm256_slli_epi32(e, 16))};
    v1 = hn::Vec<DF>{_mm256_castsi256_ps(_mm256_and_si256(e, hi))};
    v2 = hn::Vec<DF>{_mm256_castsi256_ps(_mm256_slli_epi32(o, 16))};
    v3 = hn::Vec<DF>{_mm256_castsi256_ps(_mm256_and_si256(o, hi))};
#else
    const DF df;
    const DU du;
    const DU16 d16;
    hn::Vec<DU16> h0, h1, h2, h3;
    hn::LoadInterleaved4(d16, p + k, h0, h1, h2, h3);
    v0 = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h0)));
    v1 = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h1)));
    v2 = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h2)));
    v3 = hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h3)));
#endif
  }
};

// bf16 rows with a residual whose sum stays f32 (residual-sum=f32), on the fast paths: z = RN32(x + res) recomputed
// from the two bf16 rows in registers wherever a pass reads it (no f32 row written: its stores cost ~20 % of such a
// row, measured). The same values as LoadRowBf16's z except a NaN's payload (it canonicalises); a row with a NaN
// sum has a NaN mean of squares and leaves the fast paths for the f32 row (the caller's z_row).
struct ZSum {
  const uint16_t* p;
  const uint16_t* p2;
  HWY_INLINE hn::Vec<DF> Load(size_t k) const { return hn::Add(LoadBf16(p + k), LoadBf16(p2 + k)); }
  template <class D>
  HWY_INLINE hn::Vec<D> LoadF(D d, size_t k) const {
    return hn::Add(ZBf16{p}.LoadF(d, k), ZBf16{p2}.LoadF(d, k));
  }
  HWY_INLINE float At(size_t k) const { return ZBf16{p}.At(k) + ZBf16{p2}.At(k); }
  HWY_INLINE void Load4(size_t k, hn::Vec<DF>& v0, hn::Vec<DF>& v1, hn::Vec<DF>& v2, hn::Vec<DF>& v3) const {
    hn::Vec<DF> u0, u1, u2, u3;  // (the same lane permutation for both rows, then element-wise sums)
    ZBf16{p}.Load4(k, v0, v1, v2, v3);
    ZBf16{p2}.Load4(k, u0, u1, u2, u3);
    v0 = hn::Add(v0, u0);
    v1 = hn::Add(v1, u1);
    v2 = hn::Add(v2, u2);
    v3 = hn::Add(v3, u3);
  }
};
// f(the Z reader of zr)
template <class F>
HWY_INLINE auto VisitZ(const ZRow& zr, F&& f) {
  if (zr.kind == 1) return f(ZBf16{static_cast<const uint16_t*>(zr.p)});
  if (zr.kind == 2) return f(ZSum{static_cast<const uint16_t*>(zr.p), zr.p2});
  return f(ZF32{static_cast<const float*>(zr.p)});
}

// Σ z² in f64 lanes, any order. NaN/Inf in z give a non-finite result.
template <class Z>
double SumSquaresF64T(const Z z, size_t K) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  if constexpr (std::is_same_v<Z, ZBf16>) {
    // bf16 rows (without the guard's tracking): 32 values a step as bf16 pairs widened in place (the even words by a
    // shift, the odd by a mask) — 16 operations where the per-8 widening below takes 20; aiter-rmsnorm-quant's
    // exact Σz² 2000 -> 1810 TSC cycles per row of 7168 in cache (bench/RESULTS.md, session 25)
    if (!z.track && K % 32 == 0) {
      const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
      __m512d s4[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
      for (size_t k = 0; k < K; k += 32) {
        const __m512i u = _mm512_loadu_si512(reinterpret_cast<const void*>(z.p + k));
        AddSquaresF64(_mm512_castsi512_ps(_mm512_slli_epi32(u, 16)), _mm512_castsi512_ps(_mm512_and_si512(u, hi)), s4);
      }
      return ReduceF64(s4);
    }
  }
#endif
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t N = hn::Lanes(dd);
  auto a0 = hn::Zero(dd), a1 = hn::Zero(dd), a2 = hn::Zero(dd), a3 = hn::Zero(dd);
  size_t k = 0;
  for (; k + 4 * N <= K; k += 4 * N) {
    const auto v0 = hn::PromoteTo(dd, z.LoadF(dfh, k));
    const auto v1 = hn::PromoteTo(dd, z.LoadF(dfh, k + N));
    const auto v2 = hn::PromoteTo(dd, z.LoadF(dfh, k + 2 * N));
    const auto v3 = hn::PromoteTo(dd, z.LoadF(dfh, k + 3 * N));
    a0 = hn::MulAdd(v0, v0, a0);
    a1 = hn::MulAdd(v1, v1, a1);
    a2 = hn::MulAdd(v2, v2, a2);
    a3 = hn::MulAdd(v3, v3, a3);
  }
  HWY_ALIGN double lanes[HWY_MAX_BYTES / sizeof(double)];
  hn::Store(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), dd, lanes);
  double s = 0;
  for (size_t i = 0; i < N; ++i) s += lanes[i];
  for (; k < K; ++k) s += static_cast<double>(z.At(k)) * z.At(k);
  return s;
}
double SumSquaresF64(ZRow zr, size_t K) {
  return VisitZ(zr, [&](auto z) HWY_ATTR { return SumSquaresF64T(z, K); });
}

// The per-thread partial sums of vLLM's compute_rms (variance=cub:T): part[t] for t < T.
template <class Z>
Z CubPartialsT(const Z z, size_t nvec, size_t T, float* part) {  // (returns z: ZBf16's tracked minimum)
  size_t t0 = 0;
#if HWY_NATIVE_FMA
  const DF df;
  const size_t N = hn::Lanes(df);
  // one step of a chain of N lanes: the vec4s i .. i + N - 1 (v_j[lane] = z[4(i + lane) + j]) into acc, in order
  auto step = [&](size_t i, hn::Vec<DF> acc) HWY_ATTR {
    hn::Vec<DF> v0, v1, v2, v3;
    z.Load4(4 * i, v0, v1, v2, v3);
    acc = hn::MulAdd(v0, v0, acc);
    acc = hn::MulAdd(v1, v1, acc);
    acc = hn::MulAdd(v2, v2, acc);
    return hn::MulAdd(v3, v3, acc);
  };
  // the chain of threads t0 .. t0 + N - 1 from vec4 index i on, accumulator acc
  auto finish = [&](size_t t0, size_t i, hn::Vec<DF> acc) HWY_ATTR {
    for (; i + N <= nvec; i += T) acc = step(i, acc);
    hn::StoreU(acc, df, part + t0);
    // the last, partial step: only lanes whose vec4 index is < nvec (i >= nvec - N + 1 here)
    for (size_t l = 0; l < N && i + l < nvec; ++l)
      for (size_t j = 0; j < 4; ++j) {
        const float v = z.At(4 * (i + l) + j);
        part[t0 + l] = std::fma(v, v, part[t0 + l]);
      }
  };
  // four chains at a time (threads t0 .. t0 + 4N - 1): four independent FMA dependencies in flight instead of one
  for (; t0 + 4 * N <= T; t0 += 4 * N) {
    hn::Vec<DF> a0 = hn::Zero(df), a1 = a0, a2 = a0, a3 = a0;
    size_t i = t0;
    for (; i + 4 * N <= nvec; i += T) {
      a0 = step(i, a0);
      a1 = step(i + N, a1);
      a2 = step(i + 2 * N, a2);
      a3 = step(i + 3 * N, a3);
    }
    finish(t0, i, a0);
    finish(t0 + N, i + N, a1);
    finish(t0 + 2 * N, i + 2 * N, a2);
    finish(t0 + 3 * N, i + 3 * N, a3);
  }
  for (; t0 + N <= T; t0 += N) finish(t0, t0, hn::Zero(df));
#endif
  for (size_t t = t0; t < T; ++t) {
    float a = 0.0f;
    for (size_t i = t; i < nvec; i += T)
      for (size_t j = 0; j < 4; ++j) {
        const float v = z.At(4 * i + j);
        a = std::fma(v, v, a);
      }
    part[t] = a;
  }
  return z;
}
void CubPartials(ZRow zr, size_t nvec, size_t T, float* part) {
  VisitZ(zr, [&](auto z) HWY_ATTR { CubPartialsT(z, nvec, T, part); });
}
// CubPartials of a bf16 row (ZBf16) that also returns min((|x| − 1) mod 2^16) over its 4·nvec words — on AVX-512
// targets only (the AVX-512 BF16 passes' guard); elsewhere 0x10000: not taken.
uint32_t CubPartialsBf16Zmin(const uint16_t* x, size_t nvec, size_t T, float* part) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  const ZBf16 z = CubPartialsT(ZBf16{x, true}, nvec, T, part);
  const __m512i m = z.zm;
  const __m256i m2 = _mm256_min_epu16(_mm512_castsi512_si256(m), _mm512_extracti64x4_epi64(m, 1));
  const __m128i m1 = _mm_min_epu16(_mm256_castsi256_si128(m2), _mm256_extracti128_si256(m2, 1));
  return std::min<uint32_t>(z.zs, static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(m1)) & 0xFFFF));
#else
  CubPartialsT(ZBf16{x}, nvec, T, part);
  return 0x10000u;
#endif
}

// vLLM's cub warp trees (mean_square_cub): lane[l] += lane[l + o] for o = 1, 2, 4, 8, 16 and l + o < 32 (every lane
// reads the previous level: a shuffle down), for each full warp of 32 partials; lane0[w] = the warp's lane 0. The
// same additions of the same operands as the reference's loop. AVX-512: only lane 0's operands are formed — level k
// adds the pairs (2j, 2j + 1) of the previous level's remaining lanes (lane[2^k·j] + lane[2^k·j + 2^(k−1)]), so each
// level is one even/odd split (two vpermt2ps) and one add over a vector of two inputs' lanes: 16 warps in 31 such
// steps, warp by warp in level 1 and two vectors of warps per step after (lanes 2^(5−k)·i .. of warp i at level k).
// (Session 29: the full trees of every lane took ~3.4 % of vllm-rmsnorm-quant in cache.) The partials are sums of
// squares (>= 0, +Inf or NaN), so a warp's lane 0 is NaN exactly when one of its 32 partials is.
// Returns the number of warps done (0 on other targets: the caller runs the scalar tree). *nan: a NaN partial.
size_t CubFullWarps(const float* part, size_t threads, float* lane0, bool* nan) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  const size_t warps = threads / 32;
  __mmask16 anynan = 0;
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  // lanes j of (u, v) as 32 lanes: (lane 2j) + (lane 2j + 1) for j < 16
  auto pairs = [&](__m512 u, __m512 v) HWY_ATTR {
    return _mm512_add_ps(_mm512_permutex2var_ps(u, ev, v), _mm512_permutex2var_ps(u, od, v));
  };
  for (size_t w0 = 0; w0 < warps; w0 += 16) {
    const size_t nw = std::min<size_t>(16, warps - w0);
    __m512 v[16];
    for (size_t i = 0; i < 16; ++i)  // level 1 (missing warps: zeros, never stored)
      v[i] = i < nw ? pairs(_mm512_loadu_ps(part + 32 * (w0 + i)), _mm512_loadu_ps(part + 32 * (w0 + i) + 16))
                    : _mm512_setzero_ps();
    for (size_t n = 8; n >= 1; n /= 2)  // levels 2–5
      for (size_t i = 0; i < n; ++i) v[i] = pairs(v[2 * i], v[2 * i + 1]);
    const __mmask16 valid = static_cast<__mmask16>((1u << nw) - 1u);
    anynan |= _mm512_mask_cmp_ps_mask(valid, v[0], v[0], _CMP_UNORD_Q);
    _mm512_mask_storeu_ps(lane0 + w0, valid, v[0]);
  }
  for (size_t t = 32 * warps; t < threads; ++t) anynan |= std::isnan(part[t]) ? 1 : 0;
  *nan = anynan != 0;
  return warps;
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  // AVX2: a warp's 32 partials in v[0..3] (lanes 8i .. 8i + 7). Level o: lane l += lane l + o for l < 32 − o (all
  // from the level's old values: v[i] is updated after its shifted operand, which reads v[i + 1], is formed), the
  // last o lanes unchanged (blended back), as the scalar loop leaves them.
  const size_t warps = threads / 32;
  int anynan = 0;
  const __m256 zero = _mm256_setzero_ps();
  for (size_t w = 0; w < warps; ++w) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(part + 32 * w + 8 * i);
      anynan |= _mm256_movemask_ps(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    // o = 1, 2, 4: lanes 8i + o .. 8i + o + 7 of (v[i], v[i + 1]): the middle 128 bits, then a byte align per lane
#define FP8REF_CUB_LEVEL(O, KEEP)                                                                                 \
  for (int i = 0; i < 4; ++i) {                                                                                    \
    const __m256 nx = i < 3 ? v[i + 1] : zero;                                                                     \
    const __m256 mid = _mm256_permute2f128_ps(v[i], nx, 0x21);                                                     \
    const __m256 sh = O == 4 ? mid                                                                                 \
                             : _mm256_castsi256_ps(_mm256_alignr_epi8(_mm256_castps_si256(mid),                    \
                                                                      _mm256_castps_si256(v[i]), (4 * O) & 15));   \
    const __m256 sum = _mm256_add_ps(v[i], sh);                                                                    \
    v[i] = i < 3 ? sum : _mm256_blend_ps(sum, v[i], KEEP);                                                         \
  }
    FP8REF_CUB_LEVEL(1, 0x80)
    FP8REF_CUB_LEVEL(2, 0xC0)
    FP8REF_CUB_LEVEL(4, 0xF0)
#undef FP8REF_CUB_LEVEL
    v[0] = _mm256_add_ps(v[0], v[1]);  // o = 8 (v[3]'s lanes 24..31 unchanged)
    v[1] = _mm256_add_ps(v[1], v[2]);
    v[2] = _mm256_add_ps(v[2], v[3]);
    lane0[w] = _mm256_cvtss_f32(_mm256_add_ps(v[0], v[2]));  // o = 16: lane 0 of v[0] + v[2]
  }
  for (size_t t = 32 * warps; t < threads; ++t) anynan |= std::isnan(part[t]) ? 1 : 0;
  *nan = anynan != 0;
  return warps;
#else
  (void)part;
  (void)threads;
  (void)lane0;
  (void)nan;
  return 0;
#endif
}

// Steps 5–6 for bf16 rows: y = weight-mode(RN32(z · r)), group by group (G elements; the last may be shorter),
// with each group's amax over the non-NaN |y| (amax[g]) and whether it held a NaN (nan[g]) — step 2 of the quant.
HWY_INLINE float Bf16ToF32(uint16_t h) {
  const uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
HWY_INLINE float CanonScalar(float v) {
  if (std::isnan(v)) {
    const uint32_t c = kCanonicalNan;
    std::memcpy(&v, &c, 4);
  }
  return v;
}
HWY_INLINE float RoundBf16Scalar(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return Bf16ToF32(static_cast<uint16_t>(ref::narrow(Format::f32, b, Format::bf16)));
}

// A group's running amax over the non-NaN |y| and whether a NaN was seen: lanes, then scalar tail elements.
struct GroupMax {
  hn::Vec<DF> acc, nanv;  // start both at hn::Zero
  HWY_INLINE void Add(hn::Vec<DF> v) {
    const auto m = hn::IsNaN(v);
    acc = hn::Max(acc, hn::IfThenZeroElse(m, hn::Abs(v)));
    nanv = hn::Or(nanv, hn::IfThenElseZero(m, hn::Set(DF(), 1.0f)));
  }
  // Folds the lanes and the scalar elements y[k, end) into amax / nan.
  HWY_INLINE void Finish(const float* y, size_t k, size_t end, float* amax, uint8_t* nan) const {
    const DF df;
    const size_t N = hn::Lanes(df);
    HWY_ALIGN float la[HWY_MAX_BYTES / sizeof(float)], ln[HWY_MAX_BYTES / sizeof(float)];
    hn::Store(acc, df, la);
    hn::Store(nanv, df, ln);
    float mx = 0.0f;
    bool anyn = false;
    for (size_t l = 0; l < N; ++l) {
      mx = la[l] > mx ? la[l] : mx;
      anyn = anyn || ln[l] != 0;
    }
    for (; k < end; ++k) {
      if (std::isnan(y[k])) anyn = true;
      else mx = std::fabs(y[k]) > mx ? std::fabs(y[k]) : mx;
    }
    *amax = mx;
    *nan = anyn;
  }
};

void NormWeightBf16(const float* z, const uint16_t* w, size_t K, float r, NormWeight mode, float* y, size_t G,
                    float* amax, uint8_t* nan) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto vr = hn::Set(df, r);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const size_t end = k0 + G < K ? k0 + G : K;
    GroupMax gm{hn::Zero(df), hn::Zero(df)};
    size_t k = k0;
    for (; k + N <= end; k += N) {
      const auto a = Canonical(hn::Mul(hn::LoadU(df, z + k), vr));
      const auto wv = LoadBf16(w + k);
      hn::Vec<DF> out;
      switch (mode) {
        case NormWeight::f32: out = Canonical(hn::Mul(a, wv)); break;
        case NormWeight::dtype_twice: out = RoundBf16(Canonical(hn::Mul(RoundBf16(a), wv))); break;
        default: out = RoundBf16(Canonical(hn::Mul(a, wv))); break;
      }
      hn::StoreU(out, df, y + k);
      gm.Add(out);
    }
    for (size_t i = k; i < end; ++i) {
      const float a = CanonScalar(z[i] * r), wf = Bf16ToF32(w[i]);
      switch (mode) {
        case NormWeight::f32: y[i] = CanonScalar(a * wf); break;
        case NormWeight::dtype_twice: y[i] = RoundBf16Scalar(CanonScalar(RoundBf16Scalar(a) * wf)); break;
        default: y[i] = RoundBf16Scalar(CanonScalar(a * wf)); break;
      }
    }
    gm.Finish(y, k, end, amax + g, nan + g);
  }
}


// Steps 5–6 for bf16 rows on the fast path: the row has no NaN z (its mean of squares is not NaN) and r is not NaN,
// and y only feeds the vectorised group quant (not exported). Weights pre-widened to f32 (wf). Then every NaN that
// can arise here is x86's default NaN or a widened bf16 NaN, both with the low 16 bits zero, so the bf16 rounding
// needs no NaN branch (b + 0x7FFF + lsb keeps such a NaN a NaN), and NaN bits of y never matter (the quotient is
// canonicalised). The group amax is a u32 max of |y| bits; a value above 0x7F800000 means a NaN was in the group,
// which is then rescanned (amax over the non-NaN |y|, nan flag).
template <int kMode, class Z>  // 0: weight=f32, 1: dtype-twice, 2: dtype-once
void NormWeightBf16FastT(const Z z, const float* w, size_t K, float r, float* y, size_t G, float* amax,
                         uint8_t* nan, NextRow next) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  const auto vr = hn::Set(df, r);
  const auto absm = hn::Set(du, 0x7FFFFFFFu);
  auto rnd1 = [](float v) {
    uint32_t b;
    std::memcpy(&b, &v, 4);
    b = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
    std::memcpy(&v, &b, 4);
    return v;
  };
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const size_t end = k0 + G < K ? k0 + G : K;
    auto mx = hn::Zero(du);
    size_t k = k0;
    for (; k + N <= end; k += N) {
      next.At(k);
      const auto a = hn::Mul(z.Load(k), vr);
      const auto wv = hn::LoadU(df, w + k);
      hn::Vec<DF> out;
      if (kMode == 0) out = hn::Mul(a, wv);
      else if (kMode == 1) out = RoundBf16NoNan(hn::Mul(RoundBf16NoNan(a), wv));
      else out = RoundBf16NoNan(hn::Mul(a, wv));
      hn::StoreU(out, df, y + k);
      mx = hn::Max(mx, hn::And(hn::BitCast(du, out), absm));
    }
    uint32_t m = k > k0 ? hn::GetLane(hn::MaxOfLanes(du, mx)) : 0u;
    for (size_t i = k; i < end; ++i) {
      const float a = z.At(i) * r;
      const float o = kMode == 0 ? a * w[i] : kMode == 1 ? rnd1(rnd1(a) * w[i]) : rnd1(a * w[i]);
      y[i] = o;
      uint32_t b;
      std::memcpy(&b, &o, 4);
      b &= 0x7FFFFFFFu;
      m = b > m ? b : m;
    }
    if (m <= 0x7F800000u) {
      std::memcpy(&amax[g], &m, 4);
      nan[g] = 0;
    } else {  // a NaN in the group
      float mxf = 0.0f;
      for (size_t i = k0; i < end; ++i)
        if (!std::isnan(y[i])) mxf = std::fabs(y[i]) > mxf ? std::fabs(y[i]) : mxf;
      amax[g] = mxf;
      nan[g] = 1;
    }
  }
}
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
// AVX2 (Zen 3 runs vector shifts and shuffles on two of its four vector pipes, the rest on all four): NormWeightBf16FastT
// with no shift in the bf16 rounding and one shuffle per 8 widened values.
//   Widening: 16 bf16 values a step by unpacklo/unpackhi_epi16 with zero words below them (per 128-bit block), so lane
//     vector lo holds elements 0–3 and 8–11 of the step, hi 4–7 and 12–15 (vpmovzxwd + a shift took two shift/shuffle
//     operations per 8). The weights come permuted alike (the caller's wfp) and y is stored in that order: every later
//     step is element-wise (the group amax, the quotients, the casts) until RowQuantFast's packs, which put the codes
//     of a permuted row in order by one qword permutation (the packs of 16-blocks in this order restore element order
//     per block: packus_epi32(lo, hi) holds elements 0–7 in block 0 and 8–15 in block 1).
//   bf16 RNE: RoundBf16NoNanAvx2 (no shift).
// 64 rows in cache, 1 thread, alternated: vllm-rmsnorm-quant 0.284 -> 0.268 ms, + residual 0.456 -> 0.433 ms (fusing
// this with the quant per group, y in a 1 KiB L1 buffer instead of a row through L2, measured no faster: dropped).
// 16 values of y from x (+ res) at k, permuted (lo: elements 0–3 and 8–11, hi: 4–7 and 12–15), as f32 bits.
// kFp: the bf16 roundings by SplitBf16Avx2 (of RN(z·r) and of RN(a1·w)), for rows whose values stay in its range or
// go where it does not matter (NormWeightBf16Fast).
template <int kMode, bool kFp>
HWY_INLINE void NormStep16(const uint16_t* x, const uint16_t* res, const float* wp, size_t k, __m256 vr, __m256i& olo,
                           __m256i& ohi) {
  const __m256i zero = _mm256_setzero_si256();
  auto widen = [&](const uint16_t* p, __m256& lo, __m256& hi) HWY_ATTR __attribute__((always_inline)) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
  };
  auto weight = [&](__m256 z, const float* w) HWY_ATTR __attribute__((always_inline)) {
    const __m256 a = _mm256_mul_ps(z, vr);
    const __m256 wv = _mm256_load_ps(w);
    if constexpr (kFp && kMode == 1) return _mm256_castps_si256(SplitBf16Avx2(_mm256_mul_ps(SplitBf16Avx2(a), wv)));
    if constexpr (kFp && kMode == 2) return _mm256_castps_si256(SplitBf16Avx2(_mm256_mul_ps(a, wv)));
    if constexpr (kMode == 0) return _mm256_castps_si256(_mm256_mul_ps(a, wv));
    const __m256 a1 = kMode == 1 ? _mm256_castsi256_ps(RoundBf16NoNanAvx2(_mm256_castps_si256(a))) : a;
    return RoundBf16NoNanAvx2(_mm256_castps_si256(_mm256_mul_ps(a1, wv)));
  };
  __m256 lo, hi;
  widen(x + k, lo, hi);
  if (res) {
    __m256 rlo, rhi;
    widen(res + k, rlo, rhi);
    lo = _mm256_add_ps(lo, rlo);
    hi = _mm256_add_ps(hi, rhi);
  }
  olo = weight(lo, wp + k);
  ohi = weight(hi, wp + k + 8);
}
// Returns false (kFp only) when a group's max |y| is not finite: the row is to be redone with kFp false (it cannot
// happen on the rows NormWeightBf16Fast gives kFp; a safety net, not a path).
// kOrdered: y stored in element order (two lane permutations per 16 values) for a quant that reads it so.
template <int kMode, bool kFp, bool kOrdered>
bool NormWeightBf16Avx2(const uint16_t* x, const uint16_t* res, const float* wp, size_t K, float r, float* y, size_t G,
                        float* amax, uint8_t* nan, NextRow next) {
  const __m256 vr = _mm256_set1_ps(r);
  const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    __m256i mx = _mm256_setzero_si256();
    for (size_t k = k0; k < k0 + G; k += 16) {
      next.At(k);
      __m256i olo, ohi;
      NormStep16<kMode, kFp>(x, res, wp, k, vr, olo, ohi);
      if constexpr (kOrdered) {  // lo = elements 0–3 | 8–11, hi = 4–7 | 12–15
        _mm256_store_si256(reinterpret_cast<__m256i*>(y + k), _mm256_permute2x128_si256(olo, ohi, 0x20));
        _mm256_store_si256(reinterpret_cast<__m256i*>(y + k + 8), _mm256_permute2x128_si256(olo, ohi, 0x31));
      } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(y + k), olo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(y + k + 8), ohi);
      }
      mx = _mm256_max_epu32(mx, _mm256_max_epu32(_mm256_and_si256(olo, absm), _mm256_and_si256(ohi, absm)));
    }
    const uint32_t m = hn::GetLane(hn::MaxOfLanes(DU(), hn::Vec<DU>{mx}));
    if (kFp && m >= 0x7F800000u) return false;
    if (m <= 0x7F800000u) {
      std::memcpy(&amax[g], &m, 4);
      nan[g] = 0;
    } else {  // a NaN in the group: the amax over the non-NaN |y| (any order)
      float mxf = 0.0f;
      for (size_t i = k0; i < k0 + G; ++i)
        if (!std::isnan(y[i])) mxf = std::fabs(y[i]) > mxf ? std::fabs(y[i]) : mxf;
      amax[g] = mxf;
      nan[g] = 1;
    }
  }
  return true;
}
#endif
// wp: the weights permuted for NormWeightBf16Avx2 (null: that form is not allowed, e.g. the quant after it is not
// RowQuantFast). split: set (by the caller) only where the bf16 roundings may
// take Veltkamp's split (SplitBf16Avx2): the row's z and r finite, every |w| <= 2^50 and the quant spec's guard keeps
// every scale >= 2^-60 (rq512::flush_subnormal_harmless's conditions). Then every a = RN(z·r) and product is ±0, in
// the split's range, or below 2^-126: |a| <= |z|·r stays near sqrt(K) (r = rsqrt of the mean of squares + eps), a
// product below |a|·2^50; and a value below 2^-126 gives |y| <= 2^-75, a code ±0 with y's sign (the split keeps a
// nonzero value nonzero, as the integer rounding does) and a group max under the guard's amax — the same codes and
// scales either way. Returns true when y was written permuted (AVX2 only; see NormWeightBf16Avx2); ordered: never
// (the AVX2 loop stores y in element order, for a quant that is not RowQuantFast).
bool NormWeightBf16Fast(ZRow zr, const float* w, const float* wp, bool split, size_t K, float r, NormWeight mode,
                        float* y, size_t G, float* amax, uint8_t* nan, const uint16_t* next_x, const uint16_t* next_r,
                        bool ordered) {
  const NextRow nx{next_x, next_r};
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  if (wp && zr.kind != 0 && G % 16 == 0 && K % G == 0 && reinterpret_cast<uintptr_t>(y) % 32 == 0) {
    const auto* x = static_cast<const uint16_t*>(zr.p);
    const uint16_t* res = zr.kind == 2 ? zr.p2 : nullptr;
    auto run = [&](auto ord) HWY_ATTR {
      constexpr bool kO = decltype(ord)::value;
      switch (mode) {
        case NormWeight::f32: NormWeightBf16Avx2<0, false, kO>(x, res, wp, K, r, y, G, amax, nan, nx); break;
        case NormWeight::dtype_twice:
          if (!split || !NormWeightBf16Avx2<1, true, kO>(x, res, wp, K, r, y, G, amax, nan, nx))
            NormWeightBf16Avx2<1, false, kO>(x, res, wp, K, r, y, G, amax, nan, nx);
          break;
        default:
          if (!split || !NormWeightBf16Avx2<2, true, kO>(x, res, wp, K, r, y, G, amax, nan, nx))
            NormWeightBf16Avx2<2, false, kO>(x, res, wp, K, r, y, G, amax, nan, nx);
          break;
      }
    };
    if (ordered) {
      run(std::true_type{});
      return false;
    }
    run(std::false_type{});
    return true;
  }
#else
  (void)wp;
  (void)split;
  (void)ordered;
#endif
  VisitZ(zr, [&](auto z) HWY_ATTR {
    switch (mode) {
      case NormWeight::f32: return NormWeightBf16FastT<0>(z, w, K, r, y, G, amax, nan, nx);
      case NormWeight::dtype_twice: return NormWeightBf16FastT<1>(z, w, K, r, y, G, amax, nan, nx);
      default: return NormWeightBf16FastT<2>(z, w, K, r, y, G, amax, nan, nx);
    }
  });
  return false;
}

// f32 rows: steps 5–6 with weight modes that do not round (f32 input: RN_dt is the identity).
void NormWeightF32(const float* z, const float* w, size_t K, float r, float* y) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto vr = hn::Set(df, r);
  size_t k = 0;
  for (; k + N <= K; k += N)
    hn::StoreU(Canonical(hn::Mul(Canonical(hn::Mul(hn::LoadU(df, z + k), vr)), hn::LoadU(df, w + k))), df, y + k);
  for (; k < K; ++k) {
    float o = (z[k] * r) * w[k];  // a NaN product gives a NaN result either way: canonical below
    const uint32_t c = kCanonicalNan;
    if (std::isnan(o)) std::memcpy(&o, &c, 4);
    y[k] = o;
  }
}

// Step 2 of the quant for f32/f16 rows: per group, the amax over the non-NaN |y| and whether a NaN was seen.
void RowAmax(const float* y, size_t K, size_t G, float* amax, uint8_t* nan) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const size_t end = k0 + G < K ? k0 + G : K;
    GroupMax gm{hn::Zero(df), hn::Zero(df)};
    size_t k = k0;
    for (; k + N <= end; k += N) gm.Add(hn::LoadU(df, y + k));
    gm.Finish(y, k, end, amax + g, nan + g);
  }
}

// Steps 7–8 in lanes for a group with divisor s (x/s) or multiplier s = RN32(1/s) (x*(1/s)): the quotient (IEEE
// division), the GPU NaN model and the clamp. The clamps that replace a NaN make its bits irrelevant (no
// canonicalisation there); the NaN test is explicit (no reliance on minps/maxps operand order).
template <bool mul, Clamp clamp>
HWY_INLINE hn::Vec<DF> QuotClamp(hn::Vec<DF> yv, hn::Vec<DF> s, hn::Vec<DF> hi, hn::Vec<DF> lo) {
  const auto raw = mul ? hn::Mul(yv, s) : hn::Div(yv, s);
  const auto clamped = hn::Min(hn::Max(raw, lo), hi);
  if (clamp == Clamp::nan_to_max) return hn::IfThenElse(hn::IsNaN(raw), hi, clamped);
  if (clamp == Clamp::nan_to_min) return hn::IfThenElse(hn::IsNaN(raw), lo, clamped);
  const auto t = Canonical(raw);
  if (clamp == Clamp::nan_kept) return hn::IfThenElse(hn::IsNaN(t), t, hn::Min(hn::Max(t, lo), hi));
  return t;  // Clamp::none
}

// Steps 7–9 over a row, group g with divisor sv[g] (x/s) or multiplier sv[g] = RN32(1/s) (x*(1/s)): QuotClamp,
// then either the values v for cpu::encode_f32, or, with `cast_e4m3` (an RNE cast to e4m3fn after a NaN-replacing
// clamp to max <= 448: every RNE cast convention gives the same code there, -0 -> 0x80), the codes by
// fp8_lanes::CastE4m3 (src/cpu/fp8_lanes-inl.h, shared with the group quant).
template <bool mul, Clamp clamp>
HWY_INLINE void RowQuantT(const float* y, size_t K, size_t G, const float* sv, float mx, bool cast_e4m3, float* v,
                          uint8_t* q) {
  const DF df;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const auto hi = hn::Set(df, mx), lo = hn::Set(df, -mx);
  auto quotient = [&](hn::Vec<DF> yv, hn::Vec<DF> s) { return QuotClamp<mul, clamp>(yv, s, hi, lo); };
  auto cast = [&](hn::Vec<DF> t) { return hn::U8FromU32(fp8_lanes::CastE4m3(t)); };
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const size_t end = k0 + G < K ? k0 + G : K;
    const auto s = hn::Set(df, sv[g]);
    size_t k = k0;
    if (cast_e4m3) {
      for (; k + N <= end; k += N) hn::StoreU(cast(quotient(hn::LoadU(df, y + k), s)), d8, q + k);
    } else {
      for (; k + N <= end; k += N) hn::StoreU(quotient(hn::LoadU(df, y + k), s), df, v + k);
    }
    if (k < end) {  // the group's tail through a padded vector
      HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
      HWY_ALIGN uint8_t cb[HWY_MAX_BYTES / sizeof(float)] = {};
      for (size_t i = k; i < end; ++i) buf[i - k] = y[i];
      const auto t = quotient(hn::Load(df, buf), s);
      if (cast_e4m3) {
        hn::Store(cast(t), d8, cb);
        for (size_t i = k; i < end; ++i) q[i] = cb[i - k];
      } else {
        hn::Store(t, df, buf);
        for (size_t i = k; i < end; ++i) v[i] = buf[i - k];
      }
    }
  }
}

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
// RowQuantFastT's AVX2 loop over a row of whole groups of a multiple of 32 elements, every group fast: one
// software-pipelined loop over the row, 32 elements a step (the quotients of step i + 1 computed with step i's casts),
// the group's constants broadcast per step, the signs of 32 values as bytes by three saturating packs (they keep the
// sign; -0 too) — the per-group loop is neither pipelined nor free of spills (~35 cycles per 32 elements in cache on
// Zen 3 against ~23 for this form in quant_cpu.cc's ElemFastT). The same arithmetic. kClamp false: every group is
// clamp-free (fast[g] == 2), the u32 min is left out.
template <bool mul, bool narrow, bool kClamp>
HWY_INLINE void RowQuantFastAvx2(const float* y, size_t K, size_t G, const float* sv, const float* rb, float mx,
                                 uint8_t* q, bool permuted) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  const auto absm = hn::Set(du, 0x7FFFFFFFu);
  const auto bound = hn::Set(du, rmsnorm_cpu_detail::bits_of(mx));
  const __m256i b80 = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256i v0, v1, v2, v3, sg;
  auto quotients = [&](size_t k, size_t g) HWY_ATTR __attribute__((always_inline)) {
    const hn::Vec<DF> S{_mm256_broadcast_ss(sv + g)}, B{_mm256_broadcast_ss(rb + g)};
    const __m256 y0 = _mm256_loadu_ps(y + k), y1 = _mm256_loadu_ps(y + k + N);
    const __m256 y2 = _mm256_loadu_ps(y + k + 2 * N), y3 = _mm256_loadu_ps(y + k + 3 * N);
    auto one = [&](__m256 yv) HWY_ATTR __attribute__((always_inline)) {
      const auto ay = hn::BitCast(df, hn::And(hn::BitCast(du, hn::Vec<DF>{yv}), absm));
      const auto v = mul ? hn::Mul(ay, S) : fp8_lanes::FastDiv<narrow>(ay, S, B);
      return kClamp ? hn::Min(hn::BitCast(du, v), bound).raw : hn::BitCast(du, v).raw;
    };
    v0 = one(y0);
    v1 = one(y1);
    v2 = one(y2);
    v3 = one(y3);
    const __m256i w01 = _mm256_packs_epi32(_mm256_castps_si256(y0), _mm256_castps_si256(y1));
    const __m256i w23 = _mm256_packs_epi32(_mm256_castps_si256(y2), _mm256_castps_si256(y3));
    sg = _mm256_and_si256(_mm256_packs_epi16(w01, w23), b80);
  };
  const __m256i order = permuted ? _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7)    // qwords 0, 2, 1, 3
                                 : _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // StoreCodes4's
  const size_t per_group = G / (4 * N);
  size_t qg = 0, q_in = 0;  // the group of the step whose quotients are computed, and its step in it (counted)
  quotients(0, 0);
  for (size_t k = 0;;) {
    const __m256i packed = fp8_lanes::CastPack32(v0, v1, v2, v3, sg);
    const size_t kn = k + 4 * N;
    const bool more = kn < K;
    if (++q_in == per_group) {
      q_in = 0;
      ++qg;
    }
    if (more) quotients(kn, qg);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm256_permutevar8x32_epi32(packed, order));
    if (!more) break;
    k = kn;
  }
}
#endif

// RowQuantT with the cast in lanes, per group either fast (fast[g] != 0: the group has no NaN and no Inf, and for
// x/s its divisor sv[g] lies in [2^-60, 2^60] with amax <= sv[g]·2^60 and rb[g] = RN(1/sv[g]); for x*(1/s) its
// multiplier sv[g] is finite and >= 0) or as RowQuantT. Fast groups: v = |y|/s by fp8_lanes::FastDiv or
// |y|·sv, the clamp as a u32 min with max's bits, fp8_lanes::CastE4m3Mag, y's sign as bit 7 (the argument for the
// division: quant_cpu.cc's FastGroups). The group's tail (K % G) always goes through QuotClamp.
// permuted: y in NormWeightBf16Avx2's order (AVX2 only): the all-fast loop puts the codes in order by one qword
// permutation instead of StoreCodes4's dword one; any other row is put back in order first (y is scratch).
template <bool mul, Clamp clamp, bool narrow>
HWY_INLINE void RowQuantFastT(float* y, size_t K, size_t G, const float* sv, const float* rb, const uint8_t* fast,
                              float mx, uint8_t* q, bool permuted) {
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const auto hi = hn::Set(df, mx), lo = hn::Set(df, -mx);
  const auto absm = hn::Set(du, 0x7FFFFFFFu), sgn = hn::Set(du, 0x80u);
  const auto bound = hn::Set(du, rmsnorm_cpu_detail::bits_of(mx));
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  // AVX2, a row of whole groups of a multiple of 32 elements, every group fast: RowQuantFastAvx2
  if (G % (4 * N) == 0 && K % G == 0 && K > 0) {
    bool all_fast = true, clamp_free = true;  // fast[g] == 2: the clamp changes no code (RowGroupScales)
    for (size_t g = 0; g < K / G; ++g) {
      all_fast = all_fast && fast[g] != 0;
      clamp_free = clamp_free && fast[g] == 2;
    }
    if (all_fast && clamp_free) return RowQuantFastAvx2<mul, narrow, false>(y, K, G, sv, rb, mx, q, permuted);
    if (all_fast) return RowQuantFastAvx2<mul, narrow, true>(y, K, G, sv, rb, mx, q, permuted);
  }
  if (permuted) {  // back in element order (K % 16 == 0 here: NormWeightBf16Avx2's condition)
    alignas(32) float t[16];
    for (size_t k = 0; k < K; k += 16) {
      std::memcpy(t, y + k, sizeof t);
      for (size_t i = 0; i < 4; ++i) {
        y[k + i] = t[i];
        y[k + 8 + i] = t[4 + i];
        y[k + 4 + i] = t[8 + i];
        y[k + 12 + i] = t[12 + i];
      }
    }
  }
#else
  (void)permuted;
#endif
  for (size_t k0 = 0, g = 0; k0 < K; k0 += G, ++g) {
    const size_t end = k0 + G < K ? k0 + G : K;
    const auto s = hn::Set(df, sv[g]);
    size_t k = k0;
    if (fast[g]) {
      const auto b = hn::Set(df, rb[g]);
      auto code = [&](hn::Vec<DF> yv) {
        const auto yb = hn::BitCast(du, yv);
        const auto ay = hn::BitCast(df, hn::And(yb, absm));
        const auto v = mul ? hn::Mul(ay, s) : fp8_lanes::FastDiv<narrow>(ay, s, b);
        return hn::OrAnd(fp8_lanes::CastE4m3Mag(hn::Min(hn::BitCast(du, v), bound)), hn::ShiftRight<24>(yb), sgn);
      };
      for (; k + 4 * N <= end; k += 4 * N) {
        const auto c0 = code(hn::LoadU(df, y + k)), c1 = code(hn::LoadU(df, y + k + N));
        const auto c2 = code(hn::LoadU(df, y + k + 2 * N)), c3 = code(hn::LoadU(df, y + k + 3 * N));
        fp8_lanes::StoreCodes4(c0, c1, c2, c3, q + k);
      }
      for (; k + N <= end; k += N) hn::StoreU(hn::U8FromU32(code(hn::LoadU(df, y + k))), d8, q + k);
    } else {
      for (; k + N <= end; k += N)
        hn::StoreU(hn::U8FromU32(fp8_lanes::CastE4m3(QuotClamp<mul, clamp>(hn::LoadU(df, y + k), s, hi, lo))), d8, q + k);
    }
    if (k < end) {  // the group's tail through a padded vector
      HWY_ALIGN float buf[HWY_MAX_BYTES / sizeof(float)] = {};
      HWY_ALIGN uint8_t cb[HWY_MAX_BYTES / sizeof(float)] = {};
      for (size_t i = k; i < end; ++i) buf[i - k] = y[i];
      hn::Store(hn::U8FromU32(fp8_lanes::CastE4m3(QuotClamp<mul, clamp>(hn::Load(df, buf), s, hi, lo))), d8, cb);
      for (size_t i = k; i < end; ++i) q[i] = cb[i - k];
    }
  }
}
// narrow: every y has at most 11 significant bits (bf16/f16 rows whose weight step rounds to the dtype), so x/s
// takes one FMA correction (fp8_lanes::MarksteinDiv1).
void RowQuantFast(float* y, size_t K, size_t G, const float* sv, const float* rb, const uint8_t* fast, bool mul,
                  bool narrow, Clamp clamp, float mx, uint8_t* q, bool permuted) {
  if (clamp == Clamp::nan_to_max) {
    if (mul) return RowQuantFastT<true, Clamp::nan_to_max, false>(y, K, G, sv, rb, fast, mx, q, permuted);
    if (narrow) return RowQuantFastT<false, Clamp::nan_to_max, true>(y, K, G, sv, rb, fast, mx, q, permuted);
    return RowQuantFastT<false, Clamp::nan_to_max, false>(y, K, G, sv, rb, fast, mx, q, permuted);
  }
  if (mul) return RowQuantFastT<true, Clamp::nan_to_min, false>(y, K, G, sv, rb, fast, mx, q, permuted);
  if (narrow) return RowQuantFastT<false, Clamp::nan_to_min, true>(y, K, G, sv, rb, fast, mx, q, permuted);
  return RowQuantFastT<false, Clamp::nan_to_min, false>(y, K, G, sv, rb, fast, mx, q, permuted);
}

void RowQuant(const float* y, size_t K, size_t G, const float* sv, bool mul, Clamp clamp, float mx, bool cast_e4m3,
              float* v, uint8_t* q) {
#define FP8REF_ROWQUANT_CASE(C)                                                 \
  case Clamp::C:                                                                \
    if (mul) return RowQuantT<true, Clamp::C>(y, K, G, sv, mx, cast_e4m3, v, q); \
    return RowQuantT<false, Clamp::C>(y, K, G, sv, mx, cast_e4m3, v, q);
  switch (clamp) {
    FP8REF_ROWQUANT_CASE(none)
    FP8REF_ROWQUANT_CASE(nan_to_max)
    FP8REF_ROWQUANT_CASE(nan_to_min)
    FP8REF_ROWQUANT_CASE(nan_kept)
  }
#undef FP8REF_ROWQUANT_CASE
}

// Steps 5–9 for a bf16 row on the fast path (as NormWeightBf16Fast: no NaN z, r not NaN, y not exported) with
// formula x*(1/s) or x/s and the cast in lanes, fused per group in registers: y (NormWeightBf16Fast's arithmetic) for the
// G <= 8·N elements of a group, its amax (u32 max of |y| bits; a group with a NaN is spilled to `spill` and its amax
// taken over the non-NaN |y|, as GroupMax), the scale by rmsnorm_cpu_detail::group_scale (the host loop's code) and
// the multiplier sv = gpu(RN(1/s)), then the codes: in a finite group (every |y| < Inf) with sv finite as
// RowQuantFastT's fast groups, else by QuotClamp and fp8_lanes::CastE4m3. x/s (kDiv) likewise with RowQuantFastT's
// fast-group test and division: one FMA correction when y is bf16-valued (kMode 1, 2), two for f32 weights.
// Returns false (nothing written) when G is not a multiple of N, G > 8·N or K % G != 0: then the caller runs the
// separate passes. kNv: the vectors per group when known at compile time (8: G = 128 on AVX-512 — the arrays then
// live in registers), else 0 (G / N at run time).
// Software-pipelined by one group: the scalar scale chain of group g (the lane max's reduction, the divisions) is
// issued before group g + 1's y, so the out-of-order core computes g + 1's y while the chain completes; group g's
// codes follow (12–17 % faster than finishing each group before the next, bench_rmsnorm_quant, 1 thread).
template <int kMode, Clamp kClamp, bool kDiv, size_t kNv, class Z>
HWY_INLINE void NormQuantBf16G(const Z z, const float* w, size_t K, float r, size_t G, const QuantSpec& qs,
                               float rcp_max, float* spill, float* scales, uint8_t* q, NextRow next) {
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  constexpr size_t kMaxV = 8;
  const size_t nv = kNv ? kNv : G / N;
  const auto vr = hn::Set(df, r);
  const auto absm = hn::Set(du, 0x7FFFFFFFu), sgn = hn::Set(du, 0x80u);
  const float mx = qs.fp8_max;
  const auto hi = hn::Set(df, mx), lo = hn::Set(df, -mx);
  const auto bound = hn::Set(du, rmsnorm_cpu_detail::bits_of(mx));
  struct Scale {
    float A, B;
    bool fast;
  };
  // y of the group at k0 into yv; returns the u32 max of |y| bits
  auto group_y = [&](size_t k0, hn::Vec<DF>* yv) HWY_ATTR __attribute__((always_inline)) {
    auto m = hn::Zero(du);
    for (size_t j = 0; j < nv; ++j) {
      next.At(k0 + j * N);
      const auto a = hn::Mul(z.Load(k0 + j * N), vr);
      const auto wv = hn::LoadU(df, w + k0 + j * N);
      hn::Vec<DF> out;
      if constexpr (kMode == 0) out = hn::Mul(a, wv);
      else if constexpr (kMode == 1) out = RoundBf16NoNan(hn::Mul(RoundBf16NoNan(a), wv));
      else out = RoundBf16NoNan(hn::Mul(a, wv));
      yv[j] = out;
      m = hn::Max(m, hn::And(hn::BitCast(du, out), absm));
    }
    return m;
  };
  auto group_scale = [&](hn::Vec<DU> m, size_t g, const hn::Vec<DF>* yv) HWY_ATTR __attribute__((always_inline)) {
    const uint32_t mb = hn::GetLane(hn::MaxOfLanes(du, m));
    float amax;
    bool nan = false;
    if (mb <= 0x7F800000u) {
      amax = rmsnorm_cpu_detail::f32_of(mb);
    } else {  // a NaN in the group: the amax over the non-NaN |y|
      for (size_t j = 0; j < nv; ++j) hn::StoreU(yv[j], df, spill + j * N);
      amax = 0.0f;
      for (size_t i = 0; i < G; ++i)
        if (!std::isnan(spill[i])) amax = std::fabs(spill[i]) > amax ? std::fabs(spill[i]) : amax;
      nan = true;
    }
    const float s = rmsnorm_cpu_detail::group_scale(qs, amax, nan, rcp_max);
    scales[g] = s;
    Scale sc;
    sc.A = kDiv ? s : rmsnorm_cpu_detail::gpu(1.0f / s);
    sc.B = kDiv ? 1.0f / s : 0.0f;
    sc.fast = mb < 0x7F800000u && (kDiv ? rmsnorm_cpu_detail::div_fast(s, amax)
                                        : rmsnorm_cpu_detail::bits_of(sc.A) < 0x7F800000u);
    return sc;
  };
  auto group_codes = [&](size_t k0, const hn::Vec<DF>* yv, const Scale& sc) HWY_ATTR __attribute__((always_inline)) {
    hn::Vec<DU> cv[kMaxV];
    const auto VA = hn::Set(df, sc.A);
    if (sc.fast) {
      const auto VB = hn::Set(df, sc.B);
      for (size_t j = 0; j < nv; ++j) {
        const auto yb = hn::BitCast(du, yv[j]);
        const auto ay = hn::BitCast(df, hn::And(yb, absm));
        const auto v = kDiv ? fp8_lanes::FastDiv<kMode != 0>(ay, VA, VB) : hn::Mul(ay, VA);
        cv[j] = hn::OrAnd(fp8_lanes::CastE4m3Mag(hn::Min(hn::BitCast(du, v), bound)), hn::ShiftRight<24>(yb), sgn);
      }
    } else {
      for (size_t j = 0; j < nv; ++j) cv[j] = fp8_lanes::CastE4m3(QuotClamp<!kDiv, kClamp>(yv[j], VA, hi, lo));
    }
    size_t j = 0;
    for (; j + 4 <= nv; j += 4) fp8_lanes::StoreCodes4(cv[j], cv[j + 1], cv[j + 2], cv[j + 3], q + k0 + j * N);
    for (; j < nv; ++j) hn::StoreU(hn::U8FromU32(cv[j]), d8, q + k0 + j * N);
  };
  const size_t ng = K / G;
  if (ng == 0) return;
  hn::Vec<DF> ya[kMaxV], yb[kMaxV];
  for (size_t j = 0; j < kMaxV; ++j) ya[j] = yb[j] = hn::Zero(df);  // (dead stores: quiets -Wmaybe-uninitialized)
  auto ma = group_y(0, ya);
  // two groups a step, the arrays' roles alternating by name (not by a swapped pointer: with compile-time indices
  // both arrays stay in registers when kNv is known)
  for (size_t g = 0; g < ng; g += 2) {
    const Scale sa = group_scale(ma, g, ya);
    const bool has_b = g + 1 < ng;
    hn::Vec<DU> mb = hn::Zero(du);
    if (has_b) mb = group_y((g + 1) * G, yb);
    group_codes(g * G, ya, sa);
    if (!has_b) break;
    const Scale sb = group_scale(mb, g + 1, yb);
    if (g + 2 < ng) ma = group_y((g + 2) * G, ya);
    group_codes((g + 1) * G, yb, sb);
  }
}
template <int kMode, Clamp kClamp, bool kDiv>
bool NormQuantBf16T(ZRow zr, const float* w, size_t K, float r, size_t G, const QuantSpec& qs, float rcp_max,
                    float* spill, float* scales, uint8_t* q, NextRow nx) {
  const size_t N = hn::Lanes(DF());
  if (G % N != 0 || G > 8 * N || K % G != 0) return false;
  VisitZ(zr, [&](auto z) HWY_ATTR {
    if (G == 8 * N) NormQuantBf16G<kMode, kClamp, kDiv, 8>(z, w, K, r, G, qs, rcp_max, spill, scales, q, nx);
    else NormQuantBf16G<kMode, kClamp, kDiv, 0>(z, w, K, r, G, qs, rcp_max, spill, scales, q, nx);
  });
  return true;
}
bool NormQuantBf16(ZRow zr, const float* w, size_t K, float r, NormWeight mode, size_t G,
                   const QuantSpec& qs, float rcp_max, float* spill, float* scales, uint8_t* q, const uint16_t* next_x,
                   const uint16_t* next_r) {
  const NextRow nx{next_x, next_r};
  const bool nan_max = qs.clamp == Clamp::nan_to_max;
  const bool div = qs.formula == QuantFormula::div;
#define FP8REF_NQ(M)                                                                                                 \
  if (div)                                                                                                           \
    return nan_max ? NormQuantBf16T<M, Clamp::nan_to_max, true>(zr, w, K, r, G, qs, rcp_max, spill, scales, q, nx) \
                   : NormQuantBf16T<M, Clamp::nan_to_min, true>(zr, w, K, r, G, qs, rcp_max, spill, scales, q, nx); \
  return nan_max ? NormQuantBf16T<M, Clamp::nan_to_max, false>(zr, w, K, r, G, qs, rcp_max, spill, scales, q, nx) \
                 : NormQuantBf16T<M, Clamp::nan_to_min, false>(zr, w, K, r, G, qs, rcp_max, spill, scales, q, nx);
  switch (mode) {
    case NormWeight::f32: FP8REF_NQ(0)
    case NormWeight::dtype_twice: FP8REF_NQ(1)
    default: FP8REF_NQ(2)
  }
#undef FP8REF_NQ
}

// The host loop's per-group steps for groups [0, n), a vector at a time (a partial vector through padded copies):
// the group's scale as rmsnorm_cpu_detail::group_scale computes it (guard: fmax_nan_loses or NaN-propagating; gpu:
// the canonical NaN) — the same IEEE operations in lanes —, the divisor or multiplier gsv, and RowQuantFast's
// per-group test gfast (div_fast for x/s) and reciprocal grb (lanes: cast_in_lanes). (As a scalar loop it was ~7 %
// of a vllm-rmsnorm-quant row in cache on Zen 3: two divisions and a chain of branches per group.)
// gnan null: no group holds a NaN (the AVX-512 passes, which decline such rows). Returns whether every group is fast
// (lanes; false without lanes).
bool RowGroupScales(const QuantSpec& qs, float rcp_max, bool mul, bool lanes, const float* gamax, const uint8_t* gnan,
                    size_t n, float* scales, float* gsv, uint8_t* gfast, float* grb) {
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const bool ignore = qs.amax_nan == AmaxNan::ignore;
  const auto canon = hn::BitCast(df, hn::Set(du, kCanonicalNan));
  auto guard = [&](hn::Vec<DF> v, float floor) HWY_ATTR {
    const auto f = hn::Set(df, floor);
    const auto mx = hn::IfThenElse(hn::Lt(v, f), f, v);
    if (ignore) return hn::IfThenElse(hn::IsNaN(v), f, hn::IfThenElse(hn::IsNaN(f), v, mx));
    return hn::IfThenElse(hn::Or(hn::IsNaN(v), hn::IsNaN(f)), canon, mx);
  };
  const auto one = hn::Set(df, 1.0f);
  constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
  // groups [i, i + N) from am0 / nan8; the results to the four outputs at i (m < N: through the buffers)
  HWY_ALIGN float bs[kMaxLanes], bg[kMaxLanes], br[kMaxLanes];
  HWY_ALIGN uint8_t bf[kMaxLanes];
  bool all_fast = lanes;
  for (size_t i = 0; i < n; i += N) {
    const size_t m = n - i < N ? n - i : N;
    hn::Vec<DF> am0;
    hn::Vec<DU> nan8;
    if (m == N) {
      am0 = hn::LoadU(df, gamax + i);
      nan8 = gnan ? hn::PromoteTo(du, hn::LoadU(d8, gnan + i)) : hn::Zero(du);
    } else {
      HWY_ALIGN float ta[kMaxLanes] = {};
      HWY_ALIGN uint8_t tn[kMaxLanes] = {};
      std::memcpy(ta, gamax + i, m * 4);
      if (gnan) std::memcpy(tn, gnan + i, m);
      am0 = hn::Load(df, ta);
      nan8 = hn::PromoteTo(du, hn::Load(d8, tn));
    }
    const auto nan = hn::RebindMask(df, hn::Ne(nan8, hn::Zero(du)));
    auto amax = am0;
    if (qs.amax_nan == AmaxNan::propagate) amax = hn::IfThenElse(nan, canon, amax);
    if (qs.amax_floor) amax = guard(amax, *qs.amax_floor);
    auto sv = Canonical(qs.scale_formula == ScaleFormula::div ? hn::Div(amax, hn::Set(df, qs.fp8_max))
                                                              : hn::Mul(amax, hn::Set(df, rcp_max)));
    if (qs.min_scale) sv = guard(sv, *qs.min_scale);
    const auto g = mul ? Canonical(hn::Div(one, sv)) : sv;
    float* os = m == N ? scales + i : bs;
    float* og = m == N ? gsv + i : bg;
    hn::StoreU(sv, df, os);
    hn::StoreU(g, df, og);
    if (lanes) {  // RowQuantFast's condition (a group with a NaN or an Inf: never fast)
      const auto inf = hn::Set(du, 0x7F800000u);
      const auto finite = hn::AndNot(hn::RebindMask(du, nan), hn::Lt(hn::BitCast(du, am0), inf));
      hn::Mask<DU> ok;
      if (mul) {
        ok = hn::Lt(hn::BitCast(du, g), inf);
      } else {  // div_fast: s in [2^-60, 2^60] and amax <= s·2^60
        const auto in_range = hn::Not(hn::Gt(hn::Sub(hn::BitCast(du, sv), hn::Set(du, 0x21800000u)),
                                             hn::Set(du, 0x5D800000u - 0x21800000u)));
        ok = hn::And(in_range, hn::RebindMask(du, hn::Le(am0, hn::Mul(sv, hn::Set(df, 0x1p60f)))));
      }
      const auto fast = hn::And(finite, ok);
      all_fast = all_fast && hn::AllTrue(du, hn::Or(fast, hn::Not(hn::FirstN(du, m))));
      // 2: also clamp-free (quant_cpu.cc's FastGroups): the group's largest quotient (the op on amax, monotone in
      // |y|) is <= fp8-max, or < 464 with fp8-max 448 (the cast rounds (448, 464) to 448 itself)
      const auto top = mul ? hn::Mul(am0, g) : hn::Div(am0, sv);
      const auto free = qs.fp8_max == 448.0f ? hn::Lt(top, hn::Set(df, 464.0f)) : hn::Le(top, hn::Set(df, qs.fp8_max));
      uint8_t* of = m == N ? gfast + i : bf;
      float* orb = m == N ? grb + i : br;
      const auto code = hn::IfThenElse(hn::RebindMask(du, free), hn::Set(du, 2u), hn::Set(du, 1u));
      hn::StoreU(hn::U8FromU32(hn::IfThenElseZero(fast, code)), d8, of);
      hn::StoreU(mul ? hn::Zero(df) : hn::IfThenElseZero(hn::RebindMask(df, fast), hn::Div(one, sv)), df, orb);
      if (m < N) {
        std::memcpy(gfast + i, bf, m);
        std::memcpy(grb + i, br, m * 4);
      }
    }
    if (m < N) {
      std::memcpy(scales + i, bs, m * 4);
      std::memcpy(gsv + i, bg, m * 4);
    }
  }
  return all_fast;
}

// cpu::bf16_split_failures on this target (AVX2 only: the splits are AVX2's; elsewhere -1).
int64_t Bf16SplitFailures(uint64_t i0, uint64_t i1, bool product, int64_t* checked) {
  *checked = 0;
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  int64_t bad = 0, seen = 0;
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 lo = _mm256_set1_ps(0x1p-126f), hi = _mm256_set1_ps(0x1p111f), zero = _mm256_setzero_ps();
  for (uint64_t i = i0; i < i1; i += 8) {
    const __m256i iv = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), lane);
    __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<uint64_t>(i1 - i, 8))), lane));
    __m256 got, in;
    if (!product) {
      in = _mm256_castsi256_ps(iv);
      got = SplitBf16Avx2(in);
    } else {  // a1 = bf16 word i >> 16, w = bf16 word i & 0xFFFF
      const __m256 a1 = _mm256_castsi256_ps(_mm256_and_si256(iv, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
      const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(iv, 16));
      in = _mm256_mul_ps(a1, w);
      got = SplitBf16Avx2(in);  // NormStep16's mode 1: RN(a1·w) first (an underflow keeps its sign: −0 stays −0)
      // finite a1 and w
      valid = _mm256_and_ps(valid, _mm256_cmp_ps(_mm256_and_ps(a1, absm), _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
      valid = _mm256_and_ps(valid, _mm256_cmp_ps(_mm256_and_ps(w, absm), _mm256_set1_ps(INFINITY), _CMP_LT_OQ));
    }
    // the range: ±0 or 2^-126 <= |in| < 2^111, bit-equal to the integer RNE; below it (subnormal in) the flush
    // argument's premise: got has in's sign and 0 < |got| <= 2^-126
    const __m256 ai = _mm256_and_ps(in, absm);
    const __m256 sub = _mm256_and_ps(_mm256_cmp_ps(ai, zero, _CMP_GT_OQ), _mm256_cmp_ps(ai, lo, _CMP_LT_OQ));
    const __m256 inr = _mm256_or_ps(_mm256_cmp_ps(in, zero, _CMP_EQ_OQ),
                                    _mm256_and_ps(_mm256_cmp_ps(ai, lo, _CMP_GE_OQ), _mm256_cmp_ps(ai, hi, _CMP_LT_OQ)));
    valid = _mm256_and_ps(valid, _mm256_or_ps(inr, sub));
    const __m256i want = RoundBf16NoNanAvx2(_mm256_castps_si256(in));
    const __m256 ag = _mm256_and_ps(got, absm);
    const __m256 sub_ok = _mm256_and_ps(
        _mm256_and_ps(_mm256_cmp_ps(ag, zero, _CMP_GT_OQ), _mm256_cmp_ps(ag, lo, _CMP_LE_OQ)),
        _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_srli_epi32(_mm256_castps_si256(got), 31),
                                               _mm256_srli_epi32(_mm256_castps_si256(in), 31))));
    const __m256 eq = _mm256_castsi256_ps(_mm256_cmpeq_epi32(want, _mm256_castps_si256(got)));
    const __m256 diff = _mm256_andnot_ps(_mm256_blendv_ps(eq, sub_ok, sub), _mm256_castsi256_ps(_mm256_set1_epi32(-1)));
    seen += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(valid)));
    bad += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_and_ps(valid, diff))));
  }
  *checked = seen;
  return bad;
#else
  (void)i0;
  (void)i1;
  (void)product;
  return -1;
#endif
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <limits>

#include "fp8ref/error.h"

namespace fp8ref {
namespace cpu {

HWY_EXPORT(LoadRowBf16);
HWY_EXPORT(SumSquaresF64);
HWY_EXPORT(CubPartials);
HWY_EXPORT(CubPartialsBf16Zmin);
HWY_EXPORT(CubFullWarps);
HWY_EXPORT(NormWeightBf16);
HWY_EXPORT(NormWeightBf16Fast);
HWY_EXPORT(NormWeightF32);
HWY_EXPORT(RowAmax);
HWY_EXPORT(RowQuant);
HWY_EXPORT(RowGroupScales);
HWY_EXPORT(RowQuantFast);
HWY_EXPORT(NormQuantBf16);
HWY_EXPORT(Bf16SplitFailures);

int64_t bf16_split_failures(uint64_t i0, uint64_t i1, bool product, int64_t* checked) {
  int64_t c = 0;
  const int64_t bad = HWY_DYNAMIC_DISPATCH(Bf16SplitFailures)(i0, i1, product, &c);
  if (checked) *checked = c;
  return bad;
}

namespace {

using namespace rmsnorm_cpu_detail;

float round_to(Format dt, float v) {
  if (dt == Format::f32) return v;
  return f32_of(static_cast<uint32_t>(ref::narrow(dt, ref::narrow(Format::f32, bits_of(v), dt), Format::f32)));
}

// The quant specs the vectorised group quant handles (see the top of the file).
bool fast_quant(const QuantSpec& q) {
  return q.scale_dtype == ScaleDtype::f32 && q.scale_round == ScaleRound::rne && q.div == Division::ieee &&
         q.scale_layout == ScaleLayout::row_major &&
         (q.scale_formula == ScaleFormula::div || q.scale_formula == ScaleFormula::mul_rcp) &&
         (q.formula == QuantFormula::div || q.formula == QuantFormula::mul_rcp) &&
         (q.granularity.kind == GranularityKind::group || q.granularity.kind == GranularityKind::row);
}

// Step 2 `exact`: the verified f64 sum, else the reference's superaccumulator.
// z: the f32 row, the bf16 row itself or the sums of two (ZRow); pre >= 0: their Σ z² (f64, any order) computed
// already; f32_row() gives the f32 row for the reference's fallback.
template <typename F32Row>
float mean_square_exact(ZRow z, int64_t n, F32Row f32_row, double pre) {
  const double s = pre >= 0 ? pre : HWY_DYNAMIC_DISPATCH(SumSquaresF64)(z, static_cast<size_t>(n));
  if (!std::isfinite(s)) return ref::mean_square_exact(f32_row(), n);
  if (s == 0) return 0.0f;  // non-negative terms: every z is ±0
  const double q = s / static_cast<double>(n);
  const double d = static_cast<double>(n + 4) * 0x1p-52;
  const double lo = q * (1 - d), hi = q * (1 + d);
  const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);  // RNE, monotone
  if (bits_of(flo) == bits_of(fhi)) return flo;
  return ref::mean_square_exact(f32_row(), n);
}

// zmin1: where not null and z is a bf16 row whose partials are computed here, the row's min((|x| − 1) mod 2^16)
// (CubPartialsBf16Zmin; 0x10000: not taken).
float mean_square_cub(ZRow z, int64_t n, int threads, float* part, float* lane0, bool parts_done,
                      uint32_t* zmin1 = nullptr) {
  if (zmin1 && !parts_done && z.kind == 1)
    *zmin1 = HWY_DYNAMIC_DISPATCH(CubPartialsBf16Zmin)(static_cast<const uint16_t*>(z.p), static_cast<size_t>(n / 4),
                                                       static_cast<size_t>(threads), part);
  else if (!parts_done)  // (else part[] holds them already)
    HWY_DYNAMIC_DISPATCH(CubPartials)(z, static_cast<size_t>(n / 4), static_cast<size_t>(threads), part);
  // The partials are sums of squares: >= 0, +Inf or NaN. A NaN reaches warp 0's lane 0 through the trees and the
  // block sum, so the reference's result is then the canonical NaN; without one, no sum of the trees can be NaN
  // (no -Inf), so they run without the NaN canonicalisation. Full warps' trees in lanes (CubFullWarps), the rest
  // (and every warp on targets without it) here.
  bool any_nan = false;
  const int done = static_cast<int>(HWY_DYNAMIC_DISPATCH(CubFullWarps)(part, static_cast<size_t>(threads), lane0, &any_nan));
  if (done == 0)
    for (int t = 0; t < threads; ++t) any_nan |= std::isnan(part[t]);
  if (any_nan) return f32_of(kNan);
  float block = 0.0f;
  for (int w = 0; w * 32 < threads; ++w) {
    float l0;
    if (w < done) {
      l0 = lane0[w];
    } else {
      const int valid = threads - w * 32 < 32 ? threads - w * 32 : 32;
      float* lane = part + w * 32;
      for (int o = 1; o < 32; o *= 2)
        for (int l = 0; l + o < valid; ++l) lane[l] = lane[l] + lane[l + o];
      l0 = lane[0];
    }
    block = w == 0 ? l0 : block + l0;
  }
  return gpu(block / static_cast<float>(n));
}

// A thread's row and weight buffers for one rmsnorm_quant call, 64-byte aligned (every vector access within one cache
// line), kept by the thread between calls up to kArenaKeep bytes. Allocated and freed per call (~190 KB per thread
// at K = 7168), glibc gave the heap's top back to the OS each time (brk) and the next call faulted it in again: Zen 4,
// vllm-rmsnorm-quant [1, 7168] on one thread, median 0.047 -> 0.004 ms, [64, 7168] on two 0.125 -> 0.067 ms (with
// make_plan in lanes; bench/RESULTS.md, session 22).
struct RowArena {
  hwy::AlignedFreeUniquePtr<uint8_t[]> mem;
  size_t cap = 0;
  uint8_t* take(size_t bytes) {
    if (bytes > cap) {
      mem = hwy::AllocateAligned<uint8_t>(bytes);
      cap = bytes;
    }
    return mem.get();
  }
};
constexpr size_t kArenaKeep = size_t{4} << 20;
thread_local RowArena t_arena;
}  // namespace

bool rmsnorm_quant_has_avx512bf16() { return avx512bf16_kernels() && simd_target_is_avx512(); }

// d = RN64(1/RN64(sqrt(u))) is within 2^-52 relative of 1/sqrt(u) (two correctly rounded steps, each within 2^-53),
// i.e. within 2 of d's f64 ulps (3 across a binade's edge). 1/sqrt(u) is f32-normal and never an f32 midpoint
// (ref::rsqrt_rn), so unless d lies within 8 ulps of a midpoint — its 29 bits below an f32 significand within 8 of
// 2^28 — the exact value and d are on the same side of every midpoint and round to the same f32 as d. Else, and for
// the special inputs, the reference's exact comparisons (~500 cycles: about 5 % of an aiter-rmsnorm-quant row of 7168
// values in cache). tests/exhaustive_rsqrt.cc checks every positive f32 against ref::rsqrt_rn.
float rsqrt_rn(float u) {
  if (!(u > 0.0f) || !(u < INFINITY)) return ref::rsqrt_rn(u);
  const double d = 1.0 / std::sqrt(static_cast<double>(u));
  uint64_t b;
  std::memcpy(&b, &d, 8);
  if ((b & 0x1FFFFFFFu) - (uint64_t{1} << 28) + 8 <= 16) return ref::rsqrt_rn(u);
  return static_cast<float>(d);
}

void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& a) {
  rmsnorm_quant(spec, a, RmsNormPath::automatic);
}

void rmsnorm_quant(const RmsNormQuantSpec& spec, const RmsNormQuantArgs& a, RmsNormPath path) {
  require_finalized(spec.quant, "rmsnorm_quant");
  const RmsNormLayout L = rmsnorm_layout(spec, a.from, a.shape, a.weight_shape, a.residual ? &a.shape : nullptr);
  const int64_t M = L.M, K = L.K;
  const QuantSpec& qs = spec.quant;
  const bool fast = fast_quant(qs) && !a.exact_q && K > 0;
  // Quant specs off the fused path (exact formulas, div=triton-nv, bf16/f16/ue8m0 scales, ...) with row-local scales
  // (group, row): each row quantized right after its normalisation, from cache, by the CPU backend's group quant
  // on [1, K] (its scales are the logical row-major ones, so a row's are contiguous). deepseek-rmsnorm bf16
  // [4096, 7168], 2 threads: 59.7–60.4 -> 14.3–14.4 ms (the whole f32 y went through memory before; session 37). bf16
  // rows there take the fused path's z reads and NormWeightBf16Fast too (y not exported: its NaN bits never reach a code,
  // the quotient's NaN is canonical). The quant is a per-thread cpu::RowQuantizer (its context built once, no
  // OpenMP region or allocation per row) given the norm pass's group maxima where no group holds a NaN (no amax pass):
  // 14.04–14.11 -> 11.93–11.95 ms, + residual 17.6–17.7 -> 14.2 ms, exact 24.8–24.9 -> 20.7 ms (session 38).
  const GranularityKind gk = qs.granularity.kind;
  const bool row_quant = !fast && !a.exact_q && K > 0 &&
                         (gk == GranularityKind::group || gk == GranularityKind::row);
  const size_t scale_row_bytes =
      static_cast<size_t>(L.quant.n_scales / (M > 0 ? M : 1)) * static_cast<size_t>(format_info(scale_storage(qs)).bits / 8);
  // The normed rows are kept whole only when the reference quant runs after the loop (or they are asked for).
  std::vector<float> all_y;
  if (!fast && !row_quant && !a.normed) all_y.resize(static_cast<size_t>(M * K));
  float* y_out = a.normed ? a.normed : all_y.data();
  const int64_t G = qs.granularity.kind == GranularityKind::row ? (K > 0 ? K : 1) : qs.granularity.bk;
  const int64_t ngroups = L.quant.n_scales / (M > 0 ? M : 1);
  const float max = qs.fp8_max;
  const float rcp_max = gpu(1.0f / max);
  const size_t esz = a.from == Format::f32 ? 4 : 2;
  // The cast in lanes (RowQuant): an RNE cast to e4m3fn of values a NaN-replacing clamp leaves in [-448, 448].
  // residual_out overlapping x or the residual (e.g. updated in place, as vLLM's fused_add_rms_norm does)
  auto overlaps = [&](const void* p) {
    const auto b = reinterpret_cast<uintptr_t>(p), o = reinterpret_cast<uintptr_t>(a.residual_out);
    const uintptr_t n = static_cast<uintptr_t>(M * K) * esz;
    return p && o && n > 0 && b < o + n && o < b + n;
  };
  const bool out_overlaps = a.residual && (overlaps(a.x) || overlaps(a.residual));
  // residual_out of 16 MiB or more goes out by non-temporal stores (LoadRowBf16)
  const bool stream_out = a.residual_out && static_cast<size_t>(M * K) * esz >= (size_t{16} << 20);
  // the codes likewise on the AVX-512 BF16 passes
  const bool stream_q = static_cast<size_t>(M * K) >= (size_t{16} << 20);
  const bool cast_in_lanes = fast && qs.to == Format::e4m3fn && qs.cast.rounding == Rounding::rne &&
                             (qs.clamp == Clamp::nan_to_max || qs.clamp == Clamp::nan_to_min) && max > 0.0f &&
                             max <= 448.0f;
  // The AVX-512 BF16 passes (rmsnorm_quant_avx512.h) for bf16 rows whose y is rounded to bf16; z from x, from x +
  // residual in f32 (the ZSum rows below) or from the f32 row (residual-sum=dtype, in-place residual_out).
  const bool zfast_call = a.from == Format::bf16 && fast && !a.normed &&
                          (spec.variance == Variance::exact || spec.variance == Variance::cub);
  const rq512::ZKind zkind = zfast_call && !a.residual                                    ? rq512::ZKind::bf16
                             : zfast_call && spec.residual_sum != ResidualSum::dtype && !out_overlaps ? rq512::ZKind::sum_f32
                                                                                           : rq512::ZKind::f32;
  const bool use512 = path == RmsNormPath::automatic && a.from == Format::bf16 && fast && !a.normed && cast_in_lanes &&
                      (spec.weight == NormWeight::dtype_twice || spec.weight == NormWeight::dtype_once) && K % 64 == 0 &&
                      G % 64 == 0 && K % G == 0 && rmsnorm_quant_has_avx512bf16();
  // The smallest scale the quant spec's guard lets through (0: no guard), halved as a margin for RN(floor / max): with
  // it the passes need no row guard (rq512::Plan::flush_ok), and vLLM's rows skip the smallest-|x| scan in the cub
  // pass (min-scale 1/(448·512)). (The passes run fast_quant specs only: f32 scales, x/s or x*(1/s), IEEE division.)
  double guard_s_min = 0;
  if (qs.min_scale && *qs.min_scale > 0.0f) guard_s_min = static_cast<double>(*qs.min_scale) / 2;
  if (qs.amax_floor && *qs.amax_floor > 0.0f)
    guard_s_min = std::max(guard_s_min, static_cast<double>(*qs.amax_floor) / static_cast<double>(max) / 2);
  if (!std::isfinite(guard_s_min)) guard_s_min = 0;
  // The split on row_quant's rows (element-ordered y) needs more than guard_s_min: every formula there reads the
  // guarded amax only if the guard is an amax floor (x*(max/amax) reads amax itself), a value below 2^-126 must cast
  // to ±0 for every scale >= 2^-60 (|y/s| <= 2^-15: under half the smallest e4m3fn/e4m3fnuz subnormal, not e5m2's),
  // and the stored scale must keep its range (not f16).
  const bool row_split_ok = row_quant && qs.amax_floor && static_cast<double>(*qs.amax_floor) / max / 2 >= 0x1p-60 &&
                            (qs.to == Format::e4m3fn || qs.to == Format::e4m3fnuz) && qs.scale_dtype != ScaleDtype::f16;
  // and their weight=f32 form (y unrounded: aiter-rmsnorm-quant) for bf16 rows without a residual, x*(1/s)
  const bool use512w = path == RmsNormPath::automatic && fast && !a.normed && cast_in_lanes &&
                       spec.weight == NormWeight::f32 && zkind == rq512::ZKind::bf16 &&
                       qs.formula == QuantFormula::mul_rcp && K % 64 == 0 && G % 64 == 0 && K % G == 0 &&
                       rmsnorm_quant_has_avx512bf16();
  // Threads: at most one per row (the unit of work). A one-row call (a decode step of batch 1) runs on the caller's
  // thread — no team to wake: Zen 4, [1, 7168], 2 threads, OMP_WAIT_POLICY=passive 0.03 -> 0.01 ms. (A limit by
  // values as quant_cpu.cc's kParallelMin helped under the passive policy, [8, 7168] 3.0 -> 8.0 GB/s, but halved the
  // default policy's spinning team's 11.7 GB/s: bench/RESULTS.md, session 22.)
  const int64_t team = std::min<int64_t>(static_cast<int64_t>(omp_get_max_threads()), M);

#pragma omp parallel num_threads(static_cast<int>(team > 1 ? team : 1))
  {
    // rows and widened weights 64-byte aligned (hwy::AllocateAligned): every vector access within one cache line
    // (std::vector's 16-byte alignment split every 64-byte load of wf across two lines)
    const size_t Ka = static_cast<size_t>(K > 0 ? K : 1), Kp = (Ka + 15) / 16 * 16;
    // (carved from the thread's arena: z, ybuf, v, wf, wfp, w512 K floats each, y512 and zb K words each)
    RowArena local;
    const size_t arena_bytes = 6 * Kp * 4 + 2 * Kp * 2;
    uint8_t* arena = (arena_bytes <= kArenaKeep ? t_arena : local).take(arena_bytes);
    auto slice = [&](int i) { return reinterpret_cast<float*>(arena) + static_cast<size_t>(i) * Kp; };
    float *const z = slice(0), *const ybuf = slice(1), *const v = slice(2);
    uint16_t* const zb = reinterpret_cast<uint16_t*>(slice(6)) + Kp;
    std::vector<float> part(static_cast<size_t>(L.cub_threads > 0 ? L.cub_threads : 1)), lane0(part.size() / 32 + 1);
    std::vector<float> gamax(static_cast<size_t>(ngroups > 0 ? ngroups : 1)), gsv(gamax.size());
    std::vector<uint8_t> gnan(gamax.size()), gfast(gamax.size());
    std::vector<float> grb(gamax.size());
    // row_quant: the thread's row quantizer (its context built once) and the group maxima it is given
    std::unique_ptr<RowQuantizer> rowq(row_quant ? new RowQuantizer(qs, K) : nullptr);
    std::vector<uint32_t> gbits(gamax.size());
    float *wf = nullptr, *wfp = nullptr, *w512 = nullptr;
    bool w_split = false;  // the weights allow Veltkamp's split (NormWeightBf16Fast's conditions)
    uint16_t* y512 = nullptr;
    rq512::Plan plan;
    if (a.from != Format::bf16 || fast || row_quant) {  // weights widened once per thread (bf16: for the fast path)
      wf = slice(3);
      if (a.from == Format::bf16)  // (bf16 widened in lanes: LoadRowBf16 without a residual)
        HWY_DYNAMIC_DISPATCH(LoadRowBf16)(static_cast<const uint16_t*>(a.weight), nullptr, static_cast<size_t>(K), false,
                                          wf, nullptr, nullptr, false, nullptr, 0, nullptr);
      // (and permuted for NormWeightBf16Avx2 where the row's quant is RowQuantFast: 16-blocks as 0–3, 8–11, 4–7, 12–15)
      if (a.from == Format::bf16 && (cast_in_lanes || row_quant) && K % 16 == 0) {
        wfp = slice(4);
        for (int64_t k = 0; k < K; k += 16)
          for (int64_t i = 0; i < 4; ++i) {
            wfp[k + i] = wf[k + i];
            wfp[k + 4 + i] = wf[k + 8 + i];
            wfp[k + 8 + i] = wf[k + 4 + i];
            wfp[k + 12 + i] = wf[k + 12 + i];
          }
        const bool w_small = std::all_of(wf, wf + K, [](float v) { return std::fabs(v) <= 0x1p50f; });
        w_split = path == RmsNormPath::automatic && w_small && guard_s_min >= 0x1p-60 &&
                  spec.weight != NormWeight::f32 && (cast_in_lanes || row_split_ok);
      }
      if (use512 || use512w) {
        w512 = slice(5);
        y512 = reinterpret_cast<uint16_t*>(slice(6));  // (mode 0: the weights' sign bytes)
        rq512::make_plan(use512w ? 0 : spec.weight == NormWeight::dtype_twice ? 1 : 2, zkind, wf, static_cast<size_t>(K),
                         w512, &plan, reinterpret_cast<uint8_t*>(y512));
        plan.flush_ok = use512 && rq512::flush_subnormal_harmless(plan, guard_s_min);
      }
      for (int64_t k = 0; k < K && a.from != Format::bf16; ++k) {
        if (a.from == Format::f32) {
          std::memcpy(&wf[k], static_cast<const uint8_t*>(a.weight) + 4 * k, 4);
        } else if (a.from == Format::bf16) {
          uint16_t h;
          std::memcpy(&h, static_cast<const uint8_t*>(a.weight) + 2 * k, 2);
          wf[k] = f32_of(static_cast<uint32_t>(h) << 16);
        } else {
          uint16_t h;
          std::memcpy(&h, static_cast<const uint8_t*>(a.weight) + 2 * k, 2);
          wf[k] = f32_of(static_cast<uint32_t>(ref::narrow(Format::f16, h, Format::f32)));
        }
      }
    }
    // The AVX-512 BF16 quant pass of a row runs in the next row of the thread, after that row's variance: the line of
    // the rsqrt table (cuda-rsqrtf: a 16 MiB table, a cache miss per row) asked for meanwhile, so the rsqrt no longer
    // waits on memory with nothing else to do. y512, gsv and grb hold the pending row until then.
    struct Pending {
      bool on = false, div = false;
      uint8_t* q = nullptr;
    } pend;
    // The codes' non-temporal stores are fenced once, after this thread's last row (before the region's barrier):
    // within the thread no later store shares a line with them (LineStream writes a row's partial end lines by
    // ordinary masked stores). A fence per row waits for that row's write-combining buffers to drain each time: 2T
    // best 4.58–4.75 vs 4.71–4.78 ms, alternated four times (bench/RESULTS.md, session 20).
    bool nt_open = false;  // this thread streamed codes not fenced yet
    // the pending quant pass; last: after this thread's last row; pf_x, pf_r: the next row's inputs (the pass
    // prefetches their first halves)
    auto flush = [&](bool last, const uint16_t* pf_x, const uint16_t* pf_r) {
      if (pend.on) {
        rq512::quant_pass(plan, y512, static_cast<size_t>(K), static_cast<size_t>(G), gsv.data(), grb.data(),
                          pend.div, max, pend.q, stream_q, pf_x, pf_r);
        nt_open = nt_open || stream_q;
        pend.on = false;
      }
      if (last && nt_open) {  // this thread's last row
        rq512::fence();
        nt_open = false;
      }
    };
#pragma omp for schedule(static) nowait
    for (int64_t m = 0; m < M; ++m) {
      const size_t off = static_cast<size_t>(m * K);
      const uint8_t* xr = static_cast<const uint8_t*>(a.x) + off * esz;
      const uint8_t* rr = a.residual ? static_cast<const uint8_t*>(a.residual) + off * esz : nullptr;
      uint8_t* ro = a.residual && a.residual_out ? static_cast<uint8_t*>(a.residual_out) + off * esz : nullptr;
      const bool dtype_sum = spec.residual_sum == ResidualSum::dtype;
      // 1. the residual sum. bf16 rows on the fast quant with variance exact or cub write no f32 row: without a
      // residual z is the widened x, read in registers from x itself (ZBf16); with one whose sum stays f32 it is
      // recomputed from x and the residual (ZSum) — unless residual_out overlaps them (in place: the passes after
      // this one would read the updated residual). The f32 row only if a rarer path needs it (z_row()).
      const bool zfast = a.from == Format::bf16 && (fast || row_quant) && !a.normed &&
                         (spec.variance == Variance::exact || spec.variance == Variance::cub);
      const bool zbf16 = zfast && !rr;
      const bool zsum = zfast && rr && !dtype_sum && !out_overlaps;
      // with a residual summed in bf16 (vLLM's fused_add_rms_norm) z is bf16-valued: its bits in the bf16 row zb
      // (residual_out's values; the AVX-512 BF16 passes keep their f32 row)
      const bool zrnd = zfast && rr && dtype_sum && !use512;
      bool have_z = !zbf16 && !zsum && !zrnd;  // (every other path writes z below)
      double sumsq = -1.0;            // Σ z² when the residual pass computed it (variance=exact)
      bool parts_done = false;        // the cub partials, when the residual pass computed them
      auto z_row = [&]() {
        if (!have_z && zrnd)
          HWY_DYNAMIC_DISPATCH(LoadRowBf16)(zb, nullptr, static_cast<size_t>(K), false, z, nullptr, nullptr, false,
                                            nullptr, 0, nullptr);
        else if (!have_z)
          HWY_DYNAMIC_DISPATCH(LoadRowBf16)(reinterpret_cast<const uint16_t*>(xr), reinterpret_cast<const uint16_t*>(rr),
                                            static_cast<size_t>(K), false, z, nullptr, nullptr, false, nullptr, 0,
                                            nullptr);
        have_z = true;
        return z;
      };
      const ZRow zp = zbf16  ? ZRow{xr, nullptr, 1}
                      : zsum ? ZRow{xr, reinterpret_cast<const uint16_t*>(rr), 2}
                      : zrnd ? ZRow{zb, nullptr, 1}
                             : ZRow{z, nullptr, 0};
      if (zbf16) {
        // (nothing to write)
      } else if (zsum || zrnd) {  // residual_out (zrnd: and zb), and Σ z² or the cub partials on the way
        const bool cub_here = spec.variance == Variance::cub && L.cub_threads % 16 == 0 && K % 64 == 0;
        if (ro || zrnd || spec.variance == Variance::exact || cub_here)
          parts_done = HWY_DYNAMIC_DISPATCH(LoadRowBf16)(
                           reinterpret_cast<const uint16_t*>(xr), reinterpret_cast<const uint16_t*>(rr),
                           static_cast<size_t>(K), zrnd, nullptr, reinterpret_cast<uint16_t*>(ro),
                           spec.variance == Variance::exact ? &sumsq : nullptr, stream_out, cub_here ? part.data() : nullptr,
                           static_cast<size_t>(L.cub_threads), zrnd ? zb : nullptr) &&
                       cub_here;
      } else if (a.from == Format::bf16) {
        HWY_DYNAMIC_DISPATCH(LoadRowBf16)(reinterpret_cast<const uint16_t*>(xr), reinterpret_cast<const uint16_t*>(rr),
                                          static_cast<size_t>(K), dtype_sum, z, reinterpret_cast<uint16_t*>(ro), nullptr,
                                          stream_out, nullptr, 0, nullptr);
      } else {
        for (int64_t k = 0; k < K; ++k) {
          auto ld = [&](const uint8_t* p) {
            if (a.from == Format::f32) {
              float f;
              std::memcpy(&f, p + 4 * k, 4);
              return f;
            }
            uint16_t h;
            std::memcpy(&h, p + 2 * k, 2);
            return f32_of(static_cast<uint32_t>(ref::narrow(Format::f16, h, Format::f32)));
          };
          float zv = ld(xr);
          if (rr) {
            zv = gpu(zv + ld(rr));
            if (dtype_sum) zv = round_to(a.from, zv);
            if (ro) {
              if (a.from == Format::f32) {
                std::memcpy(ro + 4 * k, &zv, 4);
              } else {
                const uint16_t h = static_cast<uint16_t>(ref::narrow(Format::f32, bits_of(zv), Format::f16));
                std::memcpy(ro + 2 * k, &h, 2);
              }
            }
          }
          z[k] = zv;
        }
      }
      if (K == 0) continue;
      // 2. the mean of squares
      float var = 0;
      uint32_t zmin1 = 0x10000;  // (mean_square_cub's, for the AVX-512 BF16 passes' guard; 0x10000: not taken)
      switch (spec.variance) {
        case Variance::exact: var = mean_square_exact(zp, K, z_row, sumsq); break;
        case Variance::f32_seq: {
          float acc = 0.0f;
          for (int64_t k = 0; k < K; ++k) acc = gpu(std::fma(z[k], z[k], acc));
          var = gpu(acc / static_cast<float>(K));
          break;
        }
        case Variance::cub:
          var = mean_square_cub(zp, K, L.cub_threads, part.data(), lane0.data(), parts_done,
                                use512 && !plan.flush_ok ? &zmin1 : nullptr);
          break;
      }
      // 3.–4.
      const float u = gpu(var + spec.eps);
      if (spec.rsqrt == Rsqrt::cuda) ref::rsqrt_cuda_prefetch(u);
      // The next row of this thread's static share, prefetched into L2 by the bf16 fast passes: its first half by the
      // pending quant pass, its second by this row's norm pass, one line per 64 values each — the reads spread over
      // both passes. (Session 17 had moved the prefetch, then of the next row into L1, to the quant pass and the row
      // after next into L2: 4.94 -> 4.66 ms, + residual 9.70 -> 8.28 ms — in the quant pass the requests came in
      // bursts, and the memory sat idle through the cub and norm passes before it; all in the norm pass,
      // vllm-rmsnorm-quant 2T best 5.75–5.82 -> 5.30–5.39 ms on session 24's Xeon. Session 28, that Xeon's kind, the
      // next row instead of the one after: 5.54–6.13 vs 5.87–6.24 ms. Session 29, split between the passes: 2T
      // 5.12–5.22 vs 5.26–5.55 ms, four alternations; bench/RESULTS.md.)
      const bool pf1 = m + 1 < M;
      const auto* pf_x = pf1 ? reinterpret_cast<const uint16_t*>(xr + K * esz) : nullptr;
      const auto* pf_r = pf1 && rr ? reinterpret_cast<const uint16_t*>(rr + K * esz) : nullptr;
      flush(false, pf_x, pf_r);
      const float r = spec.rsqrt == Rsqrt::rn     ? cpu::rsqrt_rn(u)
                      : spec.rsqrt == Rsqrt::cuda ? ref::rsqrt_cuda(u)
                                                  : gpu(1.0f / gpu(std::sqrt(u)));
      if (a.rms) a.rms[m] = r;
      // 5.–6. (and, for bf16 rows, the groups' amax)
      float* y = (fast || row_quant) && !a.normed ? ybuf : y_out + off;
      const bool bf16_fast = a.from == Format::bf16 && (fast || row_quant) && !a.normed && !std::isnan(var) && !std::isnan(r);
      // (the same next row for the Highway bf16 paths, which prefetch it and look ahead into it)
      const auto* next_x = a.from == Format::bf16 ? pf_x : nullptr;
      const auto* next_r = a.from == Format::bf16 ? pf_r : nullptr;
      // steps 5–9 as the AVX-512 BF16 passes (false: a row they decline; it goes on below)
      // weight=f32: the group maxima of y, the scales, then the codes from x again (rmsnorm_quant_avx512.h amax_pass)
      if (bf16_fast && use512w &&
          rq512::amax_pass(plan, reinterpret_cast<const uint16_t*>(xr), static_cast<size_t>(K), static_cast<size_t>(G), r,
                           gamax.data(), pf_x)) {
        float* scales = static_cast<float*>(a.scales) + m * ngroups;
        if (HWY_DYNAMIC_DISPATCH(RowGroupScales)(qs, rcp_max, true, true, gamax.data(), nullptr,
                                                 static_cast<size_t>(ngroups), scales, gsv.data(), gfast.data(),
                                                 grb.data())) {
          rq512::wquant_pass(plan, reinterpret_cast<const uint16_t*>(xr), static_cast<size_t>(K), static_cast<size_t>(G),
                             r, gsv.data(), max, a.q + off, stream_q, pf_x);
          nt_open = nt_open || stream_q;
          continue;
        }
      }
      if (bf16_fast && use512 &&
          rq512::norm_pass(plan, reinterpret_cast<const uint16_t*>(xr), reinterpret_cast<const uint16_t*>(rr), z,
                           static_cast<size_t>(K), static_cast<size_t>(G), r, y512, gamax.data(), zmin1, pf_x, pf_r)) {
        float* scales = static_cast<float*>(a.scales) + m * ngroups;
        const bool mul = qs.formula == QuantFormula::mul_rcp;
        if (HWY_DYNAMIC_DISPATCH(RowGroupScales)(qs, rcp_max, mul, true, gamax.data(), nullptr,
                                                 static_cast<size_t>(ngroups), scales, gsv.data(), gfast.data(),
                                                 grb.data())) {
          pend = {true, !mul, a.q + off};  // the quant pass: in the next row, or after the loop (flush)
          continue;
        }
      }
      // steps 5–9 fused per group in registers (the cast in lanes; false: G or K does not fit it)
      if (bf16_fast && cast_in_lanes &&
          HWY_DYNAMIC_DISPATCH(NormQuantBf16)(zp, wf, static_cast<size_t>(K), r, spec.weight,
                                              static_cast<size_t>(G), qs, rcp_max, ybuf,
                                              static_cast<float*>(a.scales) + m * ngroups, a.q + off, next_x, next_r))
        continue;
      bool permuted = false;  // y in NormWeightBf16Avx2's order (RowQuantFast puts the codes in order)
      if (bf16_fast) {
        const bool split_ok = w_split && std::isfinite(var) && std::isfinite(r);
        permuted = HWY_DYNAMIC_DISPATCH(NormWeightBf16Fast)(zp, wf, wfp, split_ok,
                                                            static_cast<size_t>(K), r, spec.weight, y,
                                                            static_cast<size_t>(G), gamax.data(), gnan.data(), next_x,
                                                            next_r, row_quant);
      } else if (a.from == Format::bf16) {
        HWY_DYNAMIC_DISPATCH(NormWeightBf16)(z_row(), static_cast<const uint16_t*>(a.weight), static_cast<size_t>(K), r,
                                             spec.weight, y, static_cast<size_t>(G), gamax.data(), gnan.data());
      } else if (a.from == Format::f32) {
        HWY_DYNAMIC_DISPATCH(NormWeightF32)(z, wf, static_cast<size_t>(K), r, y);
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const float an = gpu(z[k] * r);
          switch (spec.weight) {
            case NormWeight::f32: y[k] = gpu(an * wf[k]); break;
            case NormWeight::dtype_twice: y[k] = round_to(Format::f16, gpu(round_to(Format::f16, an) * wf[k])); break;
            case NormWeight::dtype_once: y[k] = round_to(Format::f16, gpu(an * wf[k])); break;
          }
        }
      }
      if (row_quant) {  // bf16 rows: the group maxima of the norm pass, when no group holds a NaN
        bool given = a.from == Format::bf16;
        for (int64_t g = 0; given && g < ngroups; ++g) given = gnan[static_cast<size_t>(g)] == 0;
        if (given) std::memcpy(gbits.data(), gamax.data(), gbits.size() * 4);
        rowq->row(y, a.q + off, static_cast<uint8_t*>(a.scales) + m * scale_row_bytes, given ? gbits.data() : nullptr);
        continue;
      }
      if (!fast) continue;
      // 7. the group quant (reference steps 2–9 of quant.h for the f32 kernels' specs)
      if (a.from != Format::bf16)
        HWY_DYNAMIC_DISPATCH(RowAmax)(y, static_cast<size_t>(K), static_cast<size_t>(G), gamax.data(), gnan.data());
      float* scales = static_cast<float*>(a.scales) + m * ngroups;
      const bool mul = qs.formula == QuantFormula::mul_rcp;
      HWY_DYNAMIC_DISPATCH(RowGroupScales)(qs, rcp_max, mul, cast_in_lanes, gamax.data(), gnan.data(),
                                           static_cast<size_t>(ngroups), scales, gsv.data(), gfast.data(), grb.data());
      if (cast_in_lanes) {
        HWY_DYNAMIC_DISPATCH(RowQuantFast)(y, static_cast<size_t>(K), static_cast<size_t>(G), gsv.data(), grb.data(),
                                           gfast.data(), mul, a.from != Format::f32 && spec.weight != NormWeight::f32,
                                           qs.clamp, max, a.q + off, permuted);
        continue;
      }
      HWY_DYNAMIC_DISPATCH(RowQuant)(y, static_cast<size_t>(K), static_cast<size_t>(G), gsv.data(), mul, qs.clamp, max,
                                     cast_in_lanes, v, a.q + off);
      if (!cast_in_lanes) encode_f32(v, a.q + off, static_cast<size_t>(K), qs.cast);
    }
    flush(true, nullptr, nullptr);  // this thread's last row (the region's end waits for every thread)
  }
  // Every other quant spec off row_quant: the CPU backend's group quant over the normed rows (src/cpu/quant_cpu.cc,
  // bit-identical to ref::quantize; it defers to the reference itself where it is not vectorised, e.g. for exact_q).
  if (!fast && !row_quant) quantize(qs, Format::f32, y_out, a.shape, a.q, a.scales, a.exact_q);
}

}  // namespace cpu
}  // namespace fp8ref
#endif  // HWY_ONCE

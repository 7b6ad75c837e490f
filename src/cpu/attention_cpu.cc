// fp8ref CPU backend — paged attention over an FP8 KV cache (contract: include/fp8ref/attention.h), bit-identical to
// reference/attention_ref.cc per convention.
//
// Work split: OpenMP (dynamic) over units = (sequence, chunk of up to 4 query positions); a unit holds every query
// head for those positions (R <= 4·Hq rows) and walks the sequence's keys tile by tile, each tile's KV heads in turn
// (NHD: one slot's heads are adjacent, so a tile reads whole pages in order); each K/V tile is dequantized once for
// the G = Hq/Hkv rows that read it. Tiles are 16 keys of the sequence, [16t, 16t + 16) (the online conventions'
// softmax tiles of T = AttnSpec::tile_keys() keys take T/16 of them), read
// through the page table key by key; nothing of the cache is copied beyond the tile being used. Per-thread scratch:
// K tile 16·Dk and V tile 16·Dv floats, row states R·Dv, and for the two-pass conventions (vllm-paged-v1,
// torch-sdpa-math, spyre) the logits of the unit's rows, R·seq_len floats.
//
// Orders (why this equals the reference): every dot product is computed for 16 keys at once, one key per lane, from
// a transposed K tile kT[d][16] — lane j runs fma(q_d, k_jd, acc) for d = 0, 1, ... exactly as ref's dot_f32. The
// P·V sums run along d in SIMD lanes (acc_d independent per lane), keys in increasing order, one fma each, as in
// ref. Maxima and the softmax denominators are scalar loops in ref's order. exp/exp2 are the same Sleef sequences
// in SIMD (MulAdd = fma; targets without native FMA take the scalar twin). bf16 rounding is integer RNE on the
// f32 bits; f16 roundings call ref::narrow per element (not a speed path).
// Decoding: each unit builds, per KV head, 256-entry code -> value tables for K and V by running DecodeRow (and the
// f16 rounding) over all 256 codes with that head's scale; tiles are then decoded by lookup (AVX-512: 128 magnitudes
// in registers, sign XORed in, when the table is sign-symmetric bit for bit; otherwise the 256-entry table). A scale
// that does not compare equal to itself (NaN) takes DecodeRow directly.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/attention_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "fp8ref/attention.h"
#include "cpu/attention_fast.h"
#include "cpu/fp8_lanes-inl.h"
#include "fp8ref/convert.h"
#include "fp8ref/mma.h"
#include "fp8ref/mufu_ex2.h"
#include "fp8ref/triton_div.h"

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;

#if HWY_NATIVE_FMA
constexpr bool kFma = true;
#else
constexpr bool kFma = false;  // MulAdd would be two roundings: use the scalar twins
#endif

HWY_INLINE VF Pow2i(DF df, hn::Vec<DI> e) {
  const DI di;
  return hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(e, hn::Set(di, 127))));
}

// ref::exp_sleef, lane-wise.
HWY_INLINE VF ExpSleef(DF df, VF x) {
  const DI di;
  const VF magic = hn::Set(df, 12582912.0f);
  const VF xc = hn::Min(hn::Max(x, hn::Set(df, -105.0f)), hn::Set(df, 101.0f));
  const VF t = hn::Mul(xc, hn::Set(df, 1.44269504088896340736f));
  const VF qf = hn::Sub(hn::Add(t, magic), magic);
  VF s = hn::MulAdd(qf, hn::Set(df, -0.693145751953125f), xc);
  s = hn::MulAdd(qf, hn::Set(df, -1.428606765330187045e-06f), s);
  VF u = hn::Set(df, 0.000198527617612853646278381f);
  u = hn::MulAdd(u, s, hn::Set(df, 0.00139304355252534151077271f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.00833336077630519866943359f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.0416664853692054748535156f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.166666671633720397949219f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.5f));
  u = hn::Add(hn::Set(df, 1.0f), hn::MulAdd(hn::Mul(s, s), u, s));
  const auto q = hn::ConvertTo(di, qf);
  const auto h = hn::ShiftRight<1>(q);
  VF r = hn::Mul(hn::Mul(u, Pow2i(df, h)), Pow2i(df, hn::Sub(q, h)));
  r = hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -104.0f)), r);
  r = hn::IfThenElse(hn::Gt(x, hn::Set(df, 100.0f)), hn::Set(df, HUGE_VALF), r);
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}

// ref::exp2_sleef, lane-wise.
HWY_INLINE VF Exp2Sleef(DF df, VF x) {
  const DI di;
  const VF magic = hn::Set(df, 12582912.0f);
  const VF xc = hn::Min(hn::Max(x, hn::Set(df, -151.0f)), hn::Set(df, 129.0f));
  const VF uf = hn::Sub(hn::Add(xc, magic), magic);
  const VF s = hn::Sub(xc, uf);
  VF u = hn::Set(df, 0.1535920892e-3f);
  u = hn::MulAdd(u, s, hn::Set(df, 0.1339262701e-2f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.9618384764e-2f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.5550347269e-1f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.2402264476e+0f));
  u = hn::MulAdd(u, s, hn::Set(df, 0.6931471825e+0f));
  u = hn::MulAdd(u, s, hn::Set(df, 1.0f));
  const auto q = hn::ConvertTo(di, uf);
  const auto h = hn::ShiftRight<1>(q);
  VF r = hn::Mul(hn::Mul(u, Pow2i(df, h)), Pow2i(df, hn::Sub(q, h)));
  r = hn::IfThenZeroElse(hn::Lt(x, hn::Set(df, -150.0f)), r);
  r = hn::IfThenElse(hn::Ge(x, hn::Set(df, 128.0f)), hn::Set(df, HUGE_VALF), r);
  return hn::IfThenElse(hn::IsNaN(x), x, r);
}

void ExpArray(const float* x, float* y, size_t n, bool base2) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t i = 0;
  if (kFma)
    for (; i + N <= n; i += N) {
      const VF v = hn::LoadU(df, x + i);
      hn::StoreU(base2 ? Exp2Sleef(df, v) : ExpSleef(df, v), df, y + i);
    }
  for (; i < n; ++i) y[i] = base2 ? attn::ref::exp2_sleef(x[i]) : attn::ref::exp_sleef(x[i]);
}

// Decode n FP8 codes (e4m3fn or e5m2) to f32 exactly (NaN: 0x7FC00000 | sign, e5m2 Inf: ±Inf — ref::decode_f32),
// times s (one f32 multiply) unless raw, then rounded to bf16 (integer RNE; NaN quieted) when to_bf16.
void DecodeRow(const uint8_t* c, size_t n, bool e5m2, bool raw, float s, bool to_bf16, float* out) {
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const VF vs = hn::Set(df, s);
  size_t i = 0;
  for (; i + N <= n; i += N) {
    const auto code = hn::PromoteTo(du, hn::LoadU(d8, c + i));
    const auto sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u)));
    const auto mag = hn::And(code, hn::Set(du, 0x7Fu));
    // Normal codes: the code's exponent and fraction moved into place plus the bias difference (integer add);
    // subnormal codes (exponent field 0): mag · 2^-9 (e4m3fn) / 2^-16 (e5m2), exact. (No subnormal f32 operand:
    // multiplying one costs a microcode assist on x86.)
    const DI di;
    const auto sub = hn::RebindMask(du, hn::Lt(hn::BitCast(di, mag), hn::Set(di, e5m2 ? 4 : 8)));
    const auto normal_bits = e5m2 ? hn::Add(hn::ShiftLeft<21>(mag), hn::Set(du, 112u << 23))
                                  : hn::Add(hn::ShiftLeft<20>(mag), hn::Set(du, 120u << 23));
    const VF subv = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, mag)), hn::Set(df, e5m2 ? 0x1p-16f : 0x1p-9f));
    VF f = hn::IfThenElse(hn::RebindMask(df, sub), subv, hn::BitCast(df, normal_bits));
    const auto special = hn::RebindMask(du, e5m2 ? hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x7B))
                                                 : hn::Eq(hn::BitCast(di, mag), hn::Set(di, 0x7F)));
    const auto inf = hn::Eq(mag, hn::Set(du, 0x7Cu));
    const auto sp_bits = e5m2 ? hn::IfThenElse(inf, hn::Set(du, 0x7F800000u), hn::Set(du, 0x7FC00000u))
                              : hn::Set(du, 0x7FC00000u);
    auto bits = hn::IfThenElse(special, sp_bits, hn::BitCast(du, f));
    f = hn::BitCast(df, hn::Or(bits, sign));
    if (!raw) f = hn::Mul(f, vs);
    if (to_bf16) {
      const auto b = hn::BitCast(du, f);
      const auto rne = hn::Add(b, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(b), hn::Set(du, 1u))));
      const auto nan = hn::Or(b, hn::Set(du, 0x00400000u));
      const auto r = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(f)), nan, rne);
      f = hn::BitCast(df, hn::And(r, hn::Set(du, 0xFFFF0000u)));
    }
    hn::StoreU(f, df, out + i);
  }
  const Format fmt = e5m2 ? Format::e5m2 : Format::e4m3fn;
  for (; i < n; ++i) {
    float f = ref::decode_f32(fmt, c[i]);
    if (!raw) f = f * s;
    if (to_bf16) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      b = static_cast<uint32_t>(ref::narrow(Format::bf16, ref::narrow(Format::f32, b, Format::bf16), Format::f32));
      std::memcpy(&f, &b, 4);
    }
    out[i] = f;
  }
}

// out[i] = table[c[i]] for a 256-entry table of the finished per-code values (DecodeRow + any f16 rounding, built
// by the worker from the same code path, so the lookup is bit-identical to decoding). sym: the table is
// sign-symmetric (table[c | 0x80] = table[c] with the sign bit flipped, checked bit by bit when it is built); AVX-512
// then looks up the 128 magnitudes in registers (four two-table permutes) and XORs the sign in.
void LutRow(const uint8_t* c, size_t n, const float* table, bool sym, float* out) {
  size_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (sym) {
    const __m512 t0 = _mm512_loadu_ps(table), t1 = _mm512_loadu_ps(table + 16), t2 = _mm512_loadu_ps(table + 32),
                 t3 = _mm512_loadu_ps(table + 48), t4 = _mm512_loadu_ps(table + 64), t5 = _mm512_loadu_ps(table + 80),
                 t6 = _mm512_loadu_ps(table + 96), t7 = _mm512_loadu_ps(table + 112);
    const __m512i b5 = _mm512_set1_epi32(0x20), b6 = _mm512_set1_epi32(0x40), b7 = _mm512_set1_epi32(0x80);
    for (; i + 16 <= n; i += 16) {
      const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
      const __m512 a = _mm512_permutex2var_ps(t0, code, t1), b = _mm512_permutex2var_ps(t2, code, t3);
      const __m512 e = _mm512_permutex2var_ps(t4, code, t5), f = _mm512_permutex2var_ps(t6, code, t7);
      const __mmask16 m5 = _mm512_test_epi32_mask(code, b5), m6 = _mm512_test_epi32_mask(code, b6);
      const __m512 v = _mm512_mask_blend_ps(m6, _mm512_mask_blend_ps(m5, a, b), _mm512_mask_blend_ps(m5, e, f));
      const __m512i sign = _mm512_slli_epi32(_mm512_and_si512(code, b7), 24);
      _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign)));
    }
  }
#else
  (void)sym;
#endif
  for (; i < n; ++i) out[i] = table[c[i]];
}

// 16 dot products: out[j] = Σ_d q[d]·kT[d·16 + j] (fma, d in order, from +0), lanes j = 0..15.
void QkTile(const float* kT, const float* q, size_t dk, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  if (!kFma || N > 16) {
    for (size_t j = 0; j < 16; ++j) {
      float acc = 0.0f;
      for (size_t d = 0; d < dk; ++d) acc = std::fma(q[d], kT[d * 16 + j], acc);
      out[j] = acc;
    }
    return;
  }
  for (size_t j0 = 0; j0 < 16; j0 += 2 * N) {
    if (j0 + 2 * N <= 16) {
      VF a0 = hn::Zero(df), a1 = hn::Zero(df);
      for (size_t d = 0; d < dk; ++d) {
        const VF qd = hn::Set(df, q[d]);
        a0 = hn::MulAdd(qd, hn::LoadU(df, kT + d * 16 + j0), a0);
        a1 = hn::MulAdd(qd, hn::LoadU(df, kT + d * 16 + j0 + N), a1);
      }
      hn::StoreU(a0, df, out + j0);
      hn::StoreU(a1, df, out + j0 + N);
    } else {
      VF a0 = hn::Zero(df);
      for (size_t d = 0; d < dk; ++d) a0 = hn::MulAdd(hn::Set(df, q[d]), hn::LoadU(df, kT + d * 16 + j0), a0);
      hn::StoreU(a0, df, out + j0);
    }
  }
}

// kT[d·16 + j] = kr[j·dk + d] for j = 0..15 (a gather per d; lanes past the tile read stale, ignored rows).
void TransposeTile(const float* kr, size_t dk, float* kT) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  if (N > 16 || 16 % N != 0) {
    for (size_t d = 0; d < dk; ++d)
      for (size_t j = 0; j < 16; ++j) kT[d * 16 + j] = kr[j * dk + d];
    return;
  }
  const auto idx = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(dk)));
  for (size_t j0 = 0; j0 < 16; j0 += N)
    for (size_t d = 0; d < dk; ++d) hn::StoreU(hn::GatherIndex(df, kr + j0 * dk + d, idx), df, kT + d * 16 + j0);
}

// QkTile for up to 8 rows sharing one K tile: out[r·16 + j] = Σ_d q[r][d]·kT[d·16 + j] (the same per-lane order).
void QkTileRows(const float* kT, const float* const* q, size_t nrows, size_t dk, float* out) {
  const DF df;
  const size_t N = hn::Lanes(df);
  if (!kFma || N != 16) {
    for (size_t r = 0; r < nrows; ++r) QkTile(kT, q[r], dk, out + r * 16);
    return;
  }
  for (size_t r0 = 0; r0 < nrows; r0 += 8) {
    const size_t n = nrows - r0 < 8 ? nrows - r0 : 8;
    VF a[8];
    for (size_t r = 0; r < 8; ++r) a[r] = hn::Zero(df);
    for (size_t d = 0; d < dk; ++d) {
      const VF k = hn::LoadU(df, kT + d * 16);
      for (size_t r = 0; r < 8; ++r)
        if (r < n) a[r] = hn::MulAdd(hn::Set(df, q[r0 + r][d]), k, a[r]);
    }
    for (size_t r = 0; r < n; ++r) hn::StoreU(a[r], df, out + (r0 + r) * 16);
  }
}

// acc[d] = fma(p[j], v[j·dv + d], acc[d]) for j = 0..nk-1 in order.
void PvRows(const float* v, const float* p, size_t nk, size_t dv, float* acc) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t d = 0;
  if (kFma) {
    for (; d + 4 * N <= dv; d += 4 * N) {
      VF a0 = hn::LoadU(df, acc + d), a1 = hn::LoadU(df, acc + d + N), a2 = hn::LoadU(df, acc + d + 2 * N),
         a3 = hn::LoadU(df, acc + d + 3 * N);
      for (size_t j = 0; j < nk; ++j) {
        const VF pj = hn::Set(df, p[j]);
        const float* vj = v + j * dv + d;
        a0 = hn::MulAdd(pj, hn::LoadU(df, vj), a0);
        a1 = hn::MulAdd(pj, hn::LoadU(df, vj + N), a1);
        a2 = hn::MulAdd(pj, hn::LoadU(df, vj + 2 * N), a2);
        a3 = hn::MulAdd(pj, hn::LoadU(df, vj + 3 * N), a3);
      }
      hn::StoreU(a0, df, acc + d);
      hn::StoreU(a1, df, acc + d + N);
      hn::StoreU(a2, df, acc + d + 2 * N);
      hn::StoreU(a3, df, acc + d + 3 * N);
    }
    for (; d + N <= dv; d += N) {
      VF a0 = hn::LoadU(df, acc + d);
      for (size_t j = 0; j < nk; ++j) a0 = hn::MulAdd(hn::Set(df, p[j]), hn::LoadU(df, v + j * dv + d), a0);
      hn::StoreU(a0, df, acc + d);
    }
  }
  for (; d < dv; ++d)
    for (size_t j = 0; j < nk; ++j) acc[d] = std::fma(p[j], v[j * dv + d], acc[d]);
}

// One online-softmax tile of P·V for one row, the rescale fused in:
//   fresh (vllm-triton-unified): acc_d = RN32(RN32(acc_d·alpha) + t_d), t_d = Σ_j fma(p_j, v_jd, ·) from +0
//   chained (flashinfer):        acc_d = RN32(acc_d·alpha), then acc_d = fma(p_j, v_jd, acc_d) for each j
void PvTile(const float* v, const float* p, size_t nk, size_t dv, float* acc, float alpha, bool fresh) {
  const DF df;
  const size_t N = hn::Lanes(df);
  size_t d = 0;
  if (kFma) {
    const VF va = hn::Set(df, alpha);
    for (; d + 2 * N <= dv; d += 2 * N) {
      const VF s0 = hn::Mul(hn::LoadU(df, acc + d), va), s1 = hn::Mul(hn::LoadU(df, acc + d + N), va);
      VF a0 = fresh ? hn::Zero(df) : s0, a1 = fresh ? hn::Zero(df) : s1;
      for (size_t j = 0; j < nk; ++j) {
        const VF pj = hn::Set(df, p[j]);
        a0 = hn::MulAdd(pj, hn::LoadU(df, v + j * dv + d), a0);
        a1 = hn::MulAdd(pj, hn::LoadU(df, v + j * dv + d + N), a1);
      }
      hn::StoreU(fresh ? hn::Add(s0, a0) : a0, df, acc + d);
      hn::StoreU(fresh ? hn::Add(s1, a1) : a1, df, acc + d + N);
    }
  }
  for (; d < dv; ++d) {
    const float s = acc[d] * alpha;
    float a = fresh ? 0.0f : s;
    for (size_t j = 0; j < nk; ++j) a = std::fma(p[j], v[j * dv + d], a);
    acc[d] = fresh ? s + a : a;
  }
}

size_t FloatLanes() { return hn::Lanes(DF()); }

// HmmaLanes' lane l through ref::hmma16_step (its operands gathered; inactive slots 0).
void LiteralLane(Format f, const float* a, const int* kidx, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0,
                 size_t stride, size_t l, float* c) {
  float bl[16], al[16];
  for (int i = 0; i < n; ++i) {
    const int k = kidx[i];
    const bool on = k >= k_lo && k < k_hi;
    al[i] = on ? a[k] : 0.0f;
    bl[i] = on ? b[(row0 + k) * static_cast<ptrdiff_t>(stride) + static_cast<ptrdiff_t>(l)] : 0.0f;
  }
  c[l] = fp8ref::ref::hmma16_step(f, al, bl, n, c[l]);
}
// vllm-triton-unified's tensor-core step (fp8ref::ref::hmma16_step, include/fp8ref/mma.h) for N outputs at once,
// one per lane: c[l] = step(a[k_i]·B(k_i)[l] for i < n, c[l]) for lanes l in [l0, l1), with the n <= 16 k_i = kidx[i]
// (a step's k, ascending); a holds the shared operands (q's dims, or P's slots) and B(k) = b + (row0 + k)·stride for
// k in [k_lo, k_hi), 0 (not read) elsewhere.
// The usual case in 32-bit lanes, the same arithmetic as hmma16_step's: nominal exponents from the bits (f16
// subnormals at −14); the products exact in f32 (normal operands, nominal exponent in [−125, 125]); each term's
// 24-bit significand shifted onto the grid 2^(e−25) toward zero (< 2^27), summed exactly in two int32 halves
// (8 terms each: < 2^30); the sum's top 24 bits in the scalar finish. A lane with a special or subnormal operand, or a
// result outside f32's normal range, takes ref::hmma16_step.
void HmmaLanes(uint8_t fmt, const float* a, const int* kidx, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0,
               size_t stride, float* c, size_t l0, size_t l1) {
  const DF df;
  const DI di;
  const size_t N = hn::Lanes(df);
  const Format f = static_cast<Format>(fmt);
  const int32_t emin = f == Format::f16 ? 127 - 14 : 1;
  const auto mexp = hn::Set(di, 0xFF), mmag = hn::Set(di, 0x7FFFFFFF), mman = hn::Set(di, 0x7FFFFF),
             hidden = hn::Set(di, 0x800000), zero = hn::Zero(di);
  const auto cb = hn::BitCast(di, hn::LoadU(df, c));
  const auto ec = hn::And(hn::ShiftRight<23>(cb), mexp);
  const auto cnz = hn::Ne(hn::And(cb, mmag), zero);
  auto slow = hn::And(cnz, hn::Or(hn::Eq(ec, zero), hn::Eq(ec, mexp)));
  // e: the step's exponent + 127 (−10^6: no non-zero term yet)
  auto e = hn::IfThenElse(cnz, ec, hn::Set(di, -1000000));
  bool all_slow = false;
  int32_t ea[16];  // a[k_i]'s nominal exponent (clamped), −1000 for a zero a[k_i], −2000 for an inactive k_i
  for (int i = 0; i < n; ++i) {
    const int k = kidx[i];
    if (k < k_lo || k >= k_hi) {
      ea[i] = -2000;
      continue;
    }
    const uint32_t x = fp8ref::bits_of_f32(a[k]), ex = (x >> 23) & 0xFF;
    ea[i] = (x & 0x7FFFFFFFu) == 0 ? -1000 : std::max(static_cast<int32_t>(ex), emin) - 127;
    if ((x & 0x7FFFFFFFu) != 0 && (ex == 0 || ex == 0xFF)) all_slow = true;
  }
  if (!all_slow) {
    for (int i = 0; i < n; ++i) {
      const int k = kidx[i];
      if (ea[i] == -2000) continue;
      const auto bk = hn::BitCast(di, hn::LoadU(df, b + (row0 + k) * static_cast<ptrdiff_t>(stride)));
      const auto eb = hn::And(hn::ShiftRight<23>(bk), mexp);
      // a special b takes the literal steps (0·NaN, 0·Inf included); a zero product does not join the exponent
      slow = hn::Or(slow, hn::Eq(eb, mexp));
      if (ea[i] == -1000) continue;
      const auto bnz = hn::Ne(hn::And(bk, mmag), zero);
      const auto nb = hn::Add(hn::Max(eb, hn::Set(di, emin)), hn::Set(di, ea[i]));
      slow = hn::Or(slow, hn::And(bnz, hn::Or(hn::Eq(eb, zero),
                                              hn::Or(hn::Lt(nb, hn::Set(di, 2)), hn::Gt(nb, hn::Set(di, 252))))));
      e = hn::IfThenElse(bnz, hn::Max(e, nb), e);
    }
    const auto grid = hn::Sub(e, hn::Set(di, 25));
    // the term of an f32 (m: its 24-bit significand, x: its biased exponent) whose exponent is at most the grid's + 26 (a product: <= e + 1; the accumulator: <= e):
    // floor(m·2^(x − 23 − grid)) = (m·8) >> (grid + 26 − x), m·8 < 2^27 (counts clamped to [0, 31] for the slow
    // lanes' garbage, whose results are not used)
    const hn::RebindToUnsigned<DI> du;
    const auto top = hn::Add(grid, hn::Set(di, 26)), c31 = hn::Set(di, 31);
    auto term = [&](hn::Vec<DI> bits, hn::Mask<DI> nz) {
      const auto x = hn::And(hn::ShiftRight<23>(bits), mexp);
      const auto m8 = hn::ShiftLeft<3>(hn::BitCast(du, hn::Or(hn::And(bits, mman), hidden)));
      const auto t = hn::IfThenElseZero(nz, hn::BitCast(di, hn::Shr(m8, hn::BitCast(du, hn::Min(hn::Max(hn::Sub(top, x), zero), c31)))));
      return hn::IfThenElse(hn::Lt(bits, zero), hn::Neg(t), t);
    };
    auto s0 = zero, s1 = zero;
    for (int i = 0; i < n; ++i) {
      if (ea[i] < -999) continue;
      const int k = kidx[i];
      const auto bv = hn::LoadU(df, b + (row0 + k) * static_cast<ptrdiff_t>(stride));
      const auto pb = hn::BitCast(di, hn::Mul(hn::Set(df, a[k]), bv));
      const auto t = term(pb, hn::Ne(hn::And(pb, mmag), zero));
      if (i < 8) s0 = hn::Add(s0, t);
      else s1 = hn::Add(s1, t);
    }
    const auto sc = term(cb, cnz);
    HWY_ALIGN int32_t v0[16], v1[16], vc[16], vg[16], vs[16];
    hn::Store(s0, di, v0);
    hn::Store(s1, di, v1);
    hn::Store(sc, di, vc);
    hn::Store(e, di, vg);
    hn::Store(hn::VecFromMask(di, slow), di, vs);
    for (size_t l = l0; l < l1 && l < N; ++l) {
      if (vs[l] != 0) continue;  // (below)
      if (vg[l] == -1000000) {
        c[l] = 0.0f;
        continue;
      }
      const int64_t S = static_cast<int64_t>(v0[l]) + v1[l] + vc[l];
      if (S == 0) {
        c[l] = 0.0f;
        continue;
      }
      uint64_t mag = static_cast<uint64_t>(S < 0 ? -S : S);
      const int bl = 64 - __builtin_clzll(mag);
      const int drop = bl > 24 ? bl - 24 : 0;
      mag >>= drop;
      const int be = vg[l] - 25 + drop + (bl - drop) - 1;  // biased exponent of the result
      if (be < 1 || be > 254) {
        vs[l] = 1;
        continue;
      }
      const uint32_t r = (S < 0 ? 0x80000000u : 0u) | (static_cast<uint32_t>(be) << 23) |
                         ((static_cast<uint32_t>(mag) << (24 - (bl - drop))) & 0x7FFFFFu);
      c[l] = fp8ref::f32_from_bits(r);
    }
    bool any = false;
    for (size_t l = l0; l < l1 && l < N; ++l) any = any || vs[l] != 0;
    if (!any) return;
    for (size_t l = l0; l < l1 && l < N; ++l) {
      if (vs[l] == 0) continue;
      LiteralLane(f, a, kidx, n, k_lo, k_hi, b, row0, stride, l, c);
    }
    return;
  }
  for (size_t l = l0; l < l1 && l < N; ++l) LiteralLane(f, a, kidx, n, k_lo, k_hi, b, row0, stride, l, c);
}

using VU = hn::Vec<DU>;

// ---- kv_cache_write lanes ------------------------------------------------------------------------------------------
// md: 0 f32, 1 bf16, 2 f16. Rows of D elements; a tail shorter than a vector goes through the scalar reference
// functions (ref::load_f32 / ref::narrow), the same steps.

// f32(x) for N elements of md at p (full vectors only).
HWY_INLINE VF LoadMd(int md, const void* p, size_t i) {
  const DF df;
  const DU du;
  if (md == 0) return hn::LoadU(df, static_cast<const float*>(p) + i);
  if (md == 1) {
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, static_cast<const uint16_t*>(p) + i))));
  }
  return fp8_lanes::PromoteF16(static_cast<const hwy::float16_t*>(p) + i);
}

// sglang / spyre: out[i] = RN_md(RN32(f32(x[i]) / s)) as md bits (u32 for f32, u16 for bf16/f16), s = sc[row].
// bf16: RNE with ref::narrow's NaN rule (sign and top payload kept, quieted); f16: the hardware conversion (RNE).
void KvMdQuotRows(int md, const void* x, size_t rows, size_t D, const float* sc, void* out) {
  const DF df;
  const hn::Rebind<uint16_t, DF> d16;
  const hn::Rebind<int32_t, DF> di;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const size_t N = hn::Lanes(df);
  const Format fmd = md == 0 ? Format::f32 : md == 1 ? Format::bf16 : Format::f16;
  for (size_t r = 0; r < rows; ++r) {
    const float s = sc[r];
    const VF vs = hn::Set(df, s);
    const size_t base = r * D;
    size_t d = 0;
    // (f16 without a hardware conversion: Highway's emulated DemoteTo truncates; the scalar steps below instead)
    const size_t vec_end = md == 2 && !FP8REF_NATIVE_F16 ? 0 : D;
    for (; d + N <= vec_end; d += N) {
      const VF v = hn::Div(LoadMd(md, x, base + d), vs);
      if (md == 0) {
        hn::StoreU(v, df, static_cast<float*>(out) + base + d);
      } else if (md == 1) {
        const VU h = fp8_lanes::RoundBf16Bits(v);
        hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, h)), d16, static_cast<uint16_t*>(out) + base + d);
      } else {
        hn::StoreU(hn::DemoteTo(dh, v), dh, static_cast<hwy::float16_t*>(out) + base + d);
      }
    }
    for (; d < D; ++d) {
      const float v = fp8ref::ref::load_f32(fmd, x, static_cast<int64_t>(base + d)) / s;
      const uint64_t h = fp8ref::ref::narrow(Format::f32, fp8ref::bits_of_f32(v), fmd);
      if (md == 0) static_cast<uint32_t*>(out)[base + d] = static_cast<uint32_t>(h);
      else static_cast<uint16_t*>(out)[base + d] = static_cast<uint16_t>(h);
    }
  }
}

// Dynamic scales: out[r] = the f32 bits of max |x| over row r (above 0x7F800000 when the row holds a NaN).
void KvRowAbsMax(int md, const void* x, size_t rows, size_t D, uint32_t* out) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  const Format fmd = md == 0 ? Format::f32 : md == 1 ? Format::bf16 : Format::f16;
  const VU absm = hn::Set(du, 0x7FFFFFFFu);
  for (size_t r = 0; r < rows; ++r) {
    const size_t base = r * D;
    VU m = hn::Zero(du);
    size_t d = 0;
    for (; d + N <= D; d += N) m = hn::Max(m, hn::And(hn::BitCast(du, LoadMd(md, x, base + d)), absm));
    uint32_t mb = d ? hn::GetLane(hn::MaxOfLanes(du, m)) : 0u;
    for (; d < D; ++d)
      mb = std::max(mb, fp8ref::bits_of_f32(fp8ref::ref::load_f32(fmd, x, static_cast<int64_t>(base + d))) & 0x7FFFFFFFu);
    out[r] = mb;
  }
}

}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "fp8ref/error.h"

namespace fp8ref {
HWY_EXPORT(ExpArray);
HWY_EXPORT(DecodeRow);
HWY_EXPORT(LutRow);
HWY_EXPORT(QkTile);
HWY_EXPORT(PvRows);
HWY_EXPORT(TransposeTile);
HWY_EXPORT(QkTileRows);
HWY_EXPORT(PvTile);
HWY_EXPORT(HmmaLanes);
HWY_EXPORT(FloatLanes);
HWY_EXPORT(KvMdQuotRows);
HWY_EXPORT(KvRowAbsMax);

namespace attn::cpu {
namespace {

constexpr int64_t kTile = 16;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }
// RN to f and back; bf16 inline (integer RNE, NaN quieted with its sign and top payload: ref::narrow's rule).
float round_to(Format f, float x) { return fp8ref::ref::round_through(f, x); }
size_t elem_size(Format f) { return static_cast<size_t>(format_info(f).bits / 8); }
float load_md(Format md, const void* p, int64_t i) { return fp8ref::ref::load_f32(md, p, i); }
// NaN results canonical, as ref's store_out (which NaN operand propagates is an operand-order artefact).
void store_out(Format f, void* out, int64_t i, float x) {
  if (std::isnan(x)) x = std::numeric_limits<float>::quiet_NaN();
  const uint64_t b = fp8ref::ref::narrow(Format::f32, bits_of(x), f);
  std::memcpy(static_cast<uint8_t*>(out) + elem_size(f) * i, &b, elem_size(f));
}

// How a tile's K or V values are made from the codes.
enum class Deq { md, md_f16_quirk, raw };

struct Unit {
  int64_t b, i0, i1;  // a sequence's query positions [i0, i1), every KV head
};

struct Row {
  int64_t h, kvh, i, lo, hi;  // q head, its KV head, query index in the sequence, visible [lo, hi]
  std::vector<float> q;
  // online state / accumulators
  float M = kNegInf, L = 1.0f;
  std::vector<float> acc;
  // vllm-triton-unified with S segments: every segment's state (M, L: S each; acc: S·Dv)
  std::vector<float> segM, segL, segAcc;
};

class Worker {
 public:
  Worker(const AttnSpec& spec, const AttnArgs& a) : s_(spec), a_(a) {
    Dk_ = spec.cache.head_dim;
    Dv_ = spec.dv();
    G_ = spec.num_q_heads / spec.cache.num_kv_heads;
    vshape_ = spec.cache;
    vshape_.head_dim = Dv_;
    e5m2_ = spec.cache.format == Format::e5m2;
    kT_.resize(static_cast<size_t>(Dk_ * kTile));
    kr_.resize(static_cast<size_t>(Dk_ * kTile));
    vt_.resize(static_cast<size_t>(Dv_ * kTile));
  }

  void run(const Unit& u) {
    seq_ = seq_pages(s_, a_, u.b);
    const int64_t H = s_.cache.num_kv_heads;
    sks_.resize(static_cast<size_t>(H));
    svs_.resize(static_cast<size_t>(H));
    for (int64_t kvh = 0; kvh < H; ++kvh) {
      const int64_t si = scale_index(s_.scale_kind, u.b, kvh);
      sks_[static_cast<size_t>(kvh)] = a_.k_scale[si];
      svs_[static_cast<size_t>(kvh)] = s_.v_from_k ? a_.k_scale[si] : a_.v_scale[si];
    }
    build_luts();
    rows_.clear();
    const int64_t ctx = seq_.seq_len - seq_.q_len;
    for (int64_t i = u.i0; i < u.i1; ++i)
      for (int64_t g = 0; g < G_ * H; ++g) {
        Row r;
        r.h = g;
        r.kvh = g / G_;
        r.i = i;
        const int64_t qpos = s_.causal == Causal::top_left ? i : ctx + i;
        r.hi = s_.causal == Causal::none ? seq_.seq_len - 1 : std::min(qpos, seq_.seq_len - 1);
        r.lo = s_.window_left >= 0 ? std::max<int64_t>(0, qpos - s_.window_left) : 0;
        r.q.resize(static_cast<size_t>(Dk_));
        const int64_t row = seq_.q_begin + i;
        for (int64_t d = 0; d < Dk_; ++d)
          r.q[static_cast<size_t>(d)] = load_md(s_.q_format, a_.q, (row * s_.num_q_heads + r.h) * Dk_ + d);
        r.acc.assign(static_cast<size_t>(Dv_), 0.0f);
        rows_.push_back(std::move(r));
      }
    switch (s_.convention) {
      case AttnConvention::vllm_paged_v1: two_pass(false); break;
      case AttnConvention::torch_sdpa_math:
      case AttnConvention::spyre: two_pass(true); break;
      case AttnConvention::vllm_triton_unified: online(false); break;
      case AttnConvention::flashinfer: online(true); break;
      case AttnConvention::exact:
      case AttnConvention::fast: break;  // handled by the caller
    }
  }

 private:
  const uint8_t* krow(int64_t j) const {
    const int64_t bs = s_.cache.block_size;
    return a_.k_cache + s_.cache.offset(seq_.pages[j / bs], j % bs, kvh_);
  }
  const uint8_t* vrow(int64_t j) const {
    const int64_t bs = s_.cache.block_size;
    if (s_.v_from_k) return krow(j);
    return a_.v_cache + vshape_.offset(seq_.pages[j / bs], j % bs, kvh_);
  }
  void select(int64_t kvh) {
    kvh_ = kvh;
    sk_ = sks_[static_cast<size_t>(kvh)];
    sv_ = svs_[static_cast<size_t>(kvh)];
  }
  // Dequantizes keys [j0, j1) of one tile into dst[(j − j0)·n + d]; a quirk/f16 md rounds per element.
  void deq_rows(bool is_k, int64_t j0, int64_t j1, Deq how, float scale, float* dst) {
    const int64_t n = is_k ? Dk_ : Dv_;
    const bool bf16 = how != Deq::raw && s_.q_format == Format::bf16;
    const bool per_elem = how != Deq::raw && !bf16 && s_.q_format == Format::f16;
    const bool quirk = how == Deq::md_f16_quirk && s_.q_format == Format::f32;
    for (int64_t j = j0; j < j1; ++j) {
      float* o = dst + (j - j0) * n;
      if (s_.chunk_unquantized && j >= seq_.seq_len - seq_.q_len) {  // the chunk's own md K/V, as given
        const int64_t t = seq_.q_begin + j - (seq_.seq_len - seq_.q_len), H = s_.cache.num_kv_heads;
        const bool from_k = is_k || s_.v_from_k;
        const int64_t base = (t * H + kvh_) * (from_k ? Dk_ : Dv_);
        for (int64_t d = 0; d < n; ++d) o[d] = load_md(s_.q_format, from_k ? a_.k_new : a_.v_new, base + d);
        continue;
      }
      if (lut_ok_ && how == lut_how_ && scale == (is_k ? sk_ : sv_)) {
        const size_t at = static_cast<size_t>(kvh_) * 2 + (is_k ? 0 : 1);
        HWY_DYNAMIC_DISPATCH(LutRow)(is_k ? krow(j) : vrow(j), static_cast<size_t>(n), lut_.data() + at * 256,
                                     lut_sym_[at] != 0, o);
        continue;
      }
      HWY_DYNAMIC_DISPATCH(DecodeRow)(is_k ? krow(j) : vrow(j), static_cast<size_t>(n), e5m2_, how == Deq::raw, scale,
                                      bf16, o);
      if (per_elem || quirk)
        for (int64_t d = 0; d < n; ++d) o[d] = round_to(Format::f16, o[d]);
    }
  }
  // The 256-entry code -> value tables of every KV head's K and V for this unit (its scales), made by the decode
  // path itself (DecodeRow, then the f16 rounding deq_rows applies), so a lookup equals decoding bit for bit.
  void build_luts() {
    lut_ok_ = false;
    switch (s_.convention) {
      case AttnConvention::vllm_paged_v1: lut_how_ = Deq::md_f16_quirk; break;
      case AttnConvention::torch_sdpa_math:
      case AttnConvention::spyre:
      case AttnConvention::vllm_triton_unified: lut_how_ = Deq::md; break;
      case AttnConvention::flashinfer: lut_how_ = Deq::raw; break;
      case AttnConvention::exact:
      case AttnConvention::fast: return;
    }
    const int64_t H = s_.cache.num_kv_heads;
    lut_.resize(static_cast<size_t>(H) * 2 * 256);
    lut_sym_.assign(static_cast<size_t>(H) * 2, 0);
    uint8_t codes[256];
    for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
    const bool bf16 = lut_how_ != Deq::raw && s_.q_format == Format::bf16;
    const bool per_elem = lut_how_ != Deq::raw && !bf16 && s_.q_format == Format::f16;
    const bool quirk = lut_how_ == Deq::md_f16_quirk && s_.q_format == Format::f32;
    for (int64_t kvh = 0; kvh < H; ++kvh)
      for (int kv = 0; kv < 2; ++kv) {
        const size_t at = static_cast<size_t>(kvh) * 2 + static_cast<size_t>(kv);
        float* t = lut_.data() + at * 256;
        HWY_DYNAMIC_DISPATCH(DecodeRow)(codes, 256, e5m2_, lut_how_ == Deq::raw,
                                        kv == 0 ? sks_[static_cast<size_t>(kvh)] : svs_[static_cast<size_t>(kvh)],
                                        bf16, t);
        if (per_elem || quirk)
          for (int c = 0; c < 256; ++c) t[c] = round_to(Format::f16, t[c]);
        bool sym = true;
        for (int c = 0; c < 128; ++c) sym = sym && bits_of(t[c | 0x80]) == (bits_of(t[c]) ^ 0x80000000u);
        lut_sym_[at] = sym ? 1 : 0;
      }
    lut_ok_ = true;
  }
  // K tile, transposed: kT_[d·16 + (j − t0)] for j in [j0, j1) (other lanes: stale, never used).
  void k_tile(int64_t t0, int64_t j0, int64_t j1, Deq how, float mul) {
    float* kr = kr_.data() + (j0 - t0) * Dk_;
    deq_rows(true, j0, j1, how, sk_, kr);
    if (mul != 0.0f)
      for (int64_t i = 0; i < (j1 - j0) * Dk_; ++i) kr[i] = kr[i] * mul;
    HWY_DYNAMIC_DISPATCH(TransposeTile)(kr_.data(), static_cast<size_t>(Dk_), kT_.data());
  }
  // dots_[ri·stride + off + j] (j < 16) for every row of KV head kvh (the current kT_ tile); dots_ holds stride per row.
  void all_dots(int64_t kvh, size_t stride = kTile, size_t off = 0) {
    dots_.resize(rows_.size() * stride);
    qptr_.clear();
    idx_.clear();
    for (size_t ri = 0; ri < rows_.size(); ++ri)
      if (rows_[ri].kvh == kvh) {
        qptr_.push_back(rows_[ri].q.data());
        idx_.push_back(ri);
      }
    tmp_.resize(idx_.size() * kTile);
    HWY_DYNAMIC_DISPATCH(QkTileRows)(kT_.data(), qptr_.data(), qptr_.size(), static_cast<size_t>(Dk_), tmp_.data());
    for (size_t n = 0; n < idx_.size(); ++n) std::memcpy(&dots_[idx_[n] * stride + off], &tmp_[n * kTile], kTile * 4);
  }
  // vllm-triton-unified on the tensor cores (ref::triton_online): dots_[ri·stride + off + j] = tl.dot's S for the
  // keys j in [j0, j1) of the current K tile (kr_ rows from its start) and every row of KV head kvh.
  static size_t lanes_() { return HWY_DYNAMIC_DISPATCH(FloatLanes)(); }
  // The steps of ref::hmma16_kw4_step for a dot of n k, made once per n.
  struct Kw4Step {
    int64_t base;
    int kidx[16];
    int m;
  };
  const std::vector<Kw4Step>& kw4_steps(int64_t n) {
    std::vector<Kw4Step>& v = kw4_[n == Dk_ ? 0 : 1];
    if (kw4_n_[n == Dk_ ? 0 : 1] != n || v.empty()) {
      v.clear();
      Kw4Step st{};
      for (int i = 0; (st.m = fp8ref::ref::hmma16_kw4_step(n, i, &st.base, st.kidx)) >= 0; ++i) v.push_back(st);
      kw4_n_[n == Dk_ ? 0 : 1] = n;
    }
    return v;
  }
  // The 16 keys of the tile are the lanes of HmmaLanes (kT_[d·16 + j]), a step per 16 dims of q.
  void tc_dots(int64_t kvh, size_t stride, int64_t off, int64_t j0, int64_t j1) {
    dots_.resize(rows_.size() * stride);
    const size_t N = lanes_();
    const uint8_t fmt = static_cast<uint8_t>(s_.q_format);
    for (size_t ri = 0; ri < rows_.size(); ++ri) {
      if (rows_[ri].kvh != kvh) continue;
      float c[kTile] = {};
      for (size_t g = 0; g < static_cast<size_t>(kTile); g += N) {
        const size_t l0 = static_cast<size_t>(std::max<int64_t>(j0 - static_cast<int64_t>(g), 0));
        const size_t l1 = static_cast<size_t>(std::min<int64_t>(j1 - static_cast<int64_t>(g), static_cast<int64_t>(N)));
        if (l0 >= l1 || j1 <= static_cast<int64_t>(g)) continue;
        for (const Kw4Step& st : kw4_steps(Dk_)) {  // the head dim in the kWidth-4 order (ref::hmma16_dot_kw4)
          const int hi = static_cast<int>(std::min<int64_t>(32, Dk_ - st.base));
          HWY_DYNAMIC_DISPATCH(HmmaLanes)(fmt, rows_[ri].q.data() + st.base, st.kidx, st.m, 0, hi, kT_.data() + g,
                                          st.base, kTile, c + g, l0, l1);
        }
      }
      for (int64_t j = j0; j < j1; ++j) dots_[ri * stride + static_cast<size_t>(off + j)] = c[j];
    }
  }
  // acc_d = tl.dot(P, V, RN32(acc_d·alpha)) over a softmax tile of T keys: p[0, n) are the P of the keys from
  // offset `off` in the tile (the rest 0), vt their V rows (ref::triton_online).
  // The dims are the lanes of HmmaLanes (a tail of Dv_ % N through hmma16_dot_kw4), the tile's slots in the kWidth-4
  // order.
  void pv_tc(const float* vt, const float* p, int64_t off, int64_t n, int64_t T, float* acc, float alpha) {
    pt_.assign(static_cast<size_t>(T), 0.0f);
    std::copy(p, p + n, pt_.begin() + off);
    for (int64_t d = 0; d < Dv_; ++d) acc[d] = acc[d] * alpha;
    const int64_t N = static_cast<int64_t>(lanes_());
    const uint8_t fmt = static_cast<uint8_t>(s_.q_format);
    int64_t d = 0;
    for (; d + N <= Dv_; d += N) {
      for (const Kw4Step& st : kw4_steps(T)) {  // the tile's slots in the kWidth-4 order (ref::hmma16_dot_kw4)
        const int k_lo = static_cast<int>(std::clamp<int64_t>(off - st.base, 0, 32));
        const int k_hi = static_cast<int>(std::clamp<int64_t>(off + n - st.base, 0, 32));
        HWY_DYNAMIC_DISPATCH(HmmaLanes)(fmt, pt_.data() + st.base, st.kidx, st.m, k_lo, std::max(k_lo, k_hi),
                                        vt + d, st.base - off, static_cast<size_t>(Dv_), acc + d, 0, static_cast<size_t>(N));
      }
    }
    vcol_.assign(static_cast<size_t>(T), 0.0f);
    for (; d < Dv_; ++d) {
      for (int64_t j = 0; j < n; ++j) vcol_[static_cast<size_t>(off + j)] = vt[j * Dv_ + d];
      acc[d] = fp8ref::ref::hmma16_dot_kw4(s_.q_format, pt_.data(), vcol_.data(), T, acc[d]);
    }
  }
  // Prefetches the K and/or V rows of every KV head for keys [j0, j1) into L2 (called once per tile, kAhead tiles
  // ahead: the pages are scattered, so the hardware prefetcher cannot follow them).
  void prefetch(int64_t j0, int64_t j1, bool k, bool v) const {
    const int64_t bs = s_.cache.block_size;
    for (int64_t j = j0; j < j1; ++j)
      for (int64_t h = 0; h < s_.cache.num_kv_heads; ++h) {
        if (k || s_.v_from_k) {
          const uint8_t* kp = a_.k_cache + s_.cache.offset(seq_.pages[j / bs], j % bs, h);
          for (int64_t o = 0; o < Dk_; o += 64) __builtin_prefetch(kp + o, 0, 2);
        }
        if (v && !s_.v_from_k) {
          const uint8_t* vp = a_.v_cache + vshape_.offset(seq_.pages[j / bs], j % bs, h);
          for (int64_t o = 0; o < Dv_; o += 64) __builtin_prefetch(vp + o, 0, 2);
        }
      }
  }
  void prefetch_ahead(int64_t t0, int64_t uhi, bool k, bool v, int64_t step = kTile) const {
    constexpr int64_t kAhead = 2;
    prefetch(std::min(uhi + 1, t0 + kAhead * step), std::min(uhi + 1, t0 + (kAhead + 1) * step), k, v);
  }

  // vllm-paged-v1 (torch = false) and torch-sdpa-math / spyre (torch = true).
  void two_pass(bool torch) {
    const float sm = static_cast<float>(s_.scale());
    const float root = static_cast<float>(std::sqrt(s_.scale()));
    const Deq how = torch ? Deq::md : Deq::md_f16_quirk;
    int64_t ulo = seq_.seq_len, uhi = -1;
    for (const Row& r : rows_) {
      ulo = std::min(ulo, torch ? 0 : r.lo);
      uhi = std::max(uhi, torch ? seq_.seq_len - 1 : r.hi);
    }
    if (uhi < ulo) {
      finish_rows_zero();
      return;
    }
    const int64_t base = ulo, span = uhi - ulo + 1;
    logits_.assign(rows_.size() * static_cast<size_t>(span), 0.0f);
    if (torch)  // q' = RN32(q·√s), once per row
      for (Row& r : rows_)
        for (float& x : r.q) x = x * root;
    // pass 1: logits
    for (int64_t t0 = (ulo / kTile) * kTile; t0 <= uhi; t0 += kTile) {
      const int64_t j0 = std::max(ulo, t0), j1 = std::min(uhi + 1, t0 + kTile);
      for (int64_t kvh = 0; kvh < s_.cache.num_kv_heads; ++kvh) {
      if (kvh == 0) prefetch_ahead(t0, uhi, true, false);
      select(kvh);
      k_tile(t0, j0, j1, how, torch ? root : 0.0f);
      all_dots(kvh);
      for (size_t ri = 0; ri < rows_.size(); ++ri) {
        Row& r = rows_[ri];
        if (r.kvh != kvh) continue;
        const float* dots = dots_.data() + ri * kTile;
        float* L = logits_.data() + ri * static_cast<size_t>(span);
        for (int64_t j = j0; j < j1; ++j) {
          if (torch) {
            const float mask = (j >= r.lo && j <= r.hi) ? 0.0f : kNegInf;
            L[j - base] = dots[j - t0] + mask;
          } else if (j >= r.lo && j <= r.hi) {
            L[j - base] = sm * dots[j - t0];
          }
        }
      }
      }
    }
    // pass 2: softmax weights (in place)
    for (size_t ri = 0; ri < rows_.size(); ++ri) {
      Row& r = rows_[ri];
      float* L = logits_.data() + ri * static_cast<size_t>(span);
      const int64_t a = torch ? 0 : r.lo, e = torch ? seq_.seq_len - 1 : r.hi;
      float m = kNegInf;
      for (int64_t j = a; j <= e; ++j) m = std::max(m, L[j - base]);
      for (int64_t j = a; j <= e; ++j) L[j - base] = L[j - base] - m;
      HWY_DYNAMIC_DISPATCH(ExpArray)(L + (a - base), L + (a - base), static_cast<size_t>(e - a + 1), false);
      float S = 0.0f;
      const int64_t n = e - a + 1, W = s_.torch_lanes;
      if (!torch || n < W) {
        for (int64_t j = a; j <= e; ++j) S = S + L[j - base];
      } else {
        float lane[16];
        for (int64_t q = 0; q < W; ++q) lane[q] = L[q - base];
        for (int64_t j = W; j < n; ++j) lane[j % W] = lane[j % W] + L[j - base];
        for (int64_t w = W / 2; w >= 1; w /= 2)
          for (int64_t q = 0; q < w; ++q) lane[q] = lane[q] + lane[q + w];
        S = lane[0];
      }
      const float inv = torch ? 1.0f / S : 1.0f / (S + 1e-6f);
      for (int64_t j = a; j <= e; ++j)
        L[j - base] = torch ? L[j - base] * inv : round_to(s_.q_format, L[j - base] * inv);
    }
    // pass 3: P·V
    for (int64_t t0 = (ulo / kTile) * kTile; t0 <= uhi; t0 += kTile) {
      const int64_t j0 = std::max(ulo, t0), j1 = std::min(uhi + 1, t0 + kTile);
      for (int64_t kvh = 0; kvh < s_.cache.num_kv_heads; ++kvh) {
      if (kvh == 0) prefetch_ahead(t0, uhi, false, true);
      select(kvh);
      deq_rows(false, j0, j1, how, sv_, vt_.data());
      for (size_t ri = 0; ri < rows_.size(); ++ri) {
        Row& r = rows_[ri];
        if (r.kvh != kvh) continue;
        const int64_t a = std::max(j0, torch ? 0 : r.lo), e = std::min(j1 - 1, torch ? seq_.seq_len - 1 : r.hi);
        if (a > e) continue;
        const float* L = logits_.data() + ri * static_cast<size_t>(span);
        HWY_DYNAMIC_DISPATCH(PvRows)(vt_.data() + (a - j0) * Dv_, L + (a - base), static_cast<size_t>(e - a + 1),
                                     static_cast<size_t>(Dv_), r.acc.data());
      }
      }
    }
    for (Row& r : rows_) {
      const int64_t oidx = ((seq_.q_begin + r.i) * s_.num_q_heads + r.h) * Dv_;
      for (int64_t d = 0; d < Dv_; ++d) {
        const float x = r.acc[static_cast<size_t>(d)];
        store_out(s_.out_format, a_.out, oidx + d, torch ? round_to(s_.q_format, x) : x);
      }
    }
  }

  // vllm-triton-unified (flashinfer = false) and flashinfer.
  void online(bool fi) {
    const float sm = static_cast<float>(s_.scale());
    const float cap = static_cast<float>(s_.softcap);
    const Deq how = fi ? Deq::raw : Deq::md;
    const bool tc = !fi && triton_tensor_cores(s_.q_format);  // vllm-triton-unified's tl.dot on HMMA.16816
    int64_t ulo = seq_.seq_len, uhi = -1;
    for (const Row& r : rows_) {
      ulo = std::min(ulo, r.lo);
      uhi = std::max(uhi, r.hi);
    }
    // A softmax tile of T keys (AttnSpec::tile, a multiple of 16): its dot products come from T/16 K tiles of 16.
    const int64_t T = s_.tile_keys();
    // With S segments (vllm-triton-unified's 3D kernel) each row keeps S states; tile t0 updates the state of its
    // segment t0 / (tps·T), all of them starting at M = −inf, L = 1, acc = 0 or at the guard's M = 0, L = 0 (ref:
    // row_triton_unified).
    const int64_t S = fi ? 0 : s_.segments, len = seq_.seq_len;
    const int64_t tps = S > 0 ? (len + S * T - 1) / (S * T) : 0, act = tps > 0 ? (len + tps * T - 1) / (tps * T) : 0;
    // where the kernel's first tile holds none of the row's keys, a pass starts from M = 0, L = 0 (the guard)
    auto zero = [&](const Row& r, int64_t seg) {
      return triton_starts_at_zero(s_, len, seq_.q_len, r.i, r.lo, r.hi, seg);
    };
    for (Row& r : rows_) {
      if (S > 0) {
        r.segM.assign(static_cast<size_t>(S), kNegInf);
        r.segL.assign(static_cast<size_t>(S), 1.0f);
        r.segAcc.assign(static_cast<size_t>(S * Dv_), 0.0f);
        for (int64_t sg = 0; sg < act; ++sg)
          if (zero(r, sg)) r.segM[static_cast<size_t>(sg)] = r.segL[static_cast<size_t>(sg)] = 0.0f;
      } else if (zero(r, -1)) {
        r.M = r.L = 0.0f;
      }
    }
    std::vector<float> x(static_cast<size_t>(T)), p(static_cast<size_t>(T));
    vt_.resize(static_cast<size_t>(Dv_ * T));
    // one softmax tile: keys [t0, tend), tend <= t0 + T (a split-KV chunk may end a tile early)
    auto tile = [&](int64_t t0, int64_t tend) {
      const int64_t j0 = std::max(ulo, t0), j1 = std::min(uhi + 1, tend);
      for (int64_t kvh = 0; kvh < s_.cache.num_kv_heads; ++kvh) {
      if (kvh == 0) prefetch_ahead(t0, uhi, true, true, T);
      select(kvh);
      const float c2 = static_cast<float>(s_.scale() * static_cast<double>(sk_)) * 1.44269504088896340736f;
      for (int64_t k0 = t0; k0 < j1; k0 += kTile) {
        const int64_t a = std::max(j0, k0), e = std::min(j1, k0 + kTile);
        if (a >= e) continue;
        k_tile(k0, a, e, how, 0.0f);
        if (tc) tc_dots(kvh, static_cast<size_t>(T), k0 - t0, a - k0, e - k0);
        else all_dots(kvh, static_cast<size_t>(T), static_cast<size_t>(k0 - t0));
      }
      deq_rows(false, j0, j1, how, sv_, vt_.data());
      for (size_t ri = 0; ri < rows_.size(); ++ri) {
        Row& r = rows_[ri];
        if (r.kvh != kvh) continue;
        const int64_t a = std::max(r.lo, t0), e = std::min(r.hi, tend - 1);
        if (a > e) continue;
        const float* dots = dots_.data() + ri * static_cast<size_t>(T);
        const int64_t n = e - a + 1;
        const size_t seg = S > 0 ? static_cast<size_t>(t0 / (tps * T)) : 0;
        float& rM = S > 0 ? r.segM[seg] : r.M;
        float& rL = S > 0 ? r.segL[seg] : r.L;
        float* racc = S > 0 ? r.segAcc.data() + seg * static_cast<size_t>(Dv_) : r.acc.data();
        float mt = rM;
        for (int64_t j = a; j <= e; ++j) {
          float v;
          if (fi) {
            v = dots[j - t0] * c2;
          } else {
            v = sm * dots[j - t0];
            if (cap > 0) v = ref::triton_softcap(v, cap);
          }
          x[j - a] = v;
          mt = std::max(mt, v);
        }
        float alpha;
        if (fi) alpha = rM == kNegInf ? 0.0f : fp8ref::ref::mufu_ex2(rM - mt);
        else alpha = rM == kNegInf ? 0.0f : fp8ref::ref::triton_exp(rM - mt);
        for (int64_t j = 0; j < n; ++j) x[j] = x[j] - mt;
        if (fi) {  // FlashInfer: the GPU's exp2 (MUFU.EX2, table lookups)
          for (int64_t j = 0; j < n; ++j) p[j] = fp8ref::ref::mufu_ex2(x[j]);
        } else {  // vLLM: tl.exp (ex2.approx of RN32(x·log2 e))
          for (int64_t j = 0; j < n; ++j) p[j] = fp8ref::ref::triton_exp(x[j]);
        }
        const float* vt = vt_.data() + (a - j0) * Dv_;
        if (fi) {
          rL = rL * alpha;
          for (int64_t j = 0; j < n; ++j) rL = rL + p[j];
        } else {
          // l_j = tl.sum(P) over the tile's T slots in Triton's order (0 where the row sees no key); L = fma
          prow_.assign(static_cast<size_t>(T), 0.0f);
          std::copy(p.begin(), p.begin() + n, prow_.begin() + (a - t0));
          const float lsum = ref::triton_row_sum(prow_.data(), T);
          for (int64_t j = 0; j < n; ++j) p[j] = round_to(s_.q_format, p[j]);
          rL = std::fma(rL, alpha, lsum);
        }
        if (tc) pv_tc(vt, p.data(), a - t0, n, T, racc, alpha);
        else HWY_DYNAMIC_DISPATCH(PvTile)(vt, p.data(), static_cast<size_t>(n), static_cast<size_t>(Dv_), racc, alpha, !fi);
        rM = mt;
      }
      }
    };
    // flashinfer split-KV (kv_chunk C, a sequence of more than one chunk): each chunk a pass from m = −inf, d = 1,
    // o = 0 with tiles from its start, its state kept (segAcc: o, segM: m, segL: d), then flashinfer_merge_chunks
    const int64_t C = fi ? s_.kv_chunk : 0;
    const bool split = C > 0 && len > C;
    if (split) {
      const int64_t nc = (len + C - 1) / C;
      for (Row& r : rows_) {
        r.segAcc.assign(static_cast<size_t>(nc * Dv_), 0.0f);
        r.segM.assign(static_cast<size_t>(nc), kNegInf);
        r.segL.assign(static_cast<size_t>(nc), 1.0f);
      }
      for (int64_t c = 0; c < nc; ++c) {
        const int64_t c0 = c * C, c1 = std::min(len, c0 + C), lo = std::max(ulo, c0), hi = std::min(uhi, c1 - 1);
        for (Row& r : rows_) {
          r.M = kNegInf;
          r.L = 1.0f;
          std::fill(r.acc.begin(), r.acc.end(), 0.0f);
        }
        for (int64_t t0 = c0 + (lo - c0) / T * T; t0 <= hi; t0 += T) tile(t0, std::min(t0 + T, c1));
        for (Row& r : rows_) {
          std::copy(r.acc.begin(), r.acc.end(), r.segAcc.begin() + c * Dv_);
          r.segM[static_cast<size_t>(c)] = r.M;
          r.segL[static_cast<size_t>(c)] = r.L;
        }
      }
      for (Row& r : rows_) {
        ref::flashinfer_merge_chunks(r.segAcc.data(), r.segM.data(), r.segL.data(), nc, Dv_, s_.out_format, r.acc.data());
        r.L = 1.0f;  // (the merge's own normalization: rcp(1) = 1 below)
      }
    } else {
      for (int64_t t0 = (std::max<int64_t>(ulo, 0) / T) * T; t0 <= uhi; t0 += T) tile(t0, t0 + T);
    }
    for (Row& r : rows_) {
      const int64_t oidx = ((seq_.q_begin + r.i) * s_.num_q_heads + r.h) * Dv_;
      if (S > 0) {  // reduce_segments into acc, with L = 1 (the division there is the reduce's own)
        ref::triton_reduce_segments(r.segM.data(), r.segL.data(), r.segAcc.data(), S, act, Dv_, r.acc.data());
        r.L = 1.0f;
      }
      const float rcp = fi ? ref::mufu_rcp(r.L) : 0.0f;  // (flashinfer: o·rcp(d), the kernel's OutputTransform)
      if (s_.out_scale > 0) {  // vLLM's fused output quantization (ref::triton_fp8_out)
        const float inv = 1.0f / static_cast<float>(s_.out_scale);
        for (int64_t d = 0; d < Dv_; ++d)
          static_cast<uint8_t*>(a_.out)[oidx + d] =
              ref::triton_fp8_out(fp8ref::ref::triton_nv_div(r.acc[static_cast<size_t>(d)], r.L), inv);
        continue;
      }
      for (int64_t d = 0; d < Dv_; ++d) {
        float o = fi ? r.acc[static_cast<size_t>(d)] * rcp : fp8ref::ref::triton_nv_div(r.acc[static_cast<size_t>(d)], r.L);
        if (fi) {
          const float sv = svs_[static_cast<size_t>(r.kvh)];
          o = round_to(s_.out_format, o);
          if (sv != 1.0f) o = round_to(s_.out_format, o * sv);
        }
        store_out(s_.out_format, a_.out, oidx + d, o);
      }
    }
  }

  void finish_rows_zero() {
    for (Row& r : rows_) {
      const int64_t oidx = ((seq_.q_begin + r.i) * s_.num_q_heads + r.h) * Dv_;
      for (int64_t d = 0; d < Dv_; ++d) store_out(s_.out_format, a_.out, oidx + d, 0.0f);
    }
  }

  const AttnSpec& s_;
  const AttnArgs& a_;
  int64_t Dk_, Dv_, G_, kvh_ = 0;
  CacheShape vshape_;
  bool e5m2_;
  SeqPages seq_;
  float sk_ = 1, sv_ = 1;
  std::vector<float> sks_, svs_;  // per KV head
  std::vector<Row> rows_;
  std::vector<float> kT_, kr_, vt_, logits_, dots_, tmp_, pt_, vcol_, prow_;
  std::vector<Kw4Step> kw4_[2];  // (kw4_steps: for Dk_, and for one other length)
  int64_t kw4_n_[2] = {-1, -1};
  bool lut_ok_ = false;
  Deq lut_how_ = Deq::md;
  std::vector<float> lut_;        // [Hkv][K, V][256]
  std::vector<uint8_t> lut_sym_;  // [Hkv][K, V]
  std::vector<const float*> qptr_;
  std::vector<size_t> idx_;
};

}  // namespace

void paged_attention(const AttnSpec& spec, const AttnArgs& args) {
  if (spec.convention == AttnConvention::fast) return paged_attention_fast(spec, args);  // src/cpu/attention_fast.cc
  check_paged_attention(spec, args);
  if (spec.convention == AttnConvention::exact) {
    // The exact convention is the f64 reference path itself (paged_attention_head), run in parallel.
    const int64_t n = args.num_seqs * spec.num_q_heads;
#pragma omp parallel for schedule(dynamic)
    for (int64_t u = 0; u < n; ++u) ref::paged_attention_head(spec, args, u / spec.num_q_heads, u % spec.num_q_heads, nullptr);
    return;
  }
  constexpr int64_t kChunk = 4;  // query positions per unit
  const AttnSpec rs = resolve_launch(spec, args);  // vLLM's 2D or 3D kernel; FlashInfer's split-KV chunks and q tile
  std::vector<Unit> units;
  std::vector<int64_t> fi_prefill;  // flashinfer: the sequences that run FlashInfer's tensor-core prefill kernel
  for (int64_t b = 0; b < args.num_seqs; ++b) {
    const SeqPages s = seq_pages(spec, args, b);
    if (flashinfer_takes_prefill(rs, s)) {
      fi_prefill.push_back(b);
      continue;
    }
    for (int64_t i = 0; i < s.q_len; i += kChunk) units.push_back({b, i, std::min(s.q_len, i + kChunk)});
  }
  // Those run the reference's rows per (sequence, q head), in parallel, their QK and P·V HMMA.16816 steps in this
  // target's lanes (hmma16_lanes: the same arithmetic as ref::hmma16_step).
  const int64_t np = static_cast<int64_t>(fi_prefill.size()) * rs.num_q_heads;
  const ref::HmmaLanes lanes{hmma16_lanes, float_lanes()};
#pragma omp parallel for schedule(dynamic)
  for (int64_t u = 0; u < np; ++u)
    ref::paged_attention_head(rs, args, fi_prefill[static_cast<size_t>(u / rs.num_q_heads)], u % rs.num_q_heads, nullptr,
                              lanes);
  const int64_t nu = static_cast<int64_t>(units.size());
#pragma omp parallel
  {
    Worker w(rs, args);
#pragma omp for schedule(dynamic)
    for (int64_t u = 0; u < nu; ++u) w.run(units[static_cast<size_t>(u)]);
  }
}

void exp_sleef(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(ExpArray)(x, y, n, false); }
void hmma16_lanes(Format f, const float* a, int n, int k_lo, int k_hi, const float* b, ptrdiff_t row0, size_t stride,
                  float* c, size_t l0, size_t l1) {
  int kidx[16];
  for (int k = 0; k < n; ++k) kidx[k] = k;
  HWY_DYNAMIC_DISPATCH(HmmaLanes)(static_cast<uint8_t>(f), a, kidx, n, k_lo, k_hi, b, row0, stride, c, l0, l1);
}
size_t float_lanes() { return HWY_DYNAMIC_DISPATCH(FloatLanes)(); }
void exp2_sleef(const float* x, float* y, size_t n) { HWY_DYNAMIC_DISPATCH(ExpArray)(x, y, n, true); }

}  // namespace attn::cpu
}  // namespace fp8ref
#endif  // HWY_ONCE

#if HWY_ONCE
#include "fp8ref/quant.h"

namespace fp8ref::attn::cpu {
namespace {

int md_kind(Format md) { return md == Format::f32 ? 0 : md == Format::bf16 ? 1 : 2; }

// Dynamic scales (the Spyre rule, ref::kv_dynamic_scale) of x: the row maxima (vector lanes, OpenMP over tokens),
// then per scale group in token order.
void dynamic_scales(const KvWriteSpec& spec, const KvWriteArgs& a, const void* x, float range, float* out) {
  const int64_t T = a.num_tokens, H = spec.cache.num_kv_heads, D = spec.cache.head_dim;
  const size_t es = spec.model == Format::f32 ? 4 : 2;
  std::vector<uint32_t> rm(static_cast<size_t>(T * H));
  constexpr int64_t kTok = 256;
#pragma omp parallel for schedule(static)
  for (int64_t t0 = 0; t0 < T; t0 += kTok)
    HWY_DYNAMIC_DISPATCH(KvRowAbsMax)(md_kind(spec.model), static_cast<const uint8_t*>(x) + static_cast<size_t>(t0 * H * D) * es,
                                      static_cast<size_t>(std::min(kTok, T - t0) * H), static_cast<size_t>(D),
                                      rm.data() + t0 * H);
  std::vector<uint32_t> g(static_cast<size_t>(num_scales(spec.scale_kind, H, a.num_seqs)), 0u);
  int64_t b = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (spec.scale_kind == KvScaleKind::seq)
      while (b + 1 < a.num_seqs && t >= a.query_start_loc[b + 1]) ++b;
    for (int64_t h = 0; h < H; ++h) {
      uint32_t& m = g[static_cast<size_t>(scale_index(spec.scale_kind, b, h))];
      m = std::max(m, rm[static_cast<size_t>(t * H + h)]);
    }
  }
  for (size_t i = 0; i < g.size(); ++i)
    out[i] = ref::kv_dynamic_scale(spec.model, g[i] > 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : f32_from_bits(g[i]),
                                   range);
}

}  // namespace

// Scales first (dynamic: computed as in the reference), then blocks of 512 tokens: the codes of the block's
// [n, Hkv·D] rows (one scale per (token, KV head) row) into scratch, then each row copied to its slot in token order
// (a slot written twice keeps the last write, as in the reference). The codes, per convention:
//   vllm-cuda  code = satfinite_RNE(RN32(f32(x)/s)): the static group quantization x/s, no clamp, the cuda-satfinite
//              cast — cpu::quantize_static (src/cpu/quant_cpu.cc; bit-identical to ref::quantize_static by its tests);
//   sglang, spyre  RN_md(RN32(f32(x)/s)) by vector lanes (KvMdQuotRows), then the torch-2.11 cast md -> fp8 of the
//              vector converter (cpu::encode_bits16 / encode_f32);
//   exact      the f64 quotient f64(x)/f64(s) (one rounding of the exact quotient at the FP8 position, see the
//              reference), rounded to odd in f32 (fp8ref::f32_round_to_odd, include/fp8ref/format.h), then the exact
//              cast of the vector converter from f32 (cpu::encode_f32): the two roundings are one RNE of the quotient
//              (f32 keeps 24 bits against FP8's <= 4, its quantum 2^-149 far below FP8's 2^-16; beyond the f32 range
//              the odd FLT_MAX overflows every FP8 format as the quotient does).
// Scratch per call: 2·512·Hkv·D code bytes, 512·Hkv·D intermediates (md or f64), 2·512·Hkv scales.
void kv_cache_write(const KvWriteSpec& spec, const KvWriteArgs& a) {
  check_kv_cache_write(spec, a);
  if (spec.dynamic) {
    dynamic_scales(spec, a, a.k, 200.0f, a.k_scale);
    dynamic_scales(spec, a, a.v, 100.0f, a.v_scale);
  }
  const CacheShape& c = spec.cache;
  const int64_t T = a.num_tokens, H = c.num_kv_heads, D = c.head_dim;
  if (T == 0 || H == 0 || D == 0) return;
  const int md = md_kind(spec.model);
  const size_t es = md == 0 ? 4 : 2;
  QuantSpec q;
  ConversionSpec cast;
  if (spec.convention == StoreConvention::vllm_cuda) {
    q.convention = "kv-cache-write:vllm-cuda";
    q.to = c.format;
    q.granularity = Granularity{GranularityKind::group, 1, D};
    q.formula = QuantFormula::div;
    q.clamp = Clamp::none;
    q.cast_convention = "cuda-satfinite";
    finalize_quant_spec(&q, false);
  } else {
    const bool exact = spec.convention == StoreConvention::exact;
    std::string err;
    const std::optional<ConversionSpec> cs =
        resolve_convention(exact ? "exact" : "torch-2.11", exact ? Format::f32 : spec.model, c.format, &err);
    if (!cs) throw InputError("kv_cache_write: " + err);
    cast = *cs;
  }
  constexpr int64_t kTokens = 512;  // tokens per block
  const int64_t Tb = std::min(T, kTokens);
  std::vector<float> sk(static_cast<size_t>(Tb * H)), sv(sk.size());
  std::vector<uint8_t> ck(static_cast<size_t>(Tb * H * D)), cv(ck.size());
  std::vector<float> odd;       // exact: the f64 quotients rounded to odd in f32
  std::vector<uint8_t> md_buf;  // sglang/spyre: md quotients
  if (spec.convention == StoreConvention::exact) odd.resize(ck.size());
  else if (spec.convention != StoreConvention::vllm_cuda) md_buf.resize(ck.size() * es);
  // the codes of rows [0, n·H) of x (block-local) with row scales sc
  auto codes = [&](const uint8_t* x, int64_t n, const float* sc, uint8_t* out) {
    const int64_t rows = n * H;
    const size_t cnt = static_cast<size_t>(rows * D);
    switch (spec.convention) {
      case StoreConvention::vllm_cuda:
        fp8ref::cpu::quantize_static(q, spec.model, x, {n, H * D}, sc, out);
        return;
      case StoreConvention::exact: {
        const auto quot = [&](auto load) {
#pragma omp parallel for schedule(static)
          for (int64_t r = 0; r < rows; ++r) {
            const double sr = sc[r];
            for (int64_t d = 0; d < D; ++d)
              odd[static_cast<size_t>(r * D + d)] = f32_round_to_odd(static_cast<double>(load(r * D + d)) / sr);
          }
        };
        if (md == 0) quot([&](int64_t i) { return reinterpret_cast<const float*>(x)[i]; });
        else if (md == 1)
          quot([&](int64_t i) { return f32_from_bits(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(x)[i]) << 16); });
        else quot([&](int64_t i) { return fp8ref::ref::load_f32(Format::f16, x, i); });
        fp8ref::cpu::encode_f32(odd.data(), out, cnt, cast);
        return;
      }
      default: {
        constexpr int64_t kRowsPer = 64;
#pragma omp parallel for schedule(static)
        for (int64_t r0 = 0; r0 < rows; r0 += kRowsPer)
          HWY_DYNAMIC_DISPATCH(KvMdQuotRows)(md, x + static_cast<size_t>(r0 * D) * es, static_cast<size_t>(std::min(kRowsPer, rows - r0)),
                                             static_cast<size_t>(D), sc + r0, md_buf.data() + static_cast<size_t>(r0 * D) * es);
        if (md == 0) fp8ref::cpu::encode_f32(reinterpret_cast<const float*>(md_buf.data()), out, cnt, cast);
        else fp8ref::cpu::encode_bits16(spec.model, reinterpret_cast<const uint16_t*>(md_buf.data()), out, cnt, cast);
        return;
      }
    }
  };
  int64_t b = 0;  // the sequence of token t (scale kind seq)
  for (int64_t t0 = 0; t0 < T; t0 += Tb) {
    const int64_t n = std::min(Tb, T - t0);
    for (int64_t t = t0; t < t0 + n; ++t) {
      if (spec.scale_kind == KvScaleKind::seq)
        while (b + 1 < a.num_seqs && t >= a.query_start_loc[b + 1]) ++b;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t si = scale_index(spec.scale_kind, b, h);
        sk[static_cast<size_t>((t - t0) * H + h)] = a.k_scale[si];
        sv[static_cast<size_t>((t - t0) * H + h)] = a.v_scale[si];
      }
    }
    const size_t at = static_cast<size_t>(t0 * H * D) * es;
    codes(static_cast<const uint8_t*>(a.k) + at, n, sk.data(), ck.data());
    codes(static_cast<const uint8_t*>(a.v) + at, n, sv.data(), cv.data());
    for (int64_t t = t0; t < t0 + n; ++t) {
      const int64_t slot = a.slot_mapping[t];
      if (slot < 0) continue;
      const int64_t blk = slot / c.block_size, off = slot % c.block_size;
      for (int64_t h = 0; h < H; ++h) {
        const size_t src = static_cast<size_t>(((t - t0) * H + h) * D);
        std::memcpy(a.k_cache + c.offset(blk, off, h), ck.data() + src, static_cast<size_t>(D));
        std::memcpy(a.v_cache + c.offset(blk, off, h), cv.data() + src, static_cast<size_t>(D));
      }
    }
  }
}
}  // namespace fp8ref::attn::cpu
#endif

// fp8ref CPU backend — lane kernels shared by the group quant (src/cpu/quant_cpu.cc) and rmsnorm_quant
// (src/cpu/rmsnorm_quant_cpu.cc): the e4m3fn RNE cast of clamped magnitudes, the 4-vector code packer and the
// Markstein FMA division. Highway per-target header: include it after <hwy/highway.h> in a file compiled through
// <hwy/foreach_target.h> (the toggle below re-includes it once per target).
//
// CastE4m3Mag(a): a = the f32 bits of a magnitude in [+0, 448] (a clamp left it there: no NaN, no Inf, no sign).
//   The e4m3fn RNE code, by one f32 add for every binade: with E = max(exponent(a), -6) and C = 2^(E+20), the ulp of
//   C is 2^(E-3) — the e4m3fn quantum of a's binade (normals: 3 fraction bits; E = -6 also covers the subnormals,
//   quantum 2^-9) — so a + C rounds a to that quantum, RNE, in one rounding (C's bit at the quantum is 0: ties go to
//   an even count of quanta, the even e4m3 code), and a + C < 2^(E+21) stays in C's binade. Then
//   k = bits(a + C) − bits(C) in [0, 16] counts the quanta and the code is k + 8·(E + 6) (k = 16 is the next binade's
//   first code, as it should be). In u32 lanes: e = max(a & 0x7F800000, bits(2^-6)); C = e + (20 << 23);
//   code = bits(a + C) − e + (e >> 20) − ((20 << 23) + 8·121).
//   f32 subnormal magnitudes (E = −6 after the max) are exact operands of the add.
// CastE4m3(t): the signed form for values a NaN-replacing clamp left finite in [−448, 448]: the code of |t| with
//   t's sign as bit 7 (−0 -> 0x80).
// StoreCodes4: four vectors of codes (u32 lanes, each <= 0xFF) -> 4·N bytes in order.
// MarksteinDiv(y, a, b): RN(y / a) for b = RN(1/a):
//   q0 = RN(y·b); q1 = RN(q0 + RN(y − a·q0)·b); q2 = RN(q1 + RN(y − a·q1)·b) (remainders exact by the FMA)
//   q1 is within one ulp of y/a and b within half an ulp of 1/a, so q2 = RN(y/a) (Markstein's theorem; Muller et
//   al., Handbook of Floating-Point Arithmetic, §4.7) provided nothing under/overflows: a in ±[2^-60, 2^60] and
//   |y| in [2^-60, 2^60] suffice (quant_cpu.cc, Quotient). y = ±0 may come back as +0 (the caller fixes the sign).
// MarksteinDiv1(y, a, b): q1 alone, which is already RN(y / a) when y has at most 11 significant bits (bf16 and
//   f16 values; the same ranges): q0 need not be within one ulp (it is not always), so this rests on an exhaustive
//   check instead of the theorem — every y mantissa of 8 and of 11 bits against every a mantissa (2^30 and 2^33
//   pairs; exponents only shift every step), q1 against the IEEE division: 0 differences
//   (cpu::division_failures, tests/exhaustive_division.cc). f32 sources keep MarksteinDiv.
#if defined(FP8REF_CPU_FP8_LANES_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef FP8REF_CPU_FP8_LANES_INL_H_
#undef FP8REF_CPU_FP8_LANES_INL_H_
#else
#define FP8REF_CPU_FP8_LANES_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace fp8_lanes {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

HWY_INLINE VU CastE4m3Mag(VU a) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  // AVX-512: C and −bits(C) + 8·(E + 6) by two dword permutations indexed by the biased exponent max(E, −6) + 127
  // in [121, 135] (a <= 448 < 2^9): 15 values, distinct mod 16 (vpermd reads the index's low 4 bits).
  const __m512i i = _mm512_srli_epi32(_mm512_max_epu32(a.raw, _mm512_set1_epi32(0x3C800000)), 23);
  alignas(64) static constexpr uint32_t kC[16] = {
      (128u + 20u) << 23, (129u + 20u) << 23, (130u + 20u) << 23, (131u + 20u) << 23, (132u + 20u) << 23,
      (133u + 20u) << 23, (134u + 20u) << 23, (135u + 20u) << 23, 0u,                 (121u + 20u) << 23,
      (122u + 20u) << 23, (123u + 20u) << 23, (124u + 20u) << 23, (125u + 20u) << 23, (126u + 20u) << 23,
      (127u + 20u) << 23};
  alignas(64) static constexpr uint32_t kOff[16] = {
      8u * 7u - (kC[0]),   8u * 8u - (kC[1]),   8u * 9u - (kC[2]),   8u * 10u - (kC[3]),  8u * 11u - (kC[4]),
      8u * 12u - (kC[5]),  8u * 13u - (kC[6]),  8u * 14u - (kC[7]),  0u,                  8u * 0u - (kC[9]),
      8u * 1u - (kC[10]),  8u * 2u - (kC[11]),  8u * 3u - (kC[12]),  8u * 4u - (kC[13]),  8u * 5u - (kC[14]),
      8u * 6u - (kC[15])};
  const __m512i c = _mm512_permutexvar_epi32(i, _mm512_load_si512(kC));
  const __m512i t = _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a.raw), _mm512_castsi512_ps(c)));
  return VU{_mm512_add_epi32(t, _mm512_permutexvar_epi32(i, _mm512_load_si512(kOff)))};
#else
  // Elsewhere C' = C + 8·(E + 6) ulps of C: the same quantum and the same ties (8·(E + 6) is even), and the low
  // mantissa bits of a + C' are k + 8·(E + 6) = the code itself (<= 126: no carry into the exponent), so the code is
  // bits(a + C') & 0xFF. bits(C') = e + (20 << 23) + (e >> 20) − 8·121 with e = bits(2^max(E, -6)): 7 operations
  // (the form with bits(a + C) − bits(C) + 8·(E + 6) took 8; equal for every a in [+0, 448], checked exhaustively).
  const DF df;
  const DU du;
  const VU e = hn::Max(hn::And(a, hn::Set(du, 0x7F800000u)), hn::Set(du, 0x3C800000u));
  const VU c = hn::Add(hn::Add(e, hn::ShiftRight<20>(e)), hn::Set(du, (20u << 23) - 8u * 121u));
  return hn::And(hn::BitCast(du, hn::Add(hn::BitCast(df, a), hn::BitCast(df, c))), hn::Set(du, 0xFFu));
#endif
}

HWY_INLINE VU CastE4m3(VF t) {
  const DU du;
  const VU b = hn::BitCast(du, t);
  return hn::OrAnd(CastE4m3Mag(hn::And(b, hn::Set(du, 0x7FFFFFFFu))), hn::ShiftRight<24>(b), hn::Set(du, 0x80u));
}

// AVX-512 and AVX2: two packus_epi32, one packus_epi16 (exact: the values fit) and one dword permutation (the packs
// interleave per 128-bit block: block L holds dwords c0[L], c1[L], c2[L], c3[L]); elsewhere U8FromU32 per vector.
HWY_INLINE void StoreCodes4(VU c0, VU c1, VU c2, VU c3, uint8_t* dst) {
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  const __m512i w01 = _mm512_packus_epi32(c0.raw, c1.raw), w23 = _mm512_packus_epi32(c2.raw, c3.raw);
  const __m512i b = _mm512_packus_epi16(w01, w23);
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(reinterpret_cast<void*>(dst), _mm512_permutexvar_epi32(idx, b));
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  // AVX2 likewise (per 128-bit block L: dwords c0[L], c1[L], c2[L], c3[L]), one 32-byte store instead of four
  // U8FromU32 + 8-byte stores
  const __m256i w01 = _mm256_packus_epi32(c0.raw, c1.raw), w23 = _mm256_packus_epi32(c2.raw, c3.raw);
  const __m256i b = _mm256_packus_epi16(w01, w23);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(d8);
  hn::StoreU(hn::U8FromU32(c0), d8, dst);
  hn::StoreU(hn::U8FromU32(c1), d8, dst + N);
  hn::StoreU(hn::U8FromU32(c2), d8, dst + 2 * N);
  hn::StoreU(hn::U8FromU32(c3), d8, dst + 3 * N);
#endif
}

#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
// AVX2: the codes of four vectors of clamped magnitudes (CastE4m3Mag), packed to 32 bytes with the sign bytes sg ORed
// in, in the packs' order (qwords 0, 2, 1, 3 of element order when v0..v3 hold consecutive elements): the caller puts
// them in order by one permutation.
HWY_INLINE __m256i CastPack32(__m256i v0, __m256i v1, __m256i v2, __m256i v3, __m256i sg) {
  const __m256i c0 = CastE4m3Mag(VU{v0}).raw, c1 = CastE4m3Mag(VU{v1}).raw;
  const __m256i c2 = CastE4m3Mag(VU{v2}).raw, c3 = CastE4m3Mag(VU{v3}).raw;
  return _mm256_or_si256(_mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3)), sg);
}
#endif

// RNE f32 -> bf16 bits in u32 lanes, with ref::narrow's NaN rule (sign and top payload kept, quieted).
HWY_INLINE VU RoundBf16Bits(VF v) {
  const DU du;
  const VU b = hn::BitCast(du, v);
  const VU lsb = hn::And(hn::ShiftRight<16>(b), hn::Set(du, 1u));
  const VU rounded = hn::ShiftRight<16>(hn::Add(hn::Add(b, hn::Set(du, 0x7FFFu)), lsb));
  const VU nan = hn::Or(hn::ShiftRight<16>(b), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), nan, rounded);
}

// f16 -> f32 (exact). x86 targets with F16C convert in hardware; elsewhere Highway 1.0.3's emulated PromoteTo is
// exact for zeros, subnormals and normals but turns Inf/NaN (exponent 31) into finite values, so those lanes are
// rebuilt: sign, all-ones exponent, the payload shifted up, NaNs quieted (as vcvtph2ps and ref::narrow do).
#undef FP8REF_NATIVE_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define FP8REF_NATIVE_F16 1
#else
#define FP8REF_NATIVE_F16 0
#endif
HWY_INLINE VF PromoteF16(const hwy::float16_t* p) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  const VF v = hn::PromoteTo(df, hn::LoadU(dh, p));
#if FP8REF_NATIVE_F16
  return v;
#else
  const DU du;
  const hn::Rebind<uint16_t, DF> d16;
  const VU h = hn::PromoteTo(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p)));
  const VU mant = hn::And(h, hn::Set(du, 0x3FFu));
  const VU special = hn::Or(hn::Or(hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u))), hn::Set(du, 0x7F800000u)),
                            hn::ShiftLeft<13>(mant));
  const VU quiet = hn::IfThenElseZero(hn::Ne(mant, hn::Zero(du)), hn::Set(du, 0x00400000u));
  const auto is_special = hn::RebindMask(df, hn::Eq(hn::And(h, hn::Set(du, 0x7C00u)), hn::Set(du, 0x7C00u)));
  return hn::IfThenElse(is_special, hn::BitCast(df, hn::Or(special, quiet)), v);
#endif
}

HWY_INLINE VF MarksteinDiv1(VF y, VF a, VF b) {
  const VF q0 = hn::Mul(y, b);
  return hn::MulAdd(hn::NegMulAdd(q0, a, y), b, q0);
}
HWY_INLINE VF MarksteinDiv(VF y, VF a, VF b) {
  const VF q1 = MarksteinDiv1(y, a, b);
  return hn::MulAdd(hn::NegMulAdd(q1, a, y), b, q1);
}
// kNarrow: y has at most 11 significant bits (bf16/f16 values), one correction; else two.
template <bool kNarrow>
HWY_INLINE VF MarksteinDivN(VF y, VF a, VF b) {
  if constexpr (kNarrow) return MarksteinDiv1(y, a, b);
  else return MarksteinDiv(y, a, b);
}
// FastDiv<kNarrow>(y, a, b): RN(y / a) for the fast element loops (the ranges of MarksteinDiv hold there). AVX2:
// vdivps itself. Zen 2 runs a ymm division in 3.5 cycles on its own divider, while the multiply and FMAs of
// MarksteinDivN take the pipes the cast's integer operations need (`python3 bench/pipe_pairs.py --ymm`: an FMA with a
// vpaddd 0.97 cycles per pair, more than the 0.50 + 0.33 of each alone): bench_quant vllm-group, 2 threads, 4.47 ->
// 3.92 ms (session 35). AVX-512 and other targets with a fused multiply-add keep MarksteinDivN, as before (vdivps not
// measured there: no AVX-512 CPU in session 35). Targets without one (SSE4, SSSE3, EMU128/scalar: MulAdd is a multiply
// and an add, two roundings, so the corrections are not exact) divide too: rmsnorm_quant's fast groups on SSE4 coded a
// quotient at an e4m3 tie (−3.5·2^-9: 0x84) as 0x83 (session 38; tests/test_rmsnorm_quant.cc, weights of every
// magnitude).
template <bool kNarrow>
HWY_INLINE VF FastDiv(VF y, VF a, VF b) {
#if (HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86) || !HWY_NATIVE_FMA
  (void)b;
  return hn::Div(y, a);
#else
  return MarksteinDivN<kNarrow>(y, a, b);
#endif
}

}  // namespace fp8_lanes
}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // FP8REF_CPU_FP8_LANES_INL_H_

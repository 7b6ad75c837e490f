// fp8ref CPU backend — quantize / quantize_static / dequantize (the contract: include/fp8ref/quant.h, steps 1–9),
// bit-identical to the reference (reference/quant_ref.cc) for every spec. Highway dynamic dispatch + OpenMP.
//
// ---- Which specs are vectorised (the one place that says it; cpu::quant_path returns the same answer) ----------
// Vectorised: every source (f32/bf16/f16), target, granularity (tensor, row, col, group:G, block:BmxBk, mx:32),
// tail policy, amax-nan rule, guard, clamp and cast convention, with
//   scale-formula amax/max, amax*(1/max) or exact, scale-round rne / pow2-ceil / pow2-ceil-clamp / mx-floor, scale
//   dtypes f32 / bf16 / f16 / ue8m0 (both stores) — the scales per group (vectors of groups where they are f32);
//   formula x/s, x*(1/s), x*(max/amax), x*(max*rcp(amax)), x*rcp-bits(s), x*rcp-bits(s)@in, and exact (ue8m0
//   scales: an exact multiply by 2^-k; other scales: the f32 quotient corrected by its FMA remainder, "Exact
//   formula" below); div ieee and triton-nv.
// Run by the reference (ref::quantize / ref::quantize_static / ref::dequantize, called explicitly):
//   * calls that ask for exact.q / exact.x (the golden files' f64 tensors);
//   * empty tensors (nothing to vectorise);
//   * per chunk of a row, at run time: formula exact with non-power-of-two scales when an element or the scale
//     lies outside [2^-60, 2^60] (or is 0/Inf/NaN) — there the FMA remainder argument below does not apply, so the
//     chunk is quantized by ref::quantize_static with the scales just stored (identical by the contract: static
//     quantization with sv = the stored value) — and every such chunk on a SIMD target without native FMA.
//
// ---- Steps, as the reference orders them (contract steps in brackets) -----------------------------------------
// The named conventions' own step lists (research/quant-conventions.md §3–4, §10) are in src/core/
// quant_conventions.cc and at the top of reference/quant_ref.cc; every one is a setting of the fields below.
// [1, 2] amax: |y| as integer bits, monotone in the magnitude — bf16/f16 in their own 16-bit lanes (the group's
//   maximum widened once), f32 as is; elsewhere the source is widened exactly to f32 (bf16: << 16; f16: PromoteTo,
//   exact for numbers — a NaN's payload never matters: every NaN result is canonicalised). amax-nan=ignore zeroes
//   NaN lanes (fmaxf skips them; amax starts at +0); propagate keeps them, and an integer max above 0x7F800000 is
//   "a NaN was seen" -> the canonical 0x7FFFFFFF. Integer max is associative, so any split over threads and vectors
//   gives the reference's sequential result.
// [3–5] guards and the f32 scale, in f32 vectors, NaN rules as in the reference (fmaxf: NaN loses; torch.clamp:
//   NaN wins), every NaN result canonical. scale-formula exact with f32 scales equals amax/max: the exact quotient
//   rounded once to f32 is RN32(amax/max), and the min-scale floor commutes with a monotone rounding (its NaN is the
//   reference's f64 quiet NaN narrowed: 0x7FC00000). With bf16/f16/ue8m0 scales, scale-formula exact rounds the
//   f64 quotient once per group (exact_narrow_scale says why that is the exact quotient's rounding).
// [6] the stored scale: f32 as is; bf16/f16 by ref::narrow (integer RNE); ue8m0 by cpu::encode_f32 with the same
//   convert conventions the reference resolves (pow2-ceil, pow2-ceil-clamp; mx-floor: the "mx" convention on
//   amax, then - emax_elem, clipped at 0x00). The scale value sv is the stored one.
// [7] per element (one group's sv broadcast, or per-element scales for `col`):
//   x/s       v = RN(y / sv). The division: Markstein's FMA sequence with r = RN(1/sv):
//               q0 = RN(y·r); e = y − sv·q0 (exact, FMA); q1 = RN(q0 + e·r); e = y − sv·q1; q2 = RN(q1 + e·r)
//             q1 is within one ulp of y/sv and r within half an ulp of 1/sv, so q2 = RN(y/sv) (Markstein's theorem;
//             Muller et al., Handbook of Floating-Point Arithmetic, §4.7), provided nothing under/overflows: used
//             only when sv ∈ [2^-60, 2^60] and every lane's |y| ∈ {0} ∪ [2^-60, 2^60] (then y/sv and every remainder
//             are normal f32); y = ±0 takes q0 (keeps the sign). Any other vector divides (IEEE, exact).
//   x*(1/s)   v = RN(y · RN(1/sv));  x*(max/amax) v = RN(y · RN(max/amax));
//   x*(max*rcp(amax)) v = RN(y · RN(max · RN(1/amax))).
//   exact, ue8m0 scales: sv = 2^k, so y/sv = y·2^-k, exact in f32 unless it underflows (then it rounds to a value
//             below 2^-126, which every cast sends to ±0 exactly as the exact quotient) or overflows (then ±FLT_MAX
//             stands for the finite quotient: both are finite overflows of every cast, after any clamp). sv = 0,
//             ±Inf or NaN: IEEE y/sv, with 0/0 -> y (the contract's all-zero group).
//   exact, other scales (Exact formula): v = RN(y/sv) as for x/s and its remainder e = y − sv·v (exact). Every
//             decision point of the clamp and cast (FP8 values and midpoints: <= 5 significant bits; ±max) that
//             could separate y/sv from v is v itself; if v has <= 5 significant bits and e != 0, v moves one f32
//             ulp towards y/sv (the neighbour has 24 significant bits, so it is no decision point, and none lies
//             between it and y/sv). A neighbour that is ±max: the clamp leaves both unclamped and the cast sees no
//             decision point in between. Then v rounds like the exact quotient. Range as for x/s, else the chunk
//             goes to the reference (above).
//   div=triton-nv (Triton's div.full.f32, include/fp8ref/triton_div.h): a / y = RN(RN(a·f)·r) with f (1, 1/4 or
//             2^24) and r = MUFU.RCP(y·f) depending on y only — so per group x/s is two multiplies by constants
//             (f = 1: RN(y·1) = y), x*(1/s) and x*(max/amax) multiply by ref::triton_nv_div of the group, and the
//             scale amax/max is RN(RN(amax·f)·r) with max's (f, r).
//   x*rcp-bits(s): a multiply by the group's R (bits (254 − c) << 23); @in from bf16/f16: the product (exact in
//             f32) rounded once to the source type (bf16: integer RNE; f16: vcvtps2ph on AVX2/AVX-512, else the chunk
//             goes to the reference), R itself rounded to the source type per group.
//   The result's NaN is the canonical +NaN 0x7FFFFFFF (f32 formulas; the GPU model) or 0x7FC00000 (exact: the
//   reference's quiet NaN of the f64 quotient).
// [8] clamp in f32 vectors (NaN -> +max / -max / kept).
// [9] the cast: cpu::encode_f32 (src/cpu/convert_cpu.cc) on the chunk's v, with the spec's resolved cast — the
//   f32 value carries exactly the information the reference's f32 (or exact f64) value does.
//   In lanes instead (ElemConst::cast_lanes, set by make_ctx): e4m3fn with an RNE cast after a NaN-replacing clamp to
//   fp8-max <= 448, for x/s, x*(1/s) and Triton's x/s over groups — CastE4m3 on v in registers, four vectors packed
//   to 64 bytes (StoreCodes4); no f32 round trip through memory (vllm-group and the like). The cast and the packer
//   are src/cpu/fp8_lanes-inl.h's (shared with rmsnorm_quant).
//   Fast chunks (ElemFast; dynamic group/row quantization): e4m3fn, an RNE cast, a clamp to 0 < fp8-max <= 448 or
//   no clamp with a satfinite cast (deepseek-act-quant), x/s, x*(1/s) or Triton's x/s: when the chunk's elements
//   are all finite (AmaxGroups reports it; its max runs on raw |y| bits, a NaN group is rescanned for
//   amax-nan=ignore) and every group passes FastGroups (which states the argument: divisor in [2^-60, 2^60] with
//   max |y| <= sv·2^60 for x/s — quotients under 2^-11 may then be inexact but give code 0 — a finite
//   non-negative multiplier for x*(1/s), positive finite constants for Triton), the chunk is quantized with no
//   per-element range test and no NaN handling: the clamp as a u32 min of |v|'s bits, CastE4m3Mag, y's sign as
//   bit 7; bf16 on AVX-512 64 elements a step (|x| widened by interleaving with zero words, signs added under the
//   mask of x's sign bits); bf16 on AVX-512 also reads the next chunk's group maxima in the same loop (the
//   look-ahead: the next chunk then skips its AmaxGroups pass) and prefetches the chunk after it into L2; x/s by
//   fp8_lanes::FastDiv (AVX2: vdivps; elsewhere one FMA correction for the bf16/f16 quotients, MarksteinDiv1); the
//   clamp left out of chunks where FastGroups finds it changes no code. On CPUs with AVX512_BF16 + VBMI, bf16 chunks of
//   whole groups of a multiple of 64 take rmsnorm_quant's pass B on x itself instead (rq512::quant_bf16,
//   src/cpu/rmsnorm_quant_avx512.cc: the clamp by vrangeps, the cast by one permutation and one add, the codes put in
//   order by two vpermt2b and a blend, the sign ORed in from x's high bytes; the same look-ahead and prefetch) — the
//   same bits. Other chunks: as above.
// Dequantize: value(code) by rebiasing the exponent field (normals) or f32(fraction)·2^(1−bias−m) (subnormals),
//   exact; the sign OR-ed in, NaN/Inf codes set; one f32 multiply by sv
//   (= the reference's f64 product rounded once to f32); NaN -> 0x7FFFFFFF; bf16 output by integer RNE, f16 by
//   vcvtps2ph (AVX2/AVX-512; RNE, IEEE), else ref::narrow per element.
//
// ---- Parallel structure ---------------------------------------------------------------------------------------
// group/mx/row: one pass per chunk of a row (<= 8192 elements, whole groups): amax, scales, then the element pass
// while the chunk is still in L1/L2 (the input is read from memory once). block, tensor, col and groups longer than
// a chunk: an amax reduction over all rows (per-thread partial maxima combined by integer max), the scales, then
// the element pass. OpenMP splits rows × chunks statically; results never depend on the split.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/quant_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
// GCC 12 flags its own AVX-512 intrinsics (_mm512_undefined_*) as maybe-uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "cpu/fp8_lanes-inl.h"
#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/quant.h"

#ifndef FP8REF_QUANT_CPU_ONCE
#define FP8REF_QUANT_CPU_ONCE
namespace fp8ref::quant_cpu_detail {
// The per-element operation (step 7).
enum Op : uint32_t {
  kOpDiv = 0,    // a = sv, b = RN(1/sv) or 0 (divide)
  kOpMul = 1,    // a = the multiplier
  kOpPow2 = 2,   // a = 2^-k (exact inverse) or 0 (then b = sv: IEEE divide, 0/0 -> y)
  kOpExact = 3,  // a = sv, b = RN(1/sv) or 0 (the chunk goes to the reference)
  kOpTriton = 4, // div=triton-nv x/s: v = RN(RN(y·b)·a), a = MUFU.RCP(sv·b), b = the range factor (1, 1/4, 2^24)
  kOpMulIn = 5,  // x*rcp-bits(s)@in from bf16/f16: v = RN_in(y·a), a = RN_in(R) (NaN kept)
};
// What the per-group parameters are computed from (step 7's constants).
enum ParamKind : uint32_t { kPDiv, kPMulRcp, kPMaxDivAmax, kPMaxMulRcpAmax, kPPow2, kPExact, kPRcpBits, kPRcpBitsIn };
struct ElemConst {
  uint32_t op;
  uint32_t src;       // 1 bf16, 2 f16 (kOpMulIn)
  uint32_t clamp;     // Clamp
  float mx;           // fp8-max
  uint32_t nan_bits;  // the NaN v takes
  uint32_t cast_lanes;  // 1: step 9 in lanes (CastE4m3: RNE e4m3fn after a NaN-replacing clamp to max <= 448)
  uint32_t fast_cast;   // 1: finite chunks of "fast" groups take ElemFast (make_ctx and FastGroups say when)
  uint32_t fast_bound;  // ElemFast's clamp: the bits of fp8-max (a clamp) or of 448 (clamp=none)
  uint32_t fast_qmax;   // 1: clamp=none with a non-saturating cast: a group is fast only if its largest quotient
                        //    is < 464 (then every quotient rounds to at most 448: no overflow to handle)
};
struct ScaleConst {
  bool propagate;
  bool has_floor, has_min;
  float floor, min_scale;
  bool mul_rcp;  // scale-formula amax*(1/max), or div=triton-nv amax/max = RN(RN(amax·pre)·rcp_max)
  float max, rcp_max, pre;
  uint32_t nan_bits;  // a NaN scale: 0x7FFFFFFF (f32 arithmetic) or 0x7FC00000 (scale-formula exact: f64 quiet NaN)
};
// Dequantize: value(code) of magnitude bits c = code & 0x7F with m fraction bits: normal (c >> m != 0): the f32
// with bits (c << (23 - m)) + ((127 - bias) << 23); subnormal: f32(c) · 2^(1 - bias - m) (exact: c < 2^m); the sign
// OR-ed in; NaN/Inf codes by style. (No f32 subnormal operand ever reaches a multiply: they cost a microcode assist.)
struct DeqConst {
  uint32_t man_bits;  // m
  uint32_t rebias;    // (127 - bias) << 23
  float sub_mult;     // 2^(1 - bias - m)
  uint32_t style;     // 0 fn (0x7F NaN), 1 ieee (0x7C Inf, above NaN), 2 fnuz (0x80 NaN)
};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FP8REF_QUANT_DEQ_BF16 1
// 32 e4m3fn codes -> RN32(value·s) in two f32 vectors (codes 0..15, 16..31) and the mask of the NaN codes (0x7F,
// 0xFF): the code as an f16 — bits (c & 0x7F) << 7 with the sign at bit 15 are the value·2^-8, subnormals included
// (the e4m3fn exponent field is the low 4 bits of the f16 one) — widened exactly by vcvtph2ps, times S8 = s·2^8 (the
// scaling is exact for |s| < 2^120): the IEEE product of the value and s. Shared by DeqRangeT's AVX-512 loop and
// DeqE4m3Bf16Avx512Bf16, which round it to bf16 their own way.
__attribute__((target("avx512f,avx512bw,f16c"))) inline void DecodeE4m3x32(const uint8_t* q, __m512 S8, __m512* lo,
                                                                             __m512* hi, __mmask32* nan) {
  const __m512i k3f80 = _mm512_set1_epi16(0x3F80), k4000 = _mm512_set1_epi16(0x4000);
  const __m512i x = _mm512_slli_epi16(_mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))), 7);
  *nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, k3f80), k3f80);
  const __m512i h = _mm512_add_epi16(x, _mm512_and_si512(x, k4000));  // the sign from bit 14 to bit 15
  *lo = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(h)), S8);
  *hi = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)), S8);
}
// Dequantize e4m3fn -> bf16 for n codes (a multiple of 32) with one f32 scale s, |s| in [2^-117, 2^120): DecodeE4m3x32,
// rounded to bf16 by AVX512-BF16's vcvtne2ps2bf16 (RNE). That instruction flushes f32 subnormals, so the scale range
// keeps every product of a non-zero code normal (>= 2^-9·2^-117); an overflowed product is ±Inf either way. NaN codes
// -> 0x7FFF. Compiled for that extension only; callers test HasAvx512Bf16().
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,f16c"))) inline void DeqE4m3Bf16Avx512Bf16(
    const uint8_t* q, size_t n, float s, uint16_t* out) {
  const __m512 S8 = _mm512_set1_ps(s * 256.0f);
  for (size_t k = 0; k + 32 <= n; k += 32) {
    __m512 lo, hi;
    __mmask32 nan;
    DecodeE4m3x32(q + k, S8, &lo, &hi, &nan);
    const __m512i o = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);  // lanes 0..15 from lo, 16..31 from hi
    _mm512_storeu_si512(out + k, _mm512_mask_mov_epi16(o, nan, _mm512_set1_epi16(0x7FFF)));
  }
}
inline bool HasAvx512Bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#endif
}  // namespace fp8ref::quant_cpu_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using namespace quant_cpu_detail;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;
using MF = hn::Mask<DF>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);
constexpr uint32_t kCanon = 0x7FFFFFFFu;
#if HWY_NATIVE_FMA
constexpr bool kFma = true;
#else
constexpr bool kFma = false;
#endif

// ---- Sources: 0 = f32, 1 = bf16, 2 = f16; f32 bit patterns in u32 lanes --------------------------------------
template <int kSrc>
using SrcT = std::conditional_t<kSrc == 0, uint32_t, uint16_t>;

template <int kSrc>
HWY_INLINE VF LoadY(const SrcT<kSrc>* p) {
  const DF df;
  const DU du;
  if constexpr (kSrc == 0) {
    return hn::BitCast(df, hn::LoadU(du, p));
  } else if constexpr (kSrc == 1) {
    const hn::Rebind<uint16_t, DF> d16;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
  } else {
    return fp8_lanes::PromoteF16(reinterpret_cast<const hwy::float16_t*>(p));
  }
}
// The first `count` (< N) elements, the rest +0.
template <int kSrc>
HWY_INLINE VF LoadYN(const SrcT<kSrc>* p, size_t count) {
  HWY_ALIGN SrcT<kSrc> buf[kMaxLanes] = {};
  std::memcpy(buf, p, count * sizeof(SrcT<kSrc>));
  return LoadY<kSrc>(buf);
}

// |y| as integer bits for the max (step 2).
HWY_INLINE VU AbsBits(VF y, bool propagate) {
  const DU du;
  VU a = hn::And(hn::BitCast(du, y), hn::Set(du, 0x7FFFFFFFu));
  if (!propagate) a = hn::IfThenZeroElse(hn::Gt(a, hn::Set(du, 0x7F800000u)), a);
  return a;
}

// out[g - g0] = max(out[g - g0], max |y| over [k0, k1) ∩ group g) for the groups of size G in [k0, k1). The max runs
// on the raw |y| bits; a group whose maximum is a NaN (above 0x7F800000) is rescanned with NaN lanes zeroed when
// amax-nan=ignore. Returns whether every element in [k0, k1) is finite (no NaN, no Inf).
template <int kSrc>
bool AmaxGroupsT(const void* src, size_t k0, size_t k1, size_t G, bool propagate, size_t g0, uint32_t* out) {
  const DU du;
  const size_t N = hn::Lanes(du);
  const auto* s = static_cast<const SrcT<kSrc>*>(src);
  bool finite = true;
  size_t k = k0;
  while (k < k1) {
    const size_t g = k / G, kg = k;
    const size_t e = (g + 1) * G < k1 ? (g + 1) * G : k1;
    auto scan = [&](bool prop) {
      VU acc = hn::Zero(du);
      size_t i = kg;
      for (; i + N <= e; i += N) acc = hn::Max(acc, AbsBits(LoadY<kSrc>(s + i), prop));
      if (i < e) acc = hn::Max(acc, AbsBits(LoadYN<kSrc>(s + i, e - i), prop));
      return hn::GetLane(hn::MaxOfLanes(du, acc));
    };
    uint32_t m = scan(true);
    if (m >= 0x7F800000u) {
      finite = false;
      if (m > 0x7F800000u && !propagate) m = scan(false);
    }
    k = e;
    uint32_t& o = out[g - g0];
    if (m > o) o = m;
  }
  return finite;
}
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
// The u16 maximum of a vector: two halvings, then phminposuw on the complement (the minimum of ~x is ~max).
HWY_INLINE uint32_t MaxU16(__m512i acc) {
  const __m256i m256 = _mm256_max_epu16(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
  const __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(m256), _mm256_extracti128_si256(m256, 1));
  return ~static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi16(-1))))) & 0xFFFFu;
}
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
HWY_INLINE uint32_t MaxU16(__m256i acc) {
  const __m128i m128 = _mm_max_epu16(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
  return ~static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(_mm_xor_si128(m128, _mm_set1_epi16(-1))))) & 0xFFFFu;
}
#endif
#if HWY_TARGET != HWY_SCALAR
// The same for bf16 / f16 on their own 16-bit lanes (twice the lanes per vector): |x| bits are monotone there too;
// the group maximum is widened to f32 bits once (bf16: << 16; f16: exact widening). NaN: abs above the Inf bits.
template <int kSrc>
bool AmaxGroups16(const void* src, size_t k0, size_t k1, size_t G, bool propagate, size_t g0, uint32_t* out) {
  const DU du;
  const hn::Repartition<uint16_t, DU> d16;
  const hn::Half<decltype(d16)> dh;
  const size_t N = hn::Lanes(d16);
  const auto* s = static_cast<const uint16_t*>(src);
  const uint16_t inf16 = kSrc == 1 ? 0x7F80 : 0x7C00;
  const auto mag = hn::Set(d16, 0x7FFF), inf = hn::Set(d16, inf16);
  bool finite = true;
  size_t k = k0;
  while (k < k1) {
    const size_t g = k / G, kg = k;
    const size_t e = (g + 1) * G < k1 ? (g + 1) * G : k1;
    auto scan = [&](bool prop) {
      auto absv = [&](hn::Vec<decltype(d16)> v) {
        const auto a = hn::And(v, mag);
        return prop ? a : hn::IfThenZeroElse(hn::Gt(a, inf), a);
      };
      auto acc = hn::Zero(d16);
      size_t i = kg;
      // (the first read of the source: a software prefetch 4 KiB ahead, as convert_cpu.cc's streaming loop — the
      // hardware prefetchers alone leave one read stream per thread latency-bound on this VM; on the ElemFast path the
      // previous chunk's element pass has prefetched these lines already)
      for (; i + N <= e; i += N) {
        hwy::Prefetch(s + i + 2048);
        acc = hn::Max(acc, absv(hn::LoadU(d16, s + i)));
      }
      if (i < e) {
        HWY_ALIGN uint16_t buf[2 * kMaxLanes] = {};
        std::memcpy(buf, s + i, (e - i) * 2);
        acc = hn::Max(acc, absv(hn::Load(d16, buf)));
      }
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
      (void)dh;
      return MaxU16(acc.raw);
#else
      const VU m32 = hn::Max(hn::PromoteTo(du, hn::LowerHalf(dh, acc)), hn::PromoteTo(du, hn::UpperHalf(dh, acc)));
      return hn::GetLane(hn::MaxOfLanes(du, m32));
#endif
    };
    uint32_t m16 = scan(true);
    if (m16 >= inf16) {
      finite = false;
      if (m16 > inf16 && !propagate) m16 = scan(false);
    }
    k = e;
    const uint32_t m = kSrc == 1 ? m16 << 16 : static_cast<uint32_t>(ref::narrow(Format::f16, m16, Format::f32));
    uint32_t& o = out[g - g0];
    if (m > o) o = m;
  }
  return finite;
}
#endif

bool AmaxGroups(int src, const void* p, size_t k0, size_t k1, size_t G, bool propagate, size_t g0, uint32_t* out) {
#if HWY_TARGET != HWY_SCALAR
  if (src == 1) return AmaxGroups16<1>(p, k0, k1, G, propagate, g0, out);
  if (src == 2) return AmaxGroups16<2>(p, k0, k1, G, propagate, g0, out);
#endif
  if (src == 0) return AmaxGroupsT<0>(p, k0, k1, G, propagate, g0, out);
  if (src == 1) return AmaxGroupsT<1>(p, k0, k1, G, propagate, g0, out);
  return AmaxGroupsT<2>(p, k0, k1, G, propagate, g0, out);
}

// out[k] = max(out[k], |y[k]|) for k in [0, K) (per-column amax).
template <int kSrc>
void AmaxElemsT(const void* src, size_t K, bool propagate, uint32_t* out) {
  const DU du;
  const size_t N = hn::Lanes(du);
  const auto* s = static_cast<const SrcT<kSrc>*>(src);
  size_t k = 0;
  for (; k + N <= K; k += N) hn::StoreU(hn::Max(hn::LoadU(du, out + k), AbsBits(LoadY<kSrc>(s + k), propagate)), du, out + k);
  for (; k < K; ++k) {
    const uint32_t m = hn::GetLane(AbsBits(LoadYN<kSrc>(s + k, 1), propagate));
    if (m > out[k]) out[k] = m;
  }
}
void AmaxElems(int src, const void* p, size_t K, bool propagate, uint32_t* out) {
  if (src == 0) AmaxElemsT<0>(p, K, propagate, out);
  else if (src == 1) AmaxElemsT<1>(p, K, propagate, out);
  else AmaxElemsT<2>(p, K, propagate, out);
}

HWY_INLINE VF Canon(VF v, uint32_t nan_bits = kCanon) {
  const DF df;
  const DU du;
  return hn::IfThenElse(hn::IsNaN(v), hn::BitCast(df, hn::Set(du, nan_bits)), v);
}
// fmaxf (NaN loses) or torch.clamp (NaN wins, canonical) of v and a positive constant c.
HWY_INLINE VF GuardMax(VF v, float c, bool propagate) {
  const DF df;
  const VF cv = hn::Set(df, c);
  return hn::IfThenElse(hn::IsNaN(v), propagate ? Canon(v) : cv, hn::Max(v, cv));
}

// The first m lanes of v to p (a whole vector when m is the lane count).
HWY_INLINE void StoreFirst(VF v, size_t m, float* p) {
  const DF df;
  if (m == hn::Lanes(df)) {
    hn::StoreU(v, df, p);
    return;
  }
  HWY_ALIGN float o[kMaxLanes];
  hn::Store(v, df, o);
  std::memcpy(p, o, m * 4);
}

// Steps 3–5 for n groups: amax bits -> guarded amax and the f32 scale s (before the scale dtype).
void GroupScales(const uint32_t* amax_bits, size_t n, const ScaleConst& c, float* amax, float* s) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < n; i += N) {
    const size_t m = n - i < N ? n - i : N;
    VU ab;
    if (m == N) {
      ab = hn::LoadU(du, amax_bits + i);
    } else {
      HWY_ALIGN uint32_t in[kMaxLanes] = {};
      std::memcpy(in, amax_bits + i, m * 4);
      ab = hn::Load(du, in);
    }
    ab = hn::IfThenElse(hn::Gt(ab, hn::Set(du, 0x7F800000u)), hn::Set(du, kCanon), ab);
    VF a = hn::BitCast(df, ab);
    if (c.has_floor) a = GuardMax(a, c.floor, c.propagate);
    VF sv = c.mul_rcp ? hn::Mul(hn::Mul(a, hn::Set(df, c.pre)), hn::Set(df, c.rcp_max)) : hn::Div(a, hn::Set(df, c.max));
    sv = Canon(sv);
    if (c.has_min) sv = GuardMax(sv, c.min_scale, c.propagate);
    sv = Canon(sv, c.nan_bits);
    StoreFirst(a, m, amax + i);
    StoreFirst(sv, m, s + i);
  }
}

// |v| in [2^-60, 2^60], as f32 bits.
HWY_INLINE hn::Mask<DU> InRange(VU absbits) {
  const DU du;
  return hn::Not(hn::Gt(hn::Sub(absbits, hn::Set(du, 0x21800000u)), hn::Set(du, 0x5D800000u - 0x21800000u)));
}

// FastGroups: whether ElemFast may quantize groups [0, n) of a finite chunk (every |y| finite; amax_bits: each group's
// largest), each with its constants a, b: then every v is finite or overflows to ±Inf (clamped to the bound like any value beyond it), never NaN, and
// has y's sign; for x/s MarksteinDiv is exact where it matters:
//   x/s: b != 0 (b = RN(1/a) is set only for a in ±[2^-60, 2^60], and only on FMA targets), a > 0, max |y| <= a·2^60
//        (a·2^60 is exact). Quotients |y/a| >= 2^-11 then have |y| >= 2^-71: inside Quotient's range (no remainder
//        underflows; MarksteinDiv = RN(y/a)), and |y/a| <= 2^60. Quotients |y/a| < 2^-11 may have remainders that
//        underflow, but every step stays within 2^-11·(1 + 2^-21) + 2^-88 < 2^-10 (|b| <= 2^60): code 0 with y's
//        sign, as the reference's RN(y/a) (below the first e4m3fn midpoint 2^-10) gives.
//   x*(1/s): a finite and >= +0 (y·a: no NaN from finite y).
//   Triton's x/s RN(RN(y·b)·a): a and b finite and > 0 (an overflowed y·b times a stays ±Inf).
//   exact with ue8m0 scales, y·2^-k: a = 2^-k positive and finite (a = 0 marks sv = 0, Inf or NaN: IEEE division).
// qmax (ElemConst::fast_qmax): also the group's largest quotient — the op on amax, monotone in |y| — below 464.
// Returns 0 (not fast), 1 (fast), or 2: fast, and ElemFast's clamp (a u32 min of |v| with `bound`, the bits of a
// positive f32) changes no code, because every group's largest quotient `top` is <= bound, or < 464 with bound =
// 448 (the cast rounds (448, 464) to 448 itself) — ElemFast then skips the min (vllm-group: s = RN(amax/448) puts the
// top at 448·(1 ± 2^-23); 8 % of bench_quant's time on Zen 2, session 35).
// A vector of groups at a time (a partial vector padded with a = b = 1, amax 0: a passing group).
int FastGroups(uint32_t op, bool qmax, uint32_t bound, const float* a, const float* b, const uint32_t* amax_bits,
               size_t n) {
  bool clamp_free = true;
  float bf;
  std::memcpy(&bf, &bound, 4);
  const float free_below = bound == 0x43E00000u ? 464.0f : bf;  // 0x43E00000: 448
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  for (size_t i = 0; i < n; i += N) {
    VF av, bv, amax;
    if (i + N <= n) {
      av = hn::LoadU(df, a + i);
      bv = hn::LoadU(df, b + i);
      amax = hn::BitCast(df, hn::LoadU(du, amax_bits + i));
    } else {
      HWY_ALIGN float ta[kMaxLanes], tb[kMaxLanes];
      HWY_ALIGN uint32_t tm[kMaxLanes] = {};
      std::fill(ta, ta + N, 1.0f);
      std::fill(tb, tb + N, 1.0f);
      std::memcpy(ta, a + i, (n - i) * 4);
      std::memcpy(tb, b + i, (n - i) * 4);
      std::memcpy(tm, amax_bits + i, (n - i) * 4);
      av = hn::Load(df, ta);
      bv = hn::Load(df, tb);
      amax = hn::BitCast(df, hn::Load(du, tm));
    }
    const VU ab = hn::BitCast(du, av), bb = hn::BitCast(du, bv);
    const VU one = hn::Set(du, 1u), fin = hn::Set(du, 0x7F7FFFFFu);
    hn::Mask<DU> ok;
    VF top;
    switch (op) {
      case kOpDiv:
        ok = hn::And(hn::And(hn::Ne(bb, hn::Zero(du)), hn::Lt(ab, hn::Set(du, 0x80000000u))),
                     hn::RebindMask(du, hn::Le(amax, hn::Mul(av, hn::Set(df, 0x1p60f)))));
        top = hn::Div(amax, av);
        break;
      case kOpMul:
        ok = hn::Lt(ab, hn::Set(du, 0x7F800000u));
        top = hn::Mul(amax, av);
        break;
      case kOpPow2:
        ok = hn::Lt(hn::Sub(ab, one), fin);
        top = hn::Mul(amax, av);
        break;
      default:
        ok = hn::And(hn::Lt(hn::Sub(ab, one), fin), hn::Lt(hn::Sub(bb, one), fin));
        top = hn::Mul(hn::Mul(amax, bv), av);
        break;
    }
    if (qmax) ok = hn::And(ok, hn::RebindMask(du, hn::Lt(top, hn::Set(df, 464.0f))));
    if (!hn::AllTrue(du, ok)) return 0;
    const auto below = bound == 0x43E00000u ? hn::Lt(top, hn::Set(df, free_below)) : hn::Le(top, hn::Set(df, free_below));
    clamp_free = clamp_free && hn::AllTrue(df, below);
  }
  return clamp_free ? 2 : 1;
}

// Step 7's constants per group: a[i], b[i] from sv[i] (and the guarded amax[i]).
void GroupParams(uint32_t kind, const float* sv, const float* amax, size_t n, float mx, float* a, float* b) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  const VF one = hn::Set(df, 1.0f), zero = hn::Zero(df), vmx = hn::Set(df, mx);
  for (size_t i = 0; i < n; i += N) {
    const size_t m = n - i < N ? n - i : N;
    HWY_ALIGN float ins[kMaxLanes] = {}, ina[kMaxLanes] = {};
    if (m < N) {
      std::memcpy(ins, sv + i, m * 4);
      if (amax) std::memcpy(ina, amax + i, m * 4);
    }
    const VF s = m == N ? hn::LoadU(df, sv + i) : hn::Load(df, ins);
    const VF am = m == N && amax ? hn::LoadU(df, amax + i) : hn::Load(df, ina);
    VF va = zero, vb = zero;
    switch (kind) {
      case kPDiv:
      case kPExact: {
        va = s;
        const auto ok = hn::RebindMask(df, InRange(hn::And(hn::BitCast(du, s), hn::Set(du, 0x7FFFFFFFu))));
        vb = kFma ? hn::IfThenElseZero(ok, hn::Div(one, s)) : zero;
        break;
      }
      case kPMulRcp: va = Canon(hn::Div(one, s)); break;
      case kPMaxDivAmax: va = Canon(hn::Div(vmx, am)); break;
      case kPMaxMulRcpAmax: va = Canon(hn::Mul(vmx, Canon(hn::Div(one, am)))); break;
      case kPPow2: {
        // finite non-zero powers of two (the only finite non-zero ue8m0 values): the exact inverse
        const VU abs = hn::And(hn::BitCast(du, s), hn::Set(du, 0x7FFFFFFFu));
        const auto ok = hn::RebindMask(df, hn::And(hn::Ne(abs, hn::Zero(du)), hn::Lt(abs, hn::Set(du, 0x7F800000u))));
        va = hn::IfThenElseZero(ok, hn::Div(one, s));
        vb = s;
        break;
      }
      default: break;
    }
    StoreFirst(va, m, a + i);
    StoreFirst(vb, m, b + i);
  }
}

// RN(y / a) given b = RN(1/a) (b = 0: divide). Sets *slow when the FMA path could not be used. b_ok: 1 when the
// caller knows b != 0 in every lane (one group's broadcast b), 0 when it is 0, -1: test the lanes.
HWY_INLINE VF Quotient(VF y, VF a, VF b, VF* rem, bool* slow, int b_ok = -1) {
  const DF df;
  const DU du;
  if constexpr (kFma) {
    const VU ay = hn::And(hn::BitCast(du, y), hn::Set(du, 0x7FFFFFFFu));
    const auto yzero = hn::Eq(ay, hn::Zero(du));
    const auto ok = hn::Or(yzero, InRange(ay));
    if ((b_ok < 0 ? hn::AllFalse(df, hn::Eq(b, hn::Zero(df))) : b_ok == 1) && hn::AllTrue(du, ok)) {
      const VF q0 = hn::Mul(y, b);
      const VF q2 = fp8_lanes::MarksteinDiv(y, a, b);
      if (rem) *rem = hn::IfThenZeroElse(hn::RebindMask(df, yzero), hn::NegMulAdd(q2, a, y));
      return hn::IfThenElse(hn::RebindMask(df, yzero), q0, q2);
    }
  }
  (void)b;
  (void)rem;
  *slow = true;
  return hn::Div(y, a);
}

// [9] in lanes (ElemConst::cast_lanes): fp8_lanes::CastE4m3 (src/cpu/fp8_lanes-inl.h, shared with
// rmsnorm_quant) — the RNE e4m3fn code of a value the clamp left finite in [-448, 448]; every RNE cast convention
// gives the same code there (no NaN, no overflow; -0 -> 0x80). Codes packed 64 at a time by fp8_lanes::StoreCodes4.
using fp8_lanes::CastE4m3;
using fp8_lanes::CastE4m3Mag;
using fp8_lanes::StoreCodes4;
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
using fp8_lanes::CastPack32;
#endif

template <uint32_t kOp, uint32_t kClamp>
HWY_INLINE VF ElemV(VF y, VF a, VF b, const ElemConst& c, bool* unsafe, int b_ok = -1) {
  const DF df;
  const DU du;
  VF v;
  if constexpr (kOp == kOpDiv) {
    bool slow = false;
    v = Quotient(y, a, b, nullptr, &slow, b_ok);
  } else if constexpr (kOp == kOpMul) {
    v = hn::Mul(y, a);
  } else if constexpr (kOp == kOpTriton) {
    v = hn::Mul(hn::Mul(y, b), a);
  } else if constexpr (kOp == kOpMulIn) {
    // the product of a 16-bit value and a power of two (or 0/Inf) is exact in f32; rounded once to the source type
    v = Canon(hn::Mul(y, a));
    const VU vb = hn::BitCast(du, v);
    if (c.src == 1) {
      const VU r = hn::And(hn::Add(vb, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(vb), hn::Set(du, 1u)))),
                           hn::Set(du, 0xFFFF0000u));
      v = hn::IfThenElse(hn::IsNaN(v), v, hn::BitCast(df, r));
    } else {
#if FP8REF_NATIVE_F16  // (src/cpu/fp8_lanes-inl.h)
      const hn::Rebind<hwy::float16_t, DF> dh;
      v = hn::IfThenElse(hn::IsNaN(v), v, hn::PromoteTo(df, hn::DemoteTo(dh, v)));
#else
      *unsafe = true;  // no exact vector f16 rounding on this target: the chunk goes to the reference
#endif
    }
  } else if constexpr (kOp == kOpPow2) {
    const VF zero = hn::Zero(df);
    v = hn::Mul(y, a);
    // a finite quotient that overflows f32: ±FLT_MAX (a finite overflow for every cast, as the exact value)
    const auto ovf = hn::And(hn::IsInf(v), hn::IsFinite(y));
    v = hn::IfThenElse(ovf, hn::CopySign(hn::Set(df, 3.4028234663852886e38f), v), v);
    const auto special = hn::Eq(a, zero);
    if (!hn::AllFalse(df, special)) {
      VF d = hn::Div(y, b);
      d = hn::IfThenElse(hn::And(hn::Eq(y, zero), hn::Eq(b, zero)), y, d);
      v = hn::IfThenElse(special, d, v);
    }
  } else {
    bool slow = false;
    VF e = hn::Zero(df);
    v = Quotient(y, a, b, &e, &slow);
    if (slow) {
      *unsafe = true;
      return v;
    }
    // v with <= 5 significant bits (the low 19 fraction bits clear) and a non-zero remainder: one ulp towards y/a
    const VU vb = hn::BitCast(du, v);
    const auto few = hn::Eq(hn::And(vb, hn::Set(du, 0x7FFFFu)), hn::Zero(du));
    const auto inexact = hn::RebindMask(du, hn::Ne(e, hn::Zero(df)));
    // |y/a| > |v| iff e and v have the same sign (sv may be negative for static scales: e·sign(a) is what counts)
    const VU sgn = hn::And(hn::Xor(hn::Xor(hn::BitCast(du, e), vb), hn::BitCast(du, a)), hn::Set(du, 0x80000000u));
    const VU step = hn::IfThenElse(hn::Eq(sgn, hn::Zero(du)), hn::Set(du, 1u), hn::Set(du, 0xFFFFFFFFu));
    v = hn::BitCast(df, hn::IfThenElse(hn::And(few, inexact), hn::Add(vb, step), vb));
  }
  const VF mx = hn::Set(df, c.mx), nmx = hn::Neg(mx);
#if HWY_ARCH_X86 && (HWY_TARGET & (HWY_SCALAR | HWY_EMU128)) == 0
  // NaN-replacing clamps: x86 minps/maxps return the second operand when one is NaN, so the order alone sends a NaN
  // to the bound (as in src/cpu/rmsnorm_quant_cpu.cc; tests/test_quant_cpu.cc checks NaN inputs under both clamps)
  if constexpr (kClamp == static_cast<uint32_t>(Clamp::nan_to_max)) return hn::Max(hn::Min(v, mx), nmx);
  if constexpr (kClamp == static_cast<uint32_t>(Clamp::nan_to_min)) return hn::Min(hn::Max(v, nmx), mx);
#endif
  v = Canon(v, c.nan_bits);
  switch (static_cast<Clamp>(kClamp)) {
    case Clamp::none: break;
    case Clamp::nan_to_max: v = hn::IfThenElse(hn::IsNaN(v), mx, hn::Min(hn::Max(v, nmx), mx)); break;
    case Clamp::nan_to_min: v = hn::IfThenElse(hn::IsNaN(v), nmx, hn::Min(hn::Max(v, nmx), mx)); break;
    case Clamp::nan_kept: v = hn::IfThenElse(hn::IsNaN(v), v, hn::Min(hn::Max(v, nmx), mx)); break;
  }
  return v;
}

// v for the elements [k0, k1) of a row into out[0, k1 - k0). G > 0: groups of G along the row, a[g - g0], b[g - g0]
// (g = k / G); G = 0: per-element constants a[k - k0], b[k - k0]. Returns false when a kOpExact vector left the
// FMA range (the caller runs the reference on the chunk).
// kCast: the codes (CastE4m3) into q[0, k1 - k0) instead.
template <int kSrc, uint32_t kOp, uint32_t kClamp, bool kCast = false>
bool ElemRangeT(const void* src, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
                const ElemConst& cref, float* out, uint8_t* q = nullptr) {
  const ElemConst c = cref;  // a local copy: the stores through `out` cannot alias it (no reloads per vector)
  const DF df;
  const size_t N = hn::Lanes(df);
  const auto* s = static_cast<const SrcT<kSrc>*>(src);
  bool unsafe = false;
  size_t k = k0;
  if (G > 0) {
    while (k < k1) {
      const size_t g = k / G;
      const size_t e = (g + 1) * G < k1 ? (g + 1) * G : k1;
      const VF A = hn::Set(df, a[g - g0]), B = hn::Set(df, b[g - g0]);
      if constexpr (kCast) {
        const hn::Rebind<uint8_t, DF> d8;
        const int bok = b[g - g0] != 0.0f ? 1 : 0;  // (the group's b: tested once, not per vector)
        for (; k + 4 * N <= e; k += 4 * N) {
          const VU c0 = CastE4m3(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k), A, B, c, &unsafe, bok));
          const VU c1 = CastE4m3(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k + N), A, B, c, &unsafe, bok));
          const VU c2 = CastE4m3(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k + 2 * N), A, B, c, &unsafe, bok));
          const VU c3 = CastE4m3(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k + 3 * N), A, B, c, &unsafe, bok));
          StoreCodes4(c0, c1, c2, c3, q + (k - k0));
        }
        for (; k + N <= e; k += N)
          hn::StoreU(hn::U8FromU32(CastE4m3(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k), A, B, c, &unsafe, bok))), d8, q + (k - k0));
        if (k < e) {
          HWY_ALIGN uint8_t tmp[kMaxLanes];
          hn::Store(hn::U8FromU32(CastE4m3(ElemV<kOp, kClamp>(LoadYN<kSrc>(s + k, e - k), A, B, c, &unsafe, bok))), d8, tmp);
          std::memcpy(q + (k - k0), tmp, e - k);
          k = e;
        }
        if (unsafe) return false;
        continue;
      }
      for (; k + N <= e; k += N) hn::StoreU(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k), A, B, c, &unsafe), df, out + (k - k0));
      if (k < e) {
        HWY_ALIGN float tmp[kMaxLanes];
        hn::Store(ElemV<kOp, kClamp>(LoadYN<kSrc>(s + k, e - k), A, B, c, &unsafe), df, tmp);
        std::memcpy(out + (k - k0), tmp, (e - k) * 4);
        k = e;
      }
      if (unsafe) return false;
    }
  } else {
    for (; k + N <= k1; k += N)
      hn::StoreU(ElemV<kOp, kClamp>(LoadY<kSrc>(s + k), hn::LoadU(df, a + (k - k0)), hn::LoadU(df, b + (k - k0)), c, &unsafe),
                 df, out + (k - k0));
    if (k < k1) {
      const size_t m = k1 - k;
      HWY_ALIGN float pa[kMaxLanes], pb[kMaxLanes], tmp[kMaxLanes];
      for (size_t l = 0; l < N; ++l) pa[l] = pb[l] = 1.0f;  // padding lanes: in range
      std::memcpy(pa, a + (k - k0), m * 4);
      std::memcpy(pb, b + (k - k0), m * 4);
      hn::Store(ElemV<kOp, kClamp>(LoadYN<kSrc>(s + k, m), hn::Load(df, pa), hn::Load(df, pb), c, &unsafe), df, tmp);
      std::memcpy(out + (k - k0), tmp, m * 4);
    }
  }
  return !unsafe;
}

template <int kSrc, uint32_t kClamp>
bool ElemRangeC(const void* src, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
                const ElemConst& c, float* out, uint8_t* q) {
  if constexpr (kClamp == static_cast<uint32_t>(Clamp::nan_to_max) || kClamp == static_cast<uint32_t>(Clamp::nan_to_min)) {
    if (c.cast_lanes && G > 0) {  // (the ops of the named group conventions: x/s, x*(1/s), Triton's x/s)
      switch (c.op) {
        case kOpDiv: return ElemRangeT<kSrc, kOpDiv, kClamp, true>(src, k0, k1, G, g0, a, b, c, out, q);
        case kOpMul: return ElemRangeT<kSrc, kOpMul, kClamp, true>(src, k0, k1, G, g0, a, b, c, out, q);
        case kOpTriton: return ElemRangeT<kSrc, kOpTriton, kClamp, true>(src, k0, k1, G, g0, a, b, c, out, q);
        default: break;
      }
    }
  }
  switch (c.op) {
    case kOpDiv: return ElemRangeT<kSrc, kOpDiv, kClamp>(src, k0, k1, G, g0, a, b, c, out);
    case kOpMul: return ElemRangeT<kSrc, kOpMul, kClamp>(src, k0, k1, G, g0, a, b, c, out);
    case kOpPow2: return ElemRangeT<kSrc, kOpPow2, kClamp>(src, k0, k1, G, g0, a, b, c, out);
    case kOpTriton: return ElemRangeT<kSrc, kOpTriton, kClamp>(src, k0, k1, G, g0, a, b, c, out);
    case kOpMulIn: return ElemRangeT<kSrc, kOpMulIn, kClamp>(src, k0, k1, G, g0, a, b, c, out);
    default: return ElemRangeT<kSrc, kOpExact, kClamp>(src, k0, k1, G, g0, a, b, c, out);
  }
}
template <int kSrc>
bool ElemRangeS(const void* src, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
                const ElemConst& c, float* out, uint8_t* q) {
  switch (static_cast<Clamp>(c.clamp)) {
    case Clamp::none: return ElemRangeC<kSrc, 0>(src, k0, k1, G, g0, a, b, c, out, q);
    case Clamp::nan_to_max: return ElemRangeC<kSrc, 1>(src, k0, k1, G, g0, a, b, c, out, q);
    case Clamp::nan_to_min: return ElemRangeC<kSrc, 2>(src, k0, k1, G, g0, a, b, c, out, q);
    default: return ElemRangeC<kSrc, 3>(src, k0, k1, G, g0, a, b, c, out, q);
  }
}
// c.cast_lanes: the codes into q[0, k1 - k0) when the spec's op has a lane cast (CastCodes says which), else v.
bool ElemRange(int src, const void* p, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
               const ElemConst& c, float* out, uint8_t* q) {
  if (src == 0) return ElemRangeS<0>(p, k0, k1, G, g0, a, b, c, out, q);
  if (src == 1) return ElemRangeS<1>(p, k0, k1, G, g0, a, b, c, out, q);
  return ElemRangeS<2>(p, k0, k1, G, g0, a, b, c, out, q);
}

// The element pass prefetches the next chunk's source (kChunk elements ahead) into L2 while it computes this one, so
// that the memory-bound amax pass of the next chunk reads from cache: the two passes of a chunk otherwise never
// overlap memory traffic with arithmetic (bf16 [4096, 7168] group:128 on 2 threads: 0.50 -> ~0.60-0.67 of memcpy;
// into L2 rather than L1 measured ~0.02 better, within this VM's noise).
constexpr size_t kPrefetchAhead = 8192;
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
// One 64-element step of bf16 on AVX-512 (ElemFastT's bf16 loops): |x| widened by interleaving zero words below it
// (per 128-bit block: unpacklo gives elements 0–3 of the block, unpackhi 4–7, and packus_epi32(lo, hi) restores their
// order), v of |y| (>= 0) — elements 0–31 with the constants A0, B0, 32–63 with A1, B1 —, the codes packed and put in
// order by one qword permutation, the signs added as bit 7 under the mask of x's sign bits (a byte add of 0x80 to a
// code < 0x80), stored at dst.
template <uint32_t kOp>
HWY_INLINE void Bf16Step64(const uint16_t* s, VF A0, VF B0, VF A1, VF B1, VU vbound, uint8_t* dst) {
  const DU du;
  const __m512i mag16 = _mm512_set1_epi16(0x7FFF), zero = _mm512_setzero_si512();
  auto cmag = [&](__m512i ybits, VF A, VF B) HWY_ATTR {
    const VF y{_mm512_castsi512_ps(ybits)};
    VF v;
    if constexpr (kOp == kOpDiv) v = fp8_lanes::MarksteinDivN<true>(y, A, B);  // bf16: one correction
    else if constexpr (kOp == kOpMul) v = hn::Mul(y, A);
    else v = hn::Mul(hn::Mul(y, B), A);
    return CastE4m3Mag(hn::Min(hn::BitCast(du, v), vbound)).raw;
  };
  const __m512i x0 = _mm512_loadu_si512(reinterpret_cast<const void*>(s));
  const __m512i x1 = _mm512_loadu_si512(reinterpret_cast<const void*>(s + 32));
  const __mmask64 neg = _mm512_kunpackd(_mm512_movepi16_mask(x1), _mm512_movepi16_mask(x0));
  const __m512i m0 = _mm512_and_si512(x0, mag16), m1 = _mm512_and_si512(x1, mag16);
  const __m512i c0 = cmag(_mm512_unpacklo_epi16(zero, m0), A0, B0), c1 = cmag(_mm512_unpackhi_epi16(zero, m0), A0, B0);
  const __m512i c2 = cmag(_mm512_unpacklo_epi16(zero, m1), A1, B1), c3 = cmag(_mm512_unpackhi_epi16(zero, m1), A1, B1);
  const __m512i bytes = _mm512_packus_epi16(_mm512_packus_epi32(c0, c1), _mm512_packus_epi32(c2, c3));
  const __m512i ordered = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), bytes);
  _mm512_storeu_si512(dst, _mm512_mask_add_epi8(ordered, neg, ordered, _mm512_set1_epi8(static_cast<char>(0x80))));
}
// bf16 with 32-element groups (mx:32) on AVX-512, a chunk of an even number of whole groups (k0 % 32 == 0,
// (k1 - k0) % 64 == 0): two groups a Bf16Step64 — group g's constants for its first half, g + 1's for the second —
// and the look-ahead maxima reduced per half each step; the rest as ElemFastT. (Otherwise a 32-element group never
// fills ElemFastT's 64-element steps and ran the 16-element generic loop: mx:32 at 0.32 of memcpy on the AVX-512
// host, session 12; see bench/RESULTS.md, sessions 13–14.)
template <uint32_t kOp>
bool ElemFastPairs(const uint16_t* s, size_t k0, size_t k1, size_t g0, const float* a, const float* b, VU vbound,
                   uint8_t* q, const uint16_t* nx, uint32_t* namax, size_t ahead) {
  const DF df;
  const __m512i mag16 = _mm512_set1_epi16(0x7FFF);
  bool next_all = nx != nullptr;
  for (size_t k = k0, gl = k0 / 32 - g0; k < k1; k += 64, gl += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(s + k + ahead), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(s + k + ahead + 32), _MM_HINT_T1);
    if (nx) {
      const uint32_t m0 = MaxU16(_mm512_and_si512(_mm512_loadu_si512(nx + (k - k0)), mag16));
      const uint32_t m1 = MaxU16(_mm512_and_si512(_mm512_loadu_si512(nx + (k - k0) + 32), mag16));
      if (m0 >= 0x7F80u || m1 >= 0x7F80u) {  // an Inf or NaN in the next chunk: the caller scans it
        next_all = false;
        nx = nullptr;
      } else {
        namax[gl] = m0 << 16;
        namax[gl + 1] = m1 << 16;
      }
    }
    Bf16Step64<kOp>(s + k, hn::Set(df, a[gl]), hn::Set(df, b[gl]), hn::Set(df, a[gl + 1]), hn::Set(df, b[gl + 1]),
                    vbound, q + (k - k0));
  }
  return next_all;
}
#endif
// Steps 7–9 for [k0, k1) of a row whose every group is "fast" (ElemConst::fast_cast; quantize_rowlocal and
// element_pass check fast_groups and that the chunk is finite): the codes into q[0, k1 - k0), no range test, no NaN, per
// element. v = RN(y/a) by fp8_lanes::MarksteinDiv (x/s), RN(y·a) (x*(1/s)) or RN(RN(y·b)·a) (Triton's x/s); the
// clamp as a u32 min of |v|'s bits with `bound` (the clamp's fp8-max, or 448 for clamp=none with a satfinite cast:
// the same code as the cast's saturation); the code of |v| by fp8_lanes::CastE4m3Mag; the sign is y's (every
// divisor and multiplier here is > 0, so v has y's sign — also where MarksteinDiv returns +0 for y = -0 or a
// quotient under 2^-11 comes out inexact: those give code 0 either way, see FastGroups). x/s takes one FMA
// correction for bf16/f16 sources (fp8_lanes::MarksteinDiv1), two for f32.
// Look-ahead (nx != null; bf16 on AVX-512 and AVX2): the next chunk's source at the same positions (nx[k - k0]) is
// read in the same loop and its group maxima written to namax (as AmaxGroups: the f32 bits of max |x|), so that the next
// chunk's amax pass — memory-bound — runs under this chunk's arithmetic. Returns true when namax holds every group
// of the next chunk and all of them are finite (else the caller runs AmaxGroups for it: a group not covered by the
// 64-element (AVX-512) or 32-element (AVX2) steps, an Inf or a NaN, or another source/target).
template <int kSrc, uint32_t kOp, bool kClamp>
bool ElemFastT(const void* src, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
               uint32_t bound, uint8_t* q, const uint16_t* nx, uint32_t* namax) {
  bool next_ok = false;
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DF> d8;
  const size_t N = hn::Lanes(df);
  const auto* s = static_cast<const SrcT<kSrc>*>(src);
  const VU vbound = hn::Set(du, bound), absm = hn::Set(du, 0x7FFFFFFFu), sgn = hn::Set(du, 0x80u);
  auto code = [&](VF y, VF A, VF B) {
    VF v;
    if constexpr (kOp == kOpDiv) v = fp8_lanes::FastDiv<kSrc != 0>(y, A, B);  // bf16/f16: one correction (or vdivps)
    else if constexpr (kOp == kOpMul) v = hn::Mul(y, A);
    else v = hn::Mul(hn::Mul(y, B), A);
    const VU av = hn::And(hn::BitCast(du, v), absm);
    const VU m = kClamp ? hn::Min(av, vbound) : av;
    return hn::OrAnd(CastE4m3Mag(m), hn::ShiftRight<24>(hn::BitCast(du, y)), sgn);
  };
  // prefetch distance: the next chunk, or with the look-ahead (which reads the next chunk) the one after it
  const size_t ahead = nx ? 2 * (k1 - k0) : kPrefetchAhead;
  (void)ahead;  // (the look-ahead and the prefetch are the AVX-512 and AVX2 bf16 loops'; elsewhere next_ok stays false)
  (void)namax;
  size_t k = k0;
#if HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
  if constexpr (kSrc == 1) {
    // bf16 on AVX2, a chunk of whole groups of a multiple of 32 elements (group:128, mx:32), 32 elements a step, as
    // the AVX-512 loop below (|x| widened by unpacklo/unpackhi with zero words, v of |y|, the codes packed; the packs
    // leave qwords 0, 2, 1, 3 in order, put right by one vpermq), the signs as bytes: packs_epi16 of x saturates each
    // bf16 to a byte of its sign (negative words stay negative), & 0x80. Software-pipelined over the whole chunk: the
    // clamped quotients of step i+1 are computed in the same iteration as step i's casts (a per-step loop was
    // latency-bound, ~28 cycles per 32 elements in L1 on Zen 3; pipelining it per group: 1 thread 10.6 -> 9.4 ms),
    // with the group's constants broadcast per step and the look-ahead's maxima reduced at each group's last step (a
    // pipeline restarted per group spent ~15 % of the in-cache time in its prologue and lone last step at G = 128,
    // most of it at G = 32). Other chunks (a partial group, G % 32 != 0) take the generic loop below.
    const size_t S = 4 * N;  // elements per step
    if (G % S == 0 && k0 % G == 0 && (k1 - k0) % G == 0 && k1 > k0) {
      const __m256i mag16 = _mm256_set1_epi16(0x7FFF), zero = _mm256_setzero_si256();
      const __m256i b80 = _mm256_set1_epi8(static_cast<char>(0x80));
      const size_t per_group = G / S;
      auto divm = [&](__m256i ybits, VF A, VF B) {
        const VF y{_mm256_castsi256_ps(ybits)};
        VF v;
        if constexpr (kOp == kOpDiv) v = fp8_lanes::FastDiv<kSrc != 0>(y, A, B);
        else if constexpr (kOp == kOpMul) v = hn::Mul(y, A);
        else v = hn::Mul(hn::Mul(y, B), A);
        return kClamp ? hn::Min(hn::BitCast(du, v), vbound).raw : hn::BitCast(du, v).raw;
      };
      __m256i v0, v1, v2, v3, sg;
      // the clamped quotients of the step at kk and the bytes of its signs
      // (gi: the step's group, counted: a 64-bit division per step cost ~10 % of the loop on Zen 3)
      auto quotients = [&](size_t kk, size_t gi) HWY_ATTR __attribute__((always_inline)) {
        const VF A{_mm256_broadcast_ss(a + gi)}, B{_mm256_broadcast_ss(b + gi)};
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + kk));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + kk + 2 * N));
        const __m256i m0 = _mm256_and_si256(x0, mag16), m1 = _mm256_and_si256(x1, mag16);
        v0 = divm(_mm256_unpacklo_epi16(zero, m0), A, B);
        v1 = divm(_mm256_unpackhi_epi16(zero, m0), A, B);
        v2 = divm(_mm256_unpacklo_epi16(zero, m1), A, B);
        v3 = divm(_mm256_unpackhi_epi16(zero, m1), A, B);
        sg = _mm256_and_si256(_mm256_packs_epi16(x0, x1), b80);
      };
      bool next_all = nx != nullptr;
      __m256i nacc = zero;
      size_t qg = k0 / G - g0, q_in = 0;  // the group of the step whose quotients are computed, and its step in it
      quotients(k, qg);
      for (;;) {
        _mm_prefetch(reinterpret_cast<const char*>(s + k + ahead), _MM_HINT_T1);
        if (nx) {
          const __m256i n0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nx + (k - k0)));
          const __m256i n1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nx + (k - k0) + 2 * N));
          nacc = _mm256_max_epu16(nacc, _mm256_max_epu16(_mm256_and_si256(n0, mag16), _mm256_and_si256(n1, mag16)));
        }
        const __m256i packed = CastPack32(v0, v1, v2, v3, sg);
        const size_t kn = k + S;
        const bool more = kn < k1;
        if (++q_in == per_group) {
          q_in = 0;
          ++qg;
        }
        if (more) quotients(kn, qg);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (k - k0)), _mm256_permute4x64_epi64(packed, 0xD8));
        if (nx && q_in == 0) {  // the group's last step (the counter has wrapped): its look-ahead maximum
          const uint32_t m16 = MaxU16(nacc);
          if (m16 >= 0x7F80u) {  // an Inf or NaN in the next chunk: the caller scans it
            next_all = false;
            nx = nullptr;
          } else {
            namax[qg - 1] = m16 << 16;  // (this step's group: the quotients' counter has moved past it)
          }
          nacc = zero;
        }
        if (!more) break;
        k = kn;
      }
      return next_all;
    }
  }
#elif HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
  // bf16 in whole groups of a multiple of 64 on CPUs with AVX512_BF16 + VBMI: rmsnorm_quant's pass B on x itself (one
  // permutation per cast instead of two, the clamp and the sign dropped by one vrangeps, the codes put in order by
  // byte permutations and a blend: ~20 % fewer instructions per 64 values than Bf16Step64); the same bits.
  if constexpr (kSrc == 1)
    if (G % 64 == 0 && k0 % G == 0 && (k1 - k0) % G == 0 && k1 > k0 && cpu::avx512bf16_kernels()) {
      float bf;
      std::memcpy(&bf, &bound, 4);
      const size_t g = k0 / G - g0;
      return cpu::rq512::quant_bf16(static_cast<const uint16_t*>(src) + k0, k1 - k0, G, a + g, b + g,
                                    kOp == kOpDiv ? 0 : kOp == kOpMul ? 1 : 2, bf, q, nx, nx ? namax + g : nullptr, ahead);
    }
  if constexpr (kSrc == 1)  // bf16 with 32-element groups on AVX-512
    if (G == 2 * N && k0 % G == 0 && (k1 - k0) % (2 * G) == 0 && k1 > k0)
      return ElemFastPairs<kOp>(static_cast<const uint16_t*>(src), k0, k1, g0, a, b, vbound, q, nx, namax, ahead);
#endif
  while (k < k1) {
    const size_t g = k / G;
    const size_t e = (g + 1) * G < k1 ? (g + 1) * G : k1;
    const VF A = hn::Set(df, a[g - g0]), B = hn::Set(df, b[g - g0]);
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
    if constexpr (kSrc == 1) {
      // bf16, 64 elements a step (Bf16Step64 with the group's constants)
      const __m512i mag16 = _mm512_set1_epi16(0x7FFF);
      const size_t kg = k;
      __m512i nacc = _mm512_setzero_si512();
      for (; k + 4 * N <= e; k += 4 * N) {
        _mm_prefetch(reinterpret_cast<const char*>(s + k + ahead), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(s + k + ahead + 2 * N), _MM_HINT_T1);
        if (nx) {
          const __m512i n0 = _mm512_loadu_si512(reinterpret_cast<const void*>(nx + (k - k0)));
          const __m512i n1 = _mm512_loadu_si512(reinterpret_cast<const void*>(nx + (k - k0) + 2 * N));
          nacc = _mm512_max_epu16(nacc, _mm512_max_epu16(_mm512_and_si512(n0, mag16), _mm512_and_si512(n1, mag16)));
        }
        Bf16Step64<kOp>(s + k, A, B, A, B, vbound, q + (k - k0));
      }
      if (nx) {
        const uint32_t m16 = MaxU16(nacc);
        // the whole group in 64-element steps (kg: its start), and finite (bf16 |x| below the Inf bits)
        if (kg != g * G || k != e || e - kg != G || m16 >= 0x7F80u) nx = nullptr;
        else namax[g - g0] = m16 << 16;
        next_ok = nx != nullptr && k == k1;
      }
    }
#endif
    for (; k + 4 * N <= e; k += 4 * N) {
      const VU c0 = code(LoadY<kSrc>(s + k), A, B);
      const VU c1 = code(LoadY<kSrc>(s + k + N), A, B);
      const VU c2 = code(LoadY<kSrc>(s + k + 2 * N), A, B);
      const VU c3 = code(LoadY<kSrc>(s + k + 3 * N), A, B);
      StoreCodes4(c0, c1, c2, c3, q + (k - k0));
    }
    for (; k + N <= e; k += N) hn::StoreU(hn::U8FromU32(code(LoadY<kSrc>(s + k), A, B)), d8, q + (k - k0));
    if (k < e) {
      HWY_ALIGN uint8_t tmp[kMaxLanes];
      hn::Store(hn::U8FromU32(code(LoadYN<kSrc>(s + k, e - k), A, B)), d8, tmp);
      std::memcpy(q + (k - k0), tmp, e - k);
      k = e;
    }
  }
  return next_ok;
}
template <int kSrc, bool kClamp>
bool ElemFastS(uint32_t op, const void* p, size_t k0, size_t k1, size_t G, size_t g0, const float* a, const float* b,
               uint32_t bound, uint8_t* q, const uint16_t* nx, uint32_t* namax) {
  if (op == kOpDiv) return ElemFastT<kSrc, kOpDiv, kClamp>(p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  // exact formula with ue8m0 scales: y·2^-k, a multiply by a (FastGroups: a positive and finite)
  if (op == kOpMul || op == kOpPow2)
    return ElemFastT<kSrc, kOpMul, kClamp>(p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  // Triton's x/s with the range factor b = 1 in every group of the chunk (scales in [2^-126, 2^126]): RN(y·1) = y,
  // so one multiply by a (deepseek-act-quant on Zen 2: 4.26 -> 4.1 ms, session 35)
  bool unit = true;
  for (size_t g = k0 / G; g <= (k1 - 1) / G; ++g) unit = unit && b[g - g0] == 1.0f;
  if (unit) return ElemFastT<kSrc, kOpMul, kClamp>(p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  return ElemFastT<kSrc, kOpTriton, kClamp>(p, k0, k1, G, g0, a, b, bound, q, nx, namax);
}
// (The codes go out by ordinary stores: non-temporal stores of whole lines measured ~8% slower with an sfence per row
// and ~2% faster with one per thread (bf16 [4096, 7168], same process) — not worth evicting the codes that the next
// op reads.)
// nx, namax: the look-ahead (see ElemFastT); null: none. clamp: false when FastGroups found the clamp changes no code.
bool ElemFast(int src, uint32_t op, const void* p, size_t k0, size_t k1, size_t G, size_t g0, const float* a,
              const float* b, uint32_t bound, bool clamp, uint8_t* q, const uint16_t* nx, uint32_t* namax) {
  if (!clamp) {
    if (src == 0) return ElemFastS<0, false>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
    if (src == 1) return ElemFastS<1, false>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
    return ElemFastS<2, false>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  }
  if (src == 0) return ElemFastS<0, true>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  if (src == 1) return ElemFastS<1, true>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
  return ElemFastS<2, true>(op, p, k0, k1, G, g0, a, b, bound, q, nx, namax);
}

// ---- Dequantize ------------------------------------------------------------------------------------------------
template <int kOut>  // 0 f32, 1 bf16, 2 f16
HWY_INLINE void StoreOut(VF x, void* out, size_t i, size_t count) {
  const DF df;
  const DU du;
  const size_t N = hn::Lanes(df);
  if constexpr (kOut == 0) {
    if (count == N) {
      hn::StoreU(x, df, static_cast<float*>(out) + i);
    } else {
      HWY_ALIGN float tmp[kMaxLanes];
      hn::Store(x, df, tmp);
      std::memcpy(static_cast<float*>(out) + i, tmp, count * 4);
    }
  } else {
    const hn::Rebind<uint16_t, DF> d16;
    hn::Vec<decltype(d16)> h;
    if constexpr (kOut == 1) {
      // RNE to bf16; NaN (always 0x7FFFFFFF here) -> 0x7FFF
      const VU bits = hn::BitCast(du, x);
      const VU r = hn::ShiftRight<16>(
          hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u)))));
      const VU o = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), hn::Set(du, 0x7FFFu), r);
      h = hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<DU>(), o));
    } else {
#if FP8REF_NATIVE_F16  // (src/cpu/fp8_lanes-inl.h)
      const hn::Rebind<hwy::float16_t, DF> dh;
      h = hn::BitCast(d16, hn::DemoteTo(dh, x));
#else
      HWY_ALIGN uint32_t xb[kMaxLanes];
      HWY_ALIGN uint16_t hb[kMaxLanes];
      hn::Store(hn::BitCast(du, x), du, xb);
      for (size_t l = 0; l < N; ++l) hb[l] = static_cast<uint16_t>(ref::narrow(Format::f32, xb[l], Format::f16));
      h = hn::Load(d16, hb);
#endif
    }
    if (count == N) {
      hn::StoreU(h, d16, static_cast<uint16_t*>(out) + i);
    } else {
      HWY_ALIGN uint16_t tmp[kMaxLanes];
      hn::Store(h, d16, tmp);
      std::memcpy(static_cast<uint16_t*>(out) + i, tmp, count * 2);
    }
  }
}

HWY_INLINE uint32_t bits_of_f(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

HWY_INLINE VF DecodeTimes(VU code, VF s, const DeqConst& c) {
  const DF df;
  const DU du;
  const VU mag = hn::And(code, hn::Set(du, 0x7Fu));
  const VU sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u)));
  const auto sub = hn::RebindMask(df, hn::Eq(hn::ShiftRightSame(mag, static_cast<int>(c.man_bits)), hn::Zero(du)));
  const VF normal = hn::BitCast(df, hn::Add(hn::ShiftLeftSame(mag, static_cast<int>(23 - c.man_bits)), hn::Set(du, c.rebias)));
  const VF subv = hn::Mul(hn::ConvertTo(df, hn::BitCast(hn::RebindToSigned<DU>(), mag)), hn::Set(df, c.sub_mult));
  VF v = hn::IfThenElse(sub, subv, normal);
  v = hn::BitCast(df, hn::Or(hn::BitCast(du, v), sign));
  hn::Mask<DU> nan;
  if (c.style == 0) {
    nan = hn::Eq(mag, hn::Set(du, 0x7Fu));
  } else if (c.style == 1) {
    nan = hn::Gt(mag, hn::Set(du, 0x7Cu));
    v = hn::IfThenElse(hn::RebindMask(df, hn::Eq(mag, hn::Set(du, 0x7Cu))),
                       hn::BitCast(df, hn::Or(hn::Set(du, 0x7F800000u), sign)), v);
  } else {
    nan = hn::Eq(code, hn::Set(du, 0x80u));
  }
  v = hn::IfThenElse(hn::RebindMask(df, nan), hn::BitCast(df, hn::Set(du, kCanon)), v);
  return Canon(hn::Mul(v, s));
}

template <int kOut>
void DeqRangeT(const uint8_t* q, size_t k0, size_t k1, size_t G, size_t g0, const float* sv, const DeqConst& c,
               void* out) {
  const DF df;
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const size_t N = hn::Lanes(df);
  auto codes = [&](size_t k, size_t m) {
    if (m == N) return hn::PromoteTo(du, hn::LoadU(d8, q + k));
    HWY_ALIGN uint8_t buf[kMaxLanes] = {};
    std::memcpy(buf, q + k, m);
    return hn::PromoteTo(du, hn::LoadU(d8, buf));
  };
  size_t k = k0;
  if (G > 0) {
    while (k < k1) {
      const size_t g = k / G;
      const size_t e = (g + 1) * G < k1 ? (g + 1) * G : k1;
      const VF S = hn::Set(df, sv[g - g0]);
#if HWY_TARGET <= HWY_AVX3 && HWY_ARCH_X86
      // e4m3fn -> bf16 on AVX-512, 32 codes a step, for a finite scale with |s| < 2^120: RN32(value·s) by
      // DecodeE4m3x32, bf16 by integer RNE — or, with AVX512-BF16 and |s| >= 2^-117, by vcvtne2ps2bf16
      // (DeqE4m3Bf16Avx512Bf16); NaN codes (0x7F, 0xFF) -> 0x7FFF. Other scales (NaN, Inf, |s| >= 2^120):
      // DecodeTimes below.
      const uint32_t sabs = bits_of_f(sv[g - g0]) & 0x7FFFFFFFu;
      if constexpr (kOut == 1) {
#ifdef FP8REF_QUANT_DEQ_BF16
        if (c.man_bits == 3 && c.style == 0 && sabs >= 0x05000000u && sabs < 0x7B800000u && HasAvx512Bf16()) {
          const size_t n32 = (e - k) / 32 * 32;
          DeqE4m3Bf16Avx512Bf16(q + k, n32, sv[g - g0], static_cast<uint16_t*>(out) + k);
          k += n32;
        }
#endif
        if (c.man_bits == 3 && c.style == 0 && sabs < 0x7B800000u) {
          const __m512 S8 = _mm512_set1_ps(sv[g - g0] * 256.0f);
          const __m512i k7fff = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1);
          auto rne = [&](__m512 x) {
            const __m512i b = _mm512_castps_si512(x);
            return _mm512_cvtepi32_epi16(_mm512_srli_epi32(
                _mm512_add_epi32(_mm512_add_epi32(b, k7fff), _mm512_and_si512(_mm512_srli_epi32(b, 16), one)), 16));
          };
          for (; k + 32 <= e; k += 32) {
            __m512 flo, fhi;
            __mmask32 nan;
            DecodeE4m3x32(q + k, S8, &flo, &fhi, &nan);
            const __m512i o = _mm512_inserti64x4(_mm512_castsi256_si512(rne(flo)), rne(fhi), 1);
            _mm512_storeu_si512(static_cast<uint16_t*>(out) + k, _mm512_mask_mov_epi16(o, nan, _mm512_set1_epi16(0x7FFF)));
          }
        }
      }
#elif HWY_TARGET == HWY_AVX2 && HWY_ARCH_X86
      // e4m3fn -> bf16 / f32 on AVX2 as the AVX-512 loop above (DecodeE4m3x32's f16 patterns, 16 codes a step):
      // RN32(value·s) by vcvtph2ps and one multiply by s·2^8; bf16 by integer RNE, packed (packus_epi32 interleaves
      // the 128-bit halves: one vpermq), NaN codes -> 0x7FFF; f32 as it is, NaN codes -> 0x7FFFFFFF (their f16
      // patterns are finite: the mask comes from the codes);
      // finite |s| < 2^120 (else DecodeTimes below).
      if constexpr (kOut == 0 || kOut == 1) {
        if (c.man_bits == 3 && c.style == 0 && (bits_of_f(sv[g - g0]) & 0x7FFFFFFFu) < 0x7B800000u) {
          const __m256 S8 = _mm256_set1_ps(sv[g - g0] * 256.0f);
          const __m256i k7fff = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
          const __m256i k3f80 = _mm256_set1_epi16(0x3F80), k4000 = _mm256_set1_epi16(0x4000);
          const __m256 canon = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kCanon)));
          auto rne = [&](__m256 x) {
            const __m256i b = _mm256_castps_si256(x);
            return _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(b, k7fff), _mm256_and_si256(_mm256_srli_epi32(b, 16), one)), 16);
          };
          for (; k + 16 <= e; k += 16) {
            const __m256i x =
                _mm256_slli_epi16(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k))), 7);
            const __m256i h = _mm256_add_epi16(x, _mm256_and_si256(x, k4000));  // the sign from bit 14 to bit 15
            const __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), S8);
            const __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), S8);
            const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(x, k3f80), k3f80);  // (a finite f16 pattern)
            if constexpr (kOut == 1) {
              const __m256i o = _mm256_permute4x64_epi64(_mm256_packus_epi32(rne(lo), rne(hi)), 0xD8);
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + k),
                                  _mm256_blendv_epi8(o, _mm256_set1_epi16(0x7FFF), nan));
            } else {
              float* o = static_cast<float*>(out) + k;
              const __m256 nlo = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan)));
              const __m256 nhi = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan, 1)));
              _mm256_storeu_ps(o, _mm256_blendv_ps(lo, canon, nlo));
              _mm256_storeu_ps(o + 8, _mm256_blendv_ps(hi, canon, nhi));
            }
          }
        }
      }
#endif
      for (; k < e; k += N) {
        const size_t m = e - k < N ? e - k : N;
        StoreOut<kOut>(DecodeTimes(codes(k, m), S, c), out, k, m);
      }
      k = e;
    }
  } else {
    for (; k < k1; k += N) {
      const size_t m = k1 - k < N ? k1 - k : N;
      HWY_ALIGN float ps[kMaxLanes] = {};
      std::memcpy(ps, sv + (k - k0), m * 4);
      StoreOut<kOut>(DecodeTimes(codes(k, m), hn::Load(df, ps), c), out, k, m);
    }
  }
}
// out is the row's output (indexed by k); codes q indexed by k.
void DeqRange(int out_kind, const uint8_t* q, size_t k0, size_t k1, size_t G, size_t g0, const float* sv,
              const DeqConst& c, void* out) {
  if (out_kind == 0) DeqRangeT<0>(q, k0, k1, G, g0, sv, c, out);
  else if (out_kind == 1) DeqRangeT<1>(q, k0, k1, G, g0, sv, c, out);
  else DeqRangeT<2>(q, k0, k1, G, g0, sv, c, out);
}

bool QuantHasFma() { return kFma; }

// cpu::division_failures: y = 1 + i·2^(1-bits) for every i < 2^(bits-1), a = 1 + j·2^-23 for j in [j0, j1): lanes
// where RN(y·b) (corrections 0), fp8_lanes::MarksteinDiv1 (1) or MarksteinDiv (2), b = RN(1/a), differ from the IEEE
// quotient (no FMA on this target: -1).
int64_t DivisionFailures(int bits, int corrections, uint32_t j0, uint32_t j1) {
  if constexpr (!kFma) {
    return -1;
  } else {
    const DF df;
    const DU du;
    const size_t N = hn::Lanes(df);
    const uint32_t ny = 1u << (bits - 1), step = 1u << (24 - bits);
    int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (long long j = j0; j < static_cast<long long>(j1); ++j) {
      const VF a = hn::BitCast(df, hn::Set(du, 0x3F800000u | static_cast<uint32_t>(j)));
      const VF b = hn::Div(hn::Set(df, 1.0f), a);
      for (uint32_t i = 0; i < ny; i += static_cast<uint32_t>(N)) {
        const VU idx = hn::Add(hn::Set(du, i), hn::Iota(du, 0));
        const VF y = hn::BitCast(df, hn::Or(hn::Set(du, 0x3F800000u), hn::Mul(idx, hn::Set(du, step))));
        const auto live = hn::Lt(idx, hn::Set(du, ny));
        const VF q = corrections == 0   ? hn::Mul(y, b)
                     : corrections == 1 ? fp8_lanes::MarksteinDiv1(y, a, b)
                                        : fp8_lanes::MarksteinDiv(y, a, b);
        const auto ne = hn::Ne(hn::BitCast(du, q), hn::BitCast(du, hn::Div(y, a)));
        bad += static_cast<int64_t>(hn::CountTrue(du, hn::And(ne, live)));
      }
    }
    return bad;
  }
}

// cpu::cast_e4m3_failures: the codes of CastE4m3Mag for the f32 bit patterns b0, b0 + 1, ... (n of them, lanes
// past b1 computed and not compared by the caller) into out[0, n).
void CastE4m3Block(uint32_t b0, size_t n, uint8_t* out) {
  const DU du;
  const hn::Rebind<uint8_t, DU> d8;
  const size_t N = hn::Lanes(du);
  HWY_ALIGN uint8_t tmp[kMaxLanes];
  for (size_t i = 0; i < n; i += N) {
    const VU a = hn::Add(hn::Set(du, b0 + static_cast<uint32_t>(i)), hn::Iota(du, 0));
    hn::Store(hn::U8FromU32(CastE4m3Mag(a)), d8, tmp);
    std::memcpy(out + i, tmp, std::min(N, n - i));
  }
}

}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <vector>

#include "fp8ref/error.h"
#include "fp8ref/triton_div.h"
#include "cpu/quant_rows.h"

namespace fp8ref {
HWY_EXPORT(AmaxGroups);
HWY_EXPORT(AmaxElems);
HWY_EXPORT(GroupScales);
HWY_EXPORT(GroupParams);
HWY_EXPORT(FastGroups);
HWY_EXPORT(ElemRange);
HWY_EXPORT(ElemFast);
HWY_EXPORT(DeqRange);
HWY_EXPORT(QuantHasFma);
HWY_EXPORT(DivisionFailures);
HWY_EXPORT(CastE4m3Block);

namespace cpu {
namespace {
using namespace quant_cpu_detail;

constexpr size_t kChunk = 8192;             // elements per work item (whole groups when G <= kChunk)
constexpr int64_t kParallelMin = 1 << 15;  // smaller tensors run on one thread

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

int src_kind(Format from) { return from == Format::f32 ? 0 : from == Format::bf16 ? 1 : 2; }
size_t src_size(Format from) { return from == Format::f32 ? 4 : 2; }

ConversionSpec ue8m0_spec(const char* name) {
  std::string err;
  auto s = resolve_convention(name, Format::f32, Format::ue8m0, &err);
  if (!s) throw InputError("internal: " + err);
  return *s;
}

// Why a spec is not vectorised ("" = it is). exact_out: the caller asks for exact.q / exact.x.
std::string reference_reason(const QuantSpec& s, bool dynamic, bool exact_out) {
  if (exact_out) return "the exact (f64) tensors are computed by the reference";
  switch (s.formula) {
    case QuantFormula::div:
    case QuantFormula::mul_rcp:
    case QuantFormula::max_div_amax:
    case QuantFormula::max_mul_rcp_amax:
    case QuantFormula::exact:
    case QuantFormula::mul_rcp_bits:
    case QuantFormula::mul_rcp_bits_in: break;
    default: return std::string("formula ") + to_string(s.formula);
  }
  // (div=triton-nv is vectorised: Triton's x / y is RN(RN(x·f)·r) with f, r depending on y only — see the top)
  (void)dynamic;
  return "";
}

// Everything one call needs, resolved once.
struct Ctx {
  const QuantSpec* spec;
  QuantLayout L;
  Format from;
  int src;
  size_t es;        // source element bytes
  size_t ss;        // scale storage bytes
  Format storage;   // scale storage format
  ParamKind pkind;
  ElemConst ec;
  ScaleConst sc;
  ConversionSpec ue;  // ue8m0 rounding (pow2-ceil / pow2-ceil-clamp / mx)
  ConversionSpec ue_exact;  // scale-formula exact to ue8m0: the smallest power of two >= the f64 quotient
  int emax_elem = 0;
  // the row-local group structure: G (0: per element, `col`), groups per row nk
  size_t G = 0, nk = 0;
  bool triton = false;  // div=triton-nv
};

// Triton's x / y = RN(RN(x·f)·r) (include/fp8ref/triton_div.h): f = 1/4 above 2^126, 2^24 below 2^-126 (not NaN),
// else 1; r = MUFU.RCP(y·f), which is triton_nv_div(1, y·f) (after the scaling the divisor needs none).
void triton_factors(float y, float* f, float* r) {
  const float ay = std::fabs(y);
  *f = ay > 0x1p126f ? 0.25f : (!(ay >= 0x1p-126f) && !std::isnan(y)) ? 0x1p24f : 1.0f;
  const float ys = y * *f;
  const uint32_t b = bits_of(ys), e = (b >> 23) & 0xFFu;
  if (e >= 1 && e <= 251) {
    // MUFU.RCP(ys) = ±T(m)·2^(127−e), T in (1/2, 1]: the exponent field moves by 127 − e and stays normal
    const uint32_t t = bits_of(ref::triton_nv_rcp_mantissa(b & 0x7FFFFFu));
    *r = f32_of((t + ((127u - e) << 23)) | (b & 0x80000000u));
  } else {
    *r = ref::triton_nv_div(1.0f, ys);  // (0, Inf, NaN, and the top binades)
  }
}

ParamKind param_kind(const QuantSpec& s) {
  switch (s.formula) {
    case QuantFormula::div: return kPDiv;
    case QuantFormula::mul_rcp: return kPMulRcp;
    case QuantFormula::max_div_amax: return kPMaxDivAmax;
    case QuantFormula::max_mul_rcp_amax: return kPMaxMulRcpAmax;
    case QuantFormula::exact: return s.scale_dtype == ScaleDtype::ue8m0 ? kPPow2 : kPExact;
    case QuantFormula::mul_rcp_bits: return kPRcpBits;
    case QuantFormula::mul_rcp_bits_in: return kPRcpBitsIn;
    default: break;
  }
  return kPDiv;
}

Ctx make_ctx(const QuantSpec& spec, Format from, const std::vector<int64_t>& shape) {
  Ctx c;
  c.spec = &spec;
  c.L = quant_layout(spec, shape);
  c.from = from;
  c.src = src_kind(from);
  c.es = src_size(from);
  c.storage = scale_storage(spec);
  c.ss = static_cast<size_t>(format_info(c.storage).bits / 8);
  c.pkind = param_kind(spec);
  c.ec.op = c.pkind == kPDiv ? kOpDiv : c.pkind == kPPow2 ? kOpPow2 : c.pkind == kPExact ? kOpExact : kOpMul;
  c.ec.src = static_cast<uint32_t>(c.src);
  if (c.pkind == kPRcpBitsIn && from != Format::f32) c.ec.op = kOpMulIn;
  c.ec.clamp = static_cast<uint32_t>(spec.clamp);
  c.ec.mx = spec.fp8_max;
  c.ec.nan_bits = spec.formula == QuantFormula::exact ? 0x7FC00000u : 0x7FFFFFFFu;
  c.sc.propagate = spec.amax_nan == AmaxNan::propagate;
  c.sc.has_floor = spec.amax_floor.has_value();
  c.sc.floor = spec.amax_floor.value_or(0.0f);
  c.sc.has_min = spec.min_scale.has_value();
  c.sc.min_scale = spec.min_scale.value_or(0.0f);
  c.sc.max = spec.fp8_max;
  c.triton = spec.div == Division::triton_nv;
  c.sc.nan_bits = spec.scale_formula == ScaleFormula::exact ? 0x7FC00000u : 0x7FFFFFFFu;
  // amax*(1/max): RN(amax · divide(1, max)); amax/max: IEEE, or Triton's RN(RN(amax·f)·r) with (f, r) of max
  c.sc.pre = 1.0f;
  c.sc.mul_rcp = spec.scale_formula == ScaleFormula::mul_rcp || (c.triton && spec.scale_formula == ScaleFormula::div);
  if (spec.scale_formula == ScaleFormula::div && c.triton) {
    triton_factors(spec.fp8_max, &c.sc.pre, &c.sc.rcp_max);
  } else {
    const float one = 1.0f, mx = spec.fp8_max;  // max > 0 finite: no NaN
    c.sc.rcp_max = c.triton ? ref::triton_nv_div(one, mx) : one / mx;
  }
  if (c.triton && c.pkind == kPDiv) c.ec.op = kOpTriton;
  if (spec.scale_dtype == ScaleDtype::ue8m0) {
    c.ue = ue8m0_spec(spec.scale_round == ScaleRound::mx_floor       ? "mx"
                      : spec.scale_round == ScaleRound::pow2_ceil_clamp ? "pow2-ceil-clamp"
                                                                        : "pow2-ceil");
    c.emax_elem = std::ilogb(format_info(spec.to).max_value);
    // (as the reference builds it: cuda-nosat from f64, rounding up; pow2-ceil-clamp: codes clamped to [1, 254])
    std::string err;
    auto up = resolve_convention("cuda-nosat", Format::f64, Format::ue8m0, &err);
    if (!up) throw InputError("internal: " + err);
    c.ue_exact = *up;
    c.ue_exact.rounding = Rounding::ru;
    if (spec.scale_round == ScaleRound::pow2_ceil_clamp) {
      c.ue_exact.ue8m0_clamp = true;
      c.ue_exact.exp_lo = 1;
      c.ue_exact.exp_hi = 254;
    }
  }
  const Granularity& g = spec.granularity;
  switch (g.kind) {
    case GranularityKind::group:
    case GranularityKind::mx: c.G = static_cast<size_t>(g.bk); c.nk = static_cast<size_t>(c.L.scale_shape.back()); break;
    case GranularityKind::block: c.G = static_cast<size_t>(g.bk); c.nk = static_cast<size_t>(c.L.scale_shape.back()); break;
    case GranularityKind::row:
    case GranularityKind::tensor: c.G = static_cast<size_t>(c.L.K); c.nk = 1; break;
    case GranularityKind::col: c.G = 0; c.nk = static_cast<size_t>(c.L.K); break;
  }
  // Step 9 in lanes (CastE4m3) for x/s, x*(1/s) and Triton's x/s over groups: an RNE cast to e4m3fn of values a
  // NaN-replacing clamp leaves in [-448, 448] (the same predicate as rmsnorm_quant's cast_in_lanes).
  c.ec.cast_lanes = spec.to == Format::e4m3fn && spec.cast.to == Format::e4m3fn && spec.cast.rounding == Rounding::rne &&
                    (spec.clamp == Clamp::nan_to_max || spec.clamp == Clamp::nan_to_min) && spec.fp8_max <= 448.0f &&
                    (c.ec.op == kOpDiv || c.ec.op == kOpMul || c.ec.op == kOpTriton) && c.G > 0;
  // ElemFast (finite chunks, every group passes FastGroups): the same cast for any clamp to 0 < fp8-max <= 448, or no
  // clamp with a saturating cast (satfinite / saturate: finite values beyond 448 -> ±448, i.e. a clamp to 448;
  // deepseek-act-quant, mx), or no clamp with a non-saturating one (deepgemm's torch cast) in groups whose largest
  // quotient is < 464 (fast_qmax): every quotient then rounds to at most 448 — no overflow, no NaN — and the u32
  // min with 448 changes nothing that the cast does not round to 448 anyway (values in (448, 464) round to 448).
  // The ops: x/s, x*(1/s), Triton's x/s, and the exact formula with ue8m0 scales (y·2^-k: a multiply by a power of
  // two, exact unless it underflows, where the f32 product rounds to a value below 2^-126 that casts to ±0 as the
  // exact quotient does).
  const bool saturating = spec.cast.overflow == Overflow::satfinite || spec.cast.overflow == Overflow::saturate;
  const bool clamp_ok = spec.clamp != Clamp::none ? spec.fp8_max > 0.0f && spec.fp8_max <= 448.0f : true;
  c.ec.fast_qmax = spec.clamp == Clamp::none && !saturating;
  c.ec.fast_cast = spec.to == Format::e4m3fn && spec.cast.to == Format::e4m3fn && spec.cast.rounding == Rounding::rne &&
                   clamp_ok &&
                   (c.ec.op == kOpDiv || c.ec.op == kOpMul || c.ec.op == kOpTriton || c.ec.op == kOpPow2) && c.G > 0;
  c.ec.fast_bound = bits_of(spec.clamp != Clamp::none ? spec.fp8_max : 448.0f);
  return c;
}

// A ue8m0 code as stored, and its value (the reference's from_ue8m0).
void put_ue8m0(const Ctx& c, uint8_t code, bool was_inf, void* scales, size_t gid, float* sv) {
  uint8_t* p = static_cast<uint8_t*>(scales);
  if (c.spec->scale_store == ScaleStore::native) {
    p[gid] = code;
    // 2^(code − 127) as f32 bits (code 0: 2^-127, the subnormal 0x00400000) — the value of ldexp(1.0, code − 127)
    // narrowed, without a libm call per group (mx:32 quantizes 4 groups per 128 elements)
    *sv = f32_of(code == 0xFF ? 0x7FFFFFFFu : code == 0 ? 0x00400000u : static_cast<uint32_t>(code) << 23);
    return;
  }
  const uint32_t bits = code == 0xFF ? (was_inf ? 0x7F800000u : 0x7FFFFFFFu) : static_cast<uint32_t>(code) << 23;
  std::memcpy(p + 4 * gid, &bits, 4);
  *sv = f32_of(bits);
}

// scale-formula exact with a bf16 / f16 / ue8m0 scale: amax/max (A/m, two f32) rounded once to the scale dtype, per
// group, from d = RN64(A/m). d rounds like A/m: every decision point of the target rounding (bf16/f16 values and
// midpoints, <= 12 significant bits; powers of two for ue8m0's rounding up) is an f64, so none lies strictly between
// A/m and d; and d is a decision point only if A/m is — A − p·m for such a p is 0 or at least about 2^-36·A (p has
// <= 12 significant bits and m 24, so p·m lies on a grid of 2^-36 relative), far beyond half an f64 ulp (the
// reference's exact quotient says the same: with f32 operands its nudge never triggers). min-scale: A < min_scale·m (exact in f64) gives min_scale. NaN A: the f64
// quiet NaN narrowed, as the reference.
void exact_narrow_scale(const Ctx& c, float A, void* scales, size_t gid, float* sv) {
  const QuantSpec& s = *c.spec;
  const double m = s.fp8_max;
  double d;
  if (std::isnan(A)) d = std::numeric_limits<double>::quiet_NaN();
  else if (s.min_scale && static_cast<double>(A) < static_cast<double>(*s.min_scale) * m) d = *s.min_scale;
  else d = static_cast<double>(A) / m;
  uint64_t db;
  std::memcpy(&db, &d, 8);
  uint8_t* out = static_cast<uint8_t*>(scales);
  if (s.scale_dtype == ScaleDtype::ue8m0) {
    put_ue8m0(c, ref::encode(Format::f64, db, c.ue_exact), std::isinf(d), scales, gid, sv);
    return;
  }
  const Format dt = s.scale_dtype == ScaleDtype::bf16 ? Format::bf16 : Format::f16;
  const uint16_t h = static_cast<uint16_t>(ref::narrow(Format::f64, db, dt));
  std::memcpy(out + 2 * gid, &h, 2);
  *sv = f32_of(static_cast<uint32_t>(ref::narrow(dt, h, Format::f32)));
}

// Steps 3–6 for the n groups gid0.. of one work item: amax bits -> stored scales, sv and the guarded amax.
void compute_scales(const Ctx& c, const uint32_t* amax_bits, size_t n, size_t gid0, void* scales, float* amax,
                    float* sv, float* tmp, uint8_t* codes) {
  HWY_DYNAMIC_DISPATCH(GroupScales)(amax_bits, n, c.sc, amax, tmp);
  const QuantSpec& s = *c.spec;
  uint8_t* out = static_cast<uint8_t*>(scales);
  if (s.scale_round == ScaleRound::mx_floor) {
    cpu::encode_f32(amax, codes, n, c.ue);
    for (size_t i = 0; i < n; ++i) {
      const int cc = codes[i];
      const uint8_t code = cc == 0xFF ? uint8_t{0xFF} : static_cast<uint8_t>(cc > c.emax_elem ? cc - c.emax_elem : 0);
      put_ue8m0(c, code, false, scales, gid0 + i, &sv[i]);
    }
    return;
  }
  if (s.scale_formula == ScaleFormula::exact && s.scale_dtype != ScaleDtype::f32) {
    for (size_t i = 0; i < n; ++i) exact_narrow_scale(c, amax[i], scales, gid0 + i, &sv[i]);
    return;
  }
  switch (s.scale_dtype) {
    case ScaleDtype::f32:
      std::memcpy(out + 4 * gid0, tmp, 4 * n);
      std::memcpy(sv, tmp, 4 * n);
      break;
    case ScaleDtype::bf16:
    case ScaleDtype::f16: {
      const Format dt = s.scale_dtype == ScaleDtype::bf16 ? Format::bf16 : Format::f16;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = static_cast<uint16_t>(ref::narrow(Format::f32, bits_of(tmp[i]), dt));
        std::memcpy(out + 2 * (gid0 + i), &h, 2);
        sv[i] = f32_of(static_cast<uint32_t>(ref::narrow(dt, h, Format::f32)));
      }
      break;
    }
    case ScaleDtype::ue8m0:
      cpu::encode_f32(tmp, codes, n, c.ue);
      for (size_t i = 0; i < n; ++i) put_ue8m0(c, codes[i], std::isinf(tmp[i]), scales, gid0 + i, &sv[i]);
      break;
  }
}

// Per-thread scratch.
struct Scratch {
  std::vector<uint32_t> amax_bits;
  // quantize_rowlocal's look-ahead: the group maxima of chunk (next_r, next_k0), read by the previous chunk's
  // element pass (ElemFast), valid when next_ok
  std::vector<uint32_t> next_amax;
  size_t next_r = 0, next_k0 = 0;
  bool next_ok = false;
  std::vector<float> amax, sv, tmp, a, b, v;
  std::vector<uint8_t> codes;
  void groups(size_t n) {
    if (amax_bits.size() < n) {
      amax_bits.resize(n);
      amax.resize(n);
      sv.resize(n);
      tmp.resize(n);
      a.resize(n);
      b.resize(n);
      codes.resize(n);
    }
  }
};

// Work items: rows × chunks; a chunk is a multiple of the row's group size when G <= kChunk.
size_t chunk_len(const Ctx& c) {
  if (c.G == 0) return kChunk;
  if (c.G >= kChunk) return c.G;  // one group per chunk (row, tensor, huge groups): split further below
  return (kChunk / c.G) * c.G;
}

// The reference on one chunk of a row (static scales = the scales stored for it). Used for kOpExact vectors
// outside the FMA range (see the top of the file).
void chunk_reference(const Ctx& c, const void* src_row, size_t k0, size_t k1, const void* scales, size_t gid_row,
                     uint8_t* q_row) {
  QuantSpec s = *c.spec;
  s.tail = TailPolicy::partial;
  const uint8_t* sp = static_cast<const uint8_t*>(scales);
  auto run = [&](size_t a, size_t b, size_t first) {
    ref::quantize_static(s, c.from, static_cast<const uint8_t*>(src_row) + a * c.es, {1, static_cast<int64_t>(b - a)},
                         sp + first * c.ss, q_row + a);
  };
  if (c.G == 0) {
    s.granularity = Granularity{GranularityKind::col, 1, 1};
    run(k0, k1, gid_row + k0);
    return;
  }
  if (k0 % c.G != 0 || (k1 - 1) / c.G == k0 / c.G) {  // a head inside one group (chunks of a long group)
    const size_t e = std::min(k1, (k0 / c.G + 1) * c.G);
    s.granularity = Granularity{GranularityKind::tensor, 1, 1};
    run(k0, e, gid_row + k0 / c.G);
    k0 = e;
  }
  if (k0 < k1) {  // whole groups from a group boundary
    s.granularity = Granularity{GranularityKind::group, 1, static_cast<int64_t>(c.G)};
    run(k0, k1, gid_row + k0 / c.G);
  }
}

// Step 7–9 for [k0, k1) of row `row` whose groups start at gid_row in the scale tensor; a, b: the constants of
// the groups (G > 0: from group k0 / G; G = 0: from element k0).
void elements(const Ctx& c, const void* x, size_t row, size_t k0, size_t k1, size_t gid_row, const float* a,
              const float* b, const void* scales, uint8_t* q, Scratch& w) {
  const size_t K = static_cast<size_t>(c.L.K);
  const void* src_row = static_cast<const uint8_t*>(x) + row * K * c.es;
  uint8_t* q_row = q + row * K;
  if (w.v.size() < k1 - k0) w.v.resize(k1 - k0);
  const size_t g0 = c.G ? k0 / c.G : 0;
  if (HWY_DYNAMIC_DISPATCH(ElemRange)(c.src, src_row, k0, k1, c.G, g0, a, b, c.ec, w.v.data(), q_row + k0)) {
    if (!c.ec.cast_lanes) cpu::encode_f32(w.v.data(), q_row + k0, k1 - k0, c.spec->cast);
  } else {
    chunk_reference(c, src_row, k0, k1, scales, gid_row, q_row);
  }
}

// Runs fn(scratch, row, k0, k1) over every row × chunk of C elements (OpenMP, static split; one Scratch a thread).
template <typename Fn>
void for_each_chunk(const Ctx& c, size_t C, Fn fn) {
  const size_t rows = static_cast<size_t>(c.L.B * c.L.M), K = static_cast<size_t>(c.L.K);
  const size_t per_row = (K + C - 1) / C;
  const long long items = static_cast<long long>(rows * per_row);
#pragma omp parallel if (c.L.n_elems >= kParallelMin)
  {
    Scratch w;
#pragma omp for schedule(static)
    for (long long it = 0; it < items; ++it) {
      const size_t r = static_cast<size_t>(it) / per_row, k0 = (static_cast<size_t>(it) % per_row) * C;
      fn(w, r, k0, std::min(K, k0 + C));
    }
  }
}
// Chunks of the element pass: whole groups, or kChunk-element pieces of longer groups / per-element scales.
size_t element_chunk(const Ctx& c) { return c.G == 0 || c.G >= kChunk ? kChunk : chunk_len(c); }

// Whether ElemFast may quantize n groups (FastGroups, which states the argument): 0 no, 1 yes, 2 yes without its
// clamp.
int fast_groups(const Ctx& c, const float* a, const float* b, const uint32_t* amax_bits, size_t n) {
  return HWY_DYNAMIC_DISPATCH(FastGroups)(c.ec.op, c.ec.fast_qmax != 0, c.ec.fast_bound, a, b, amax_bits, n);
}
// The element pass over every row with constants a, b for all n_scales groups (tensor, col, block, static).
// row_gid(r): the scale index of the row's first group.
template <typename RowGid>
void element_pass(const Ctx& c, const void* x, const std::vector<float>& a, const std::vector<float>& b,
                  const void* scales, uint8_t* q, RowGid row_gid) {
  const size_t K = static_cast<size_t>(c.L.K);
  for_each_chunk(c, element_chunk(c), [&](Scratch& w, size_t r, size_t k0, size_t k1) {
    const size_t gid = row_gid(r);
    const size_t off = c.G ? gid + k0 / c.G : gid + k0;
    if (c.ec.fast_cast && c.G > 0 && c.G <= kChunk && k0 % c.G == 0) {
      // ElemFast as in quantize_rowlocal: the chunk's group maxima (AmaxGroups: finite?) for FastGroups' test
      const size_t g0 = k0 / c.G, ng = (k1 - 1) / c.G + 1 - g0;
      w.groups(ng);
      std::fill(w.amax_bits.begin(), w.amax_bits.begin() + static_cast<long>(ng), 0u);
      const void* src_row = static_cast<const uint8_t*>(x) + r * K * c.es;
      const int fast = HWY_DYNAMIC_DISPATCH(AmaxGroups)(c.src, src_row, k0, k1, c.G, true, g0, w.amax_bits.data())
                           ? fast_groups(c, a.data() + off, b.data() + off, w.amax_bits.data(), ng)
                           : 0;
      if (fast) {
        HWY_DYNAMIC_DISPATCH(ElemFast)(c.src, c.ec.op, src_row, k0, k1, c.G, g0, a.data() + off, b.data() + off,
                                       c.ec.fast_bound, fast == 1, q + r * K + k0, nullptr, nullptr);
        return;
      }
    }
    elements(c, x, r, k0, k1, gid, a.data() + off, b.data() + off, scales, q, w);
  });
}

// Step 7's constants of n groups. div=triton-nv: per group, scalar (Triton's reciprocal is a table).
void group_params(const Ctx& c, const float* sv, const float* amax, size_t n, float* a, float* b) {
  if (c.pkind == kPRcpBits || c.pkind == kPRcpBitsIn) {
    // R = the f32 with bits (254 − c) << 23, c the exponent field of the scale's value (255 for NaN/Inf: −Inf);
    // @in from bf16/f16: R rounded to the source type (f16: 2^16 and above -> Inf)
    for (size_t i = 0; i < n; ++i) {
      const uint32_t code = (bits_of(sv[i]) >> 23) & 0xFFu;  // the exponent field (the reference's ue8m0_code)
      float r = f32_of((254u - code) << 23);
      if (c.ec.op == kOpMulIn) {
        const Format f = c.from;
        r = f32_of(static_cast<uint32_t>(ref::narrow(f, ref::narrow(Format::f32, bits_of(r), f), Format::f32)));
      }
      a[i] = r;
      b[i] = 0;
    }
    return;
  }
  if (c.triton && (c.pkind == kPDiv || c.pkind == kPMulRcp || c.pkind == kPMaxDivAmax)) {
    if (c.pkind == kPDiv) {  // the reciprocal table's entries of every group first: their misses overlap
      const int8_t* d = ref::triton_nv_rcp_deltas();
      for (size_t i = 0; i < n; ++i) __builtin_prefetch(d + (bits_of(sv[i]) & 0x7FFFFFu));
    }
    for (size_t i = 0; i < n; ++i) {
      if (c.pkind == kPDiv) {
        triton_factors(sv[i], &b[i], &a[i]);
      } else {
        a[i] = c.pkind == kPMulRcp ? ref::triton_nv_div(1.0f, sv[i]) : ref::triton_nv_div(c.spec->fp8_max, amax[i]);
        b[i] = 0;
      }
    }
    return;
  }
  HWY_DYNAMIC_DISPATCH(GroupParams)(c.pkind, sv, amax, n, c.spec->fp8_max, a, b);
}

void params_all(const Ctx& c, const std::vector<float>& sv, const std::vector<float>& amax, std::vector<float>& a,
                std::vector<float>& b) {
  const size_t n = sv.size();
  a.resize(n);
  b.resize(n);
  group_params(c, sv.data(), amax.empty() ? nullptr : amax.data(), n, a.data(), b.data());
}

// ---- dynamic, by granularity ------------------------------------------------------------------------------------


// group / mx / row (when a row's groups fit a chunk): amax, scales and elements of chunk [k0, k1) of row r, fused.
// given: the chunk's group maxima bits as AmaxGroups would compute them (the caller knows them; null: computed here).
// lookahead: ElemFast may read the next chunk's group maxima on the way (quantize_rowlocal; a RowQuantizer's rows are
// not contiguous).
void rowlocal_chunk(const Ctx& c, Scratch& w, const void* x, uint8_t* q, void* scales, size_t r, size_t k0, size_t k1,
                    const uint32_t* given, bool lookahead) {
  const size_t K = static_cast<size_t>(c.L.K);
  const bool prop = c.sc.propagate;
  const size_t g0 = k0 / c.G, ng = (k1 - 1) / c.G + 1 - g0;
  w.groups(ng);
  const void* src_row = static_cast<const uint8_t*>(x) + r * K * c.es;
  bool finite = true;
  if (given) {
    for (size_t i = 0; i < ng; ++i) finite = finite && given[i] < 0x7F800000u;
    std::copy(given, given + ng, w.amax_bits.begin());
  } else if (w.next_ok && w.next_r == r && w.next_k0 == k0) {  // read by the previous chunk's ElemFast
    std::swap(w.amax_bits, w.next_amax);
  } else {
    std::fill(w.amax_bits.begin(), w.amax_bits.begin() + static_cast<long>(ng), 0u);
    finite = HWY_DYNAMIC_DISPATCH(AmaxGroups)(c.src, src_row, k0, k1, c.G, prop, g0, w.amax_bits.data());
  }
  w.next_ok = false;
  const size_t gid_row = r * c.nk;
  compute_scales(c, w.amax_bits.data(), ng, gid_row + g0, scales, w.amax.data(), w.sv.data(), w.tmp.data(),
                 w.codes.data());
  group_params(c, w.sv.data(), w.amax.data(), ng, w.a.data(), w.b.data());
  if (c.ec.fast_cast && finite) {
    if (const int fast = fast_groups(c, w.a.data(), w.b.data(), w.amax_bits.data(), ng)) {
      // the look-ahead: the next chunk of the row, or the next row's first, when it has the same length and
      // group alignment (bf16; ElemFast says whether it could)
      const size_t rows = static_cast<size_t>(c.L.B * c.L.M);
      const size_t nr = k1 < K ? r : r + 1, nk0 = k1 < K ? k1 : 0;
      const bool la = lookahead && c.src == 1 && nr < rows && std::min(K, nk0 + chunk_len(c)) - nk0 == k1 - k0 &&
                      k0 % c.G == 0 && nk0 % c.G == 0;
      if (la && w.next_amax.size() < w.amax_bits.size()) w.next_amax.resize(w.amax_bits.size());
      const auto* nx = la ? reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(x) + (nr * K + nk0) * 2)
                          : nullptr;
      w.next_ok = HWY_DYNAMIC_DISPATCH(ElemFast)(c.src, c.ec.op, src_row, k0, k1, c.G, g0, w.a.data(), w.b.data(),
                                                 c.ec.fast_bound, fast == 1, q + r * K + k0, nx,
                                                 la ? w.next_amax.data() : nullptr);
      w.next_r = nr;
      w.next_k0 = nk0;
      return;
    }
  }
  elements(c, x, r, k0, k1, gid_row, w.a.data(), w.b.data(), scales, q, w);
}

void quantize_rowlocal(const Ctx& c, const void* x, uint8_t* q, void* scales) {
  for_each_chunk(c, chunk_len(c), [&](Scratch& w, size_t r, size_t k0, size_t k1) {
    rowlocal_chunk(c, w, x, q, scales, r, k0, k1, nullptr, true);
  });
}

// Per-thread partial amax over all rows, combined (integer max: order-free): n groups, `add` accumulates a row.
template <typename AddRow>
std::vector<uint32_t> reduce_amax(const Ctx& c, size_t n, AddRow add) {
  const long long rows = static_cast<long long>(c.L.B * c.L.M);
  std::vector<uint32_t> all(n, 0u);
#pragma omp parallel if (c.L.n_elems >= kParallelMin)
  {
    std::vector<uint32_t> mine(n, 0u);
#pragma omp for schedule(static)
    for (long long r = 0; r < rows; ++r) add(static_cast<size_t>(r), mine.data());
#pragma omp critical(fp8ref_quant_amax)
    for (size_t i = 0; i < n; ++i) all[i] = std::max(all[i], mine[i]);
  }
  return all;
}

void scales_all(const Ctx& c, const std::vector<uint32_t>& amax_bits, void* scales, std::vector<float>& amax,
                std::vector<float>& sv) {
  const size_t n = amax_bits.size();
  amax.resize(n);
  sv.resize(n);
  std::vector<float> tmp(n);
  std::vector<uint8_t> codes(n);
  compute_scales(c, amax_bits.data(), n, 0, scales, amax.data(), sv.data(), tmp.data(), codes.data());
}

void quantize_vector(const Ctx& c, const void* x, uint8_t* q, void* scales) {
  const size_t K = static_cast<size_t>(c.L.K);
  const bool prop = c.sc.propagate;
  const GranularityKind kind = c.spec->granularity.kind;
  if ((kind == GranularityKind::group || kind == GranularityKind::mx || kind == GranularityKind::row) &&
      c.G <= kChunk) {
    quantize_rowlocal(c, x, q, scales);
    return;
  }
  std::vector<uint32_t> bits;
  std::function<size_t(size_t)> row_gid;
  const size_t M = static_cast<size_t>(c.L.M);
  switch (kind) {
    case GranularityKind::tensor:
    case GranularityKind::row:  // (a row longer than a chunk)
    case GranularityKind::group:
    case GranularityKind::mx: {
      const size_t per_row = kind == GranularityKind::tensor ? 0 : c.nk;
      const size_t n = kind == GranularityKind::tensor ? 1 : static_cast<size_t>(c.L.n_scales);
      bits = reduce_amax(c, n, [&](size_t r, uint32_t* acc) {
        const void* row = static_cast<const uint8_t*>(x) + r * K * c.es;
        HWY_DYNAMIC_DISPATCH(AmaxGroups)(c.src, row, 0, K, c.G, prop, 0, acc + r * per_row);
      });
      row_gid = [per_row](size_t r) { return r * per_row; };
      break;
    }
    case GranularityKind::col:
      bits = reduce_amax(c, K, [&](size_t r, uint32_t* acc) {
        HWY_DYNAMIC_DISPATCH(AmaxElems)(c.src, static_cast<const uint8_t*>(x) + r * K * c.es, K, prop, acc);
      });
      row_gid = [](size_t) { return size_t{0}; };
      break;
    case GranularityKind::block: {
      const size_t bm = static_cast<size_t>(c.spec->granularity.bm);
      const size_t nbm = static_cast<size_t>(c.L.scale_shape[c.L.scale_shape.size() - 2]);
      bits = reduce_amax(c, static_cast<size_t>(c.L.n_scales), [&](size_t r, uint32_t* acc) {
        const size_t b = r / M, m = r % M;
        const void* row = static_cast<const uint8_t*>(x) + r * K * c.es;
        HWY_DYNAMIC_DISPATCH(AmaxGroups)(c.src, row, 0, K, c.G, prop, 0, acc + (b * nbm + m / bm) * c.nk);
      });
      row_gid = [=](size_t r) { return (r / M * nbm + (r % M) / bm) * c.nk; };
      break;
    }
  }
  std::vector<float> amax, sv, a, b;
  scales_all(c, bits, scales, amax, sv);
  params_all(c, sv, amax, a, b);
  element_pass(c, x, a, b, scales, q, row_gid);
}

std::function<size_t(size_t)> static_row_gid(const Ctx& c) {
  const size_t M = static_cast<size_t>(c.L.M);
  switch (c.spec->granularity.kind) {
    case GranularityKind::tensor:
    case GranularityKind::col: return [](size_t) { return size_t{0}; };
    case GranularityKind::row: return [](size_t r) { return r; };
    case GranularityKind::group:
    case GranularityKind::mx: {
      const size_t nk = c.nk;
      return [nk](size_t r) { return r * nk; };
    }
    case GranularityKind::block: {
      const size_t bm = static_cast<size_t>(c.spec->granularity.bm), nk = c.nk;
      const size_t nbm = static_cast<size_t>(c.L.scale_shape[c.L.scale_shape.size() - 2]);
      return [=](size_t r) { return (r / M * nbm + (r % M) / bm) * nk; };
    }
  }
  return [](size_t) { return size_t{0}; };
}

std::vector<float> scale_values(const QuantSpec& spec, const void* scales, size_t n) {
  std::vector<float> sv(n);
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static) if (n >= (size_t{1} << 16))
  for (long long i = 0; i < nn; ++i) sv[static_cast<size_t>(i)] = ref::scale_value(spec, scales, static_cast<size_t>(i));
  return sv;
}

}  // namespace

int64_t division_failures(int significand_bits, int corrections, uint32_t j0, uint32_t j1) {
  if (significand_bits < 2 || significand_bits > 24 || corrections < 0 || corrections > 2 || j1 > (1u << 23) ||
      j0 > j1)
    throw std::invalid_argument("division_failures: bits in [2, 24], corrections 0-2, 0 <= j0 <= j1 <= 2^23");
  return HWY_DYNAMIC_DISPATCH(DivisionFailures)(significand_bits, corrections, j0, j1);
}

int64_t cast_e4m3_failures(uint32_t b0, uint32_t b1, bool ties_odd) {
  if (b1 > 0x43E00001u || b0 > b1) throw std::invalid_argument("cast_e4m3_failures: 0 <= b0 <= b1 <= 0x43E00001");
  // mid[c]: the midpoint between codes c and c + 1 (exact in f64); values ascend with the bit patterns
  double mid[126];
  for (int c = 0; c < 126; ++c)
    mid[c] = (ref::value_of(Format::e4m3fn, static_cast<uint8_t>(c)) +
              ref::value_of(Format::e4m3fn, static_cast<uint8_t>(c + 1))) / 2;
  constexpr uint32_t kBlock = 1u << 20;
  const long long nblocks = (static_cast<long long>(b1) - b0 + kBlock - 1) / kBlock;
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(dynamic, 16)
  for (long long blk = 0; blk < nblocks; ++blk) {
    const uint32_t lo = b0 + static_cast<uint32_t>(blk) * kBlock, n = std::min(kBlock, b1 - lo);
    std::vector<uint8_t> got(n);
    HWY_DYNAMIC_DISPATCH(CastE4m3Block)(lo, n, got.data());
    int code = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(f32_of(lo + i));
      while (code < 126 && (v > mid[code] || (v == mid[code] && (code & 1) != static_cast<int>(ties_odd)))) ++code;
      bad += got[i] != code;
    }
  }
  return bad;
}

std::string quant_path(const QuantSpec& spec, bool dynamic, bool exact_out) {
  const std::string why = reference_reason(spec, dynamic, exact_out);
  if (!why.empty()) return "reference: " + why;
  std::string s = std::string("vector (") + simd_target() + ")";
  if (spec.formula == QuantFormula::exact && spec.scale_dtype != ScaleDtype::ue8m0)
    s += HWY_DYNAMIC_DISPATCH(QuantHasFma)() ? "; chunks with elements or scales outside [2^-60, 2^60]: reference"
                                             : "; no native FMA on this target: every chunk by the reference";
  return s;
}

void quantize(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape, uint8_t* q,
              void* scales, double* exact_q) {
  require_finalized(spec, "quantize");
  if (exact_q || (from != Format::f32 && from != Format::bf16 && from != Format::f16) ||
      !reference_reason(spec, true, false).empty())
    return ref::quantize(spec, from, x, shape, q, scales, exact_q);
  const Ctx c = make_ctx(spec, from, shape);
  if (c.L.n_elems == 0) return ref::quantize(spec, from, x, shape, q, scales, exact_q);
  quantize_vector(c, x, q, scales);
}

// RowQuantizer (quant_rows.h): quantize_vector's row-local path for one row, its Ctx and Scratch kept.
struct RowQuantizer::Impl {
  QuantSpec spec;
  std::vector<int64_t> shape;
  Ctx c;
  Scratch w;
  bool vec = false;  // the row-local vector path (else cpu::quantize)
};

RowQuantizer::RowQuantizer(const QuantSpec& spec, int64_t K) : impl_(new Impl) {
  require_finalized(spec, "quantize");
  Impl& m = *impl_;
  m.spec = spec;
  m.shape = {1, K};
  const GranularityKind kind = spec.granularity.kind;
  if (K > 0 && reference_reason(spec, true, false).empty() &&
      (kind == GranularityKind::group || kind == GranularityKind::mx || kind == GranularityKind::row)) {
    m.c = make_ctx(m.spec, Format::f32, m.shape);  // (c.spec points at m.spec)
    m.vec = m.c.G <= kChunk;
  }
}
RowQuantizer::~RowQuantizer() = default;

void RowQuantizer::row(const float* y, uint8_t* q, void* scales, const uint32_t* amax) {
  Impl& m = *impl_;
  if (!m.vec) return quantize(m.spec, Format::f32, y, m.shape, q, scales, nullptr);
  const size_t K = static_cast<size_t>(m.c.L.K), C = chunk_len(m.c);
  for (size_t k0 = 0; k0 < K; k0 += C)
    rowlocal_chunk(m.c, m.w, y, q, scales, 0, k0, std::min(K, k0 + C), amax ? amax + k0 / m.c.G : nullptr, false);
}

void quantize_static(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape,
                     const void* scales, uint8_t* q, double* exact_q) {
  require_finalized(spec, "quantize");
  if (exact_q || (from != Format::f32 && from != Format::bf16 && from != Format::f16) ||
      spec.formula == QuantFormula::max_div_amax || spec.formula == QuantFormula::max_mul_rcp_amax ||
      !reference_reason(spec, false, false).empty())
    return ref::quantize_static(spec, from, x, shape, scales, q, exact_q);  // (refuses the amax formulas)
  Ctx c = make_ctx(spec, from, shape);
  if (c.L.n_elems == 0) return ref::quantize_static(spec, from, x, shape, scales, q, exact_q);
  const std::vector<float> sv = scale_values(spec, scales, static_cast<size_t>(c.L.n_scales));
  if (c.pkind == kPPow2) {
    // ue8m0 scales held as f32 are read as given: a finite non-zero value that is not a power of two takes the
    // general exact path (the exact-inverse multiply needs 2^k)
    for (float v : sv) {
      int e;
      if (std::isfinite(v) && v != 0 && std::fabs(std::frexp(v, &e)) != 0.5f) {
        c.pkind = kPExact;
        c.ec.op = kOpExact;
        c.ec.fast_cast = 0;  // (make_ctx allowed ElemFast for the power-of-two multiply only, not for kOpExact)
        break;
      }
    }
  }
  std::vector<float> a, b;
  params_all(c, sv, {}, a, b);
  element_pass(c, x, a, b, scales, q, static_row_gid(c));
}

void dequantize(const QuantSpec& spec, const uint8_t* q, const std::vector<int64_t>& shape, const void* scales,
                Format out_format, void* out, double* exact_x) {
  if (exact_x || (out_format != Format::f32 && out_format != Format::bf16 && out_format != Format::f16) ||
      !is_fp8(spec.to) || spec.to == Format::ue8m0)
    return ref::dequantize(spec, q, shape, scales, out_format, out, exact_x);
  Ctx c = make_ctx(spec, Format::f32, shape);
  if (c.L.n_elems == 0) return ref::dequantize(spec, q, shape, scales, out_format, out, exact_x);
  const std::vector<float> sv = scale_values(spec, scales, static_cast<size_t>(c.L.n_scales));
  const FormatInfo& fi = format_info(spec.to);
  const DeqConst dc{static_cast<uint32_t>(fi.man_bits), static_cast<uint32_t>(127 - fi.bias) << 23,
                    static_cast<float>(std::ldexp(1.0, 1 - fi.bias - fi.man_bits)),
                    fi.special == SpecialStyle::fnuz ? 2u : fi.special == SpecialStyle::ieee ? 1u : 0u};
  const int out_kind = out_format == Format::f32 ? 0 : out_format == Format::bf16 ? 1 : 2;
  const size_t os = out_kind == 0 ? 4 : 2;
  const size_t K = static_cast<size_t>(c.L.K);
  const auto row_gid = static_row_gid(c);
  for_each_chunk(c, element_chunk(c), [&](Scratch&, size_t r, size_t k0, size_t k1) {
    const size_t gid = row_gid(r);
    const size_t g0 = c.G ? k0 / c.G : 0;
    const float* s = sv.data() + (c.G ? gid + g0 : gid + k0);
    HWY_DYNAMIC_DISPATCH(DeqRange)(out_kind, q + r * K, k0, k1, c.G, g0, s, dc,
                                   static_cast<uint8_t*>(out) + r * K * os);
  });
}

}  // namespace cpu
}  // namespace fp8ref
#endif  // HWY_ONCE

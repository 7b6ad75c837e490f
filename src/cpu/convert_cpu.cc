// fp8ref CPU backend — bulk FP8 / UE8M0 encode and decode.
//
// Highway dynamic dispatch (the best SIMD target of this machine is picked at run time) and OpenMP over
// contiguous chunks. Bit-identical to reference/convert_ref.cc for every input: integer algorithms, vectorised.
// tests/exhaustive_convert.cc checks all 2^32 f32 and all 2^16 f16/bf16 inputs per convention through the code
// the streaming loops run: encode_f32_range picks its kernel exactly as encode_f32 does and, given an output,
// writes through the same block path (jam, kernel, byte packing).
//
// Kernels (one is chosen once per call from the spec and the source format, never per vector):
//
//  * Fast16 — round-to-nearest-even to an FP8 format, the conventions' common case; integer only, in u16 lanes
//    (32 per AVX-512 vector). The magnitude is brought to a 7-fraction-bit layout: bf16 as is; f32 and f16 by
//    *jamming* (the dropped low bits OR-ed into the lowest kept bit as a sticky bit), which preserves the kept
//    LSB, the round bit and "anything non-zero below it" whenever the rounding point lies >= 2 bits above the
//    sticky bit (it lies >= 3 above). Then, with e the exponent field and emin the field of the target's smallest
//    normal, tm its fraction bits and L = 7:
//      sig = fraction | hidden bit;  c = clamp(e - (emin - L), 0, L);  w = sig << c  (exact, < 2^15)
//      n   = RNE(w / 2^S) with S = 7 - tm + L (a fixed shift);  code = n + (max(e - emin, 0) << tm)
//    For a normal target value c = L and n = RNE(sig >> (7 - tm)); for a subnormal one, d = emin - e binades
//    below, c = L - d and n = RNE(sig >> (7 - tm + d)): the fixed subnormal quantum. Lanes with d >= L, and
//    source zeros/subnormals (whose hidden bit is wrongly set), give n = 0, which is exact because L >= tm + 2 and
//    the source's subnormals lie below half the target's smallest quantum (else the fast kernel is not used:
//    f16 -> e5m2/e5m2fnuz). Carries into the next binade fall out of the addition. Overflow, Inf and NaN:
//    min(code, clamp) with clamp = the largest finite code (satfinite) or the code overflow produces (nonsat:
//    0x7F NaN for e4m3fn, 0x7C Inf for e5m2, 0x80 for fnuz), then the sign OR-ed in (fnuz: not onto a zero),
//    then a NaN blend where a NaN input's code differs from what the clamp gives.
//  * GeneralFp8<rounding> — every other FP8 spec (rz/ru/rd/rna/stochastic, saturate, payload NaNs, nan_code
//    0xFF with nonsat, f16 -> e5m2), in u32 lanes on f32 patterns: X = max(e, emin_b) in f32 bias; discarded
//    bits s = (X - tm) - (max(e,1) - 23); n = round(sig >> s); code = n + ((X - emin_b) << tm); then overflow,
//    NaN and sign as in fp8ref/convert.h. f16/bf16 are widened to f32 first, exactly, in integer and exact-FP
//    code (WidenF16).
//  * Ue8m0K — power-of-two scales.
//
// Streaming loop: every thread's chunk is processed as 4 interleaved streams (more memory-level parallelism
// than one sequential stream — what glibc's large memcpy does); each block of 4N elements becomes one full
// vector of 4N bytes (byte shifts, one in-block byte shuffle, one lane permutation), stored whole, with
// non-temporal stores (no read-for-ownership of the destination) for arrays larger than the caches.
// f64 sources use the reference's integer routine in an OpenMP loop (rare in practice, not vectorised).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/convert_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>  // Prefetch, FlushStream
#include <hwy/highway.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"

#ifndef FP8REF_CONVERT_PARAMS_ONCE
#define FP8REF_CONVERT_PARAMS_ONCE
namespace fp8ref::cpu_detail {
// Everything the kernels need, precomputed once per call from a ConversionSpec (and the source format).
struct EncodeParams {
  bool ue8m0;
  uint32_t tm;          // target fraction bits
  uint32_t emin_b;      // target's smallest normal exponent, in f32 bias (128 - bias)
  uint32_t max_code;    // largest finite magnitude code
  uint32_t rounding;    // Rounding
  uint32_t overflow;    // Overflow
  bool fnuz;
  bool ieee;            // target has Inf (e5m2)
  uint32_t nan_in_pos;  // code for a +NaN input; nan_in_neg for a -NaN input (payload mode handled apart)
  uint32_t nan_in_neg;
  bool nan_payload;     // e5m2 payload: sign | 0x7E | top-2 fraction bits
  uint32_t inf_or_nan;  // magnitude code of ±Inf / overflow NaN (fnuz: 0x80, sign not added)
  uint32_t key;         // stochastic key
  // ue8m0
  uint32_t method;  // Ue8m0Method
  bool clamp;
  uint32_t exp_lo, exp_hi, ue8m0_overflow, ue8m0_sign;
  // FastFp8 (round-to-nearest-even FP8), when `fast`: see the kernel.
  bool fast;
  bool fast_nan;           // NaN lanes need a blend: code nan_v | (sign & nan_smask)
  uint32_t fast_emin;      // exponent field of the target's smallest normal, in the *source's* bias
  uint32_t fast_clamp;     // min() bound: largest finite code (satfinite) or the overflow code (nonsat)
  uint32_t fast_nan_v, fast_nan_smask;
  // Non-temporal stores (large arrays).
  bool stream;
};
}  // namespace fp8ref::cpu_detail
#endif

HWY_BEFORE_NAMESPACE();
namespace fp8ref::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using cpu_detail::EncodeParams;

using DU = hn::ScalableTag<uint32_t>;
using VU = hn::Vec<DU>;
constexpr size_t kMaxLanes = HWY_MAX_BYTES / sizeof(uint32_t);

HWY_INLINE VU Lowbias32(VU x) {
  const DU d;
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(d, 0x7FEB352Du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(d, 0x846CA68Bu));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  return x;
}

// Random bits for the lanes with indices index_lo + lane (all in one 2^32 block with key2 = key ^ hi-term).
HWY_INLINE VU RandomBits(uint32_t index_lo, uint32_t key2) {
  const DU d;
  const VU idx = hn::Add(hn::Iota(d, 0), hn::Set(d, index_lo));
  return Lowbias32(hn::Xor(idx, hn::Set(d, key2)));
}

// Random bits of the N lanes starting at element index idx.
HWY_INLINE VU RandomBitsAt(uint64_t idx, uint32_t key) {
  const DU d;
  const size_t N = hn::Lanes(d);
  // lanes may straddle a 2^32 boundary only at the very end of a block: fall back to exact per-lane keys
  if (static_cast<uint32_t>(idx) > 0xFFFFFFFFu - (N - 1)) {
    HWY_ALIGN uint32_t tmp[kMaxLanes];
    for (size_t l = 0; l < N; ++l) {
      const uint64_t j = idx + l;
      tmp[l] = lowbias32(static_cast<uint32_t>(j) ^ key ^ lowbias32(static_cast<uint32_t>(j >> 32) + 0x85EBCA6Bu));
    }
    return hn::Load(d, tmp);
  }
  const uint32_t key2 = key ^ lowbias32(static_cast<uint32_t>(idx >> 32) + 0x85EBCA6Bu);
  return RandomBits(static_cast<uint32_t>(idx), key2);
}

// ---- General FP8 kernel --------------------------------------------------------------------------------------

// Rounds up? given the kept LSB (n), the discarded bits rem, one half of the discarded range, the top 32 bits
// of the discarded fraction, the sign mask and the random bits.
template <Rounding kR>
HWY_INLINE hn::Mask<DU> RoundUp(VU n, VU rem, VU half, VU frac32, hn::Mask<DU> neg, VU rbits) {
  const DU d;
  const VU one = hn::Set(d, 1);
  if constexpr (kR == Rounding::rne) {
    const auto odd = hn::Eq(hn::And(n, one), one);
    return hn::Or(hn::Gt(rem, half), hn::And(hn::Eq(rem, half), odd));
  } else if constexpr (kR == Rounding::rna) {
    return hn::Not(hn::Lt(rem, half));
  } else if constexpr (kR == Rounding::rz) {
    return hn::Eq(one, hn::Zero(d));
  } else if constexpr (kR == Rounding::ru) {
    return hn::AndNot(neg, hn::Ne(rem, hn::Zero(d)));
  } else if constexpr (kR == Rounding::rd) {
    return hn::And(neg, hn::Ne(rem, hn::Zero(d)));
  } else {
    return hn::Gt(rbits, hn::Not(frac32));  // stochastic: frac32 + r >= 2^32
  }
}

HWY_INLINE hn::Mask<DU> RoundUpAny(uint32_t r, VU n, VU rem, VU half, VU frac32, hn::Mask<DU> neg, VU rbits) {
  switch (static_cast<Rounding>(r)) {
    case Rounding::rne: return RoundUp<Rounding::rne>(n, rem, half, frac32, neg, rbits);
    case Rounding::rna: return RoundUp<Rounding::rna>(n, rem, half, frac32, neg, rbits);
    case Rounding::rz: return RoundUp<Rounding::rz>(n, rem, half, frac32, neg, rbits);
    case Rounding::ru: return RoundUp<Rounding::ru>(n, rem, half, frac32, neg, rbits);
    case Rounding::rd: return RoundUp<Rounding::rd>(n, rem, half, frac32, neg, rbits);
    case Rounding::stochastic: return RoundUp<Rounding::stochastic>(n, rem, half, frac32, neg, rbits);
  }
  return RoundUp<Rounding::rz>(n, rem, half, frac32, neg, rbits);
}

// f32 bit patterns -> FP8 codes (one per u32 lane).
template <Rounding kR>
HWY_INLINE VU EncodeFp8(const EncodeParams& p, VU bits, VU rbits) {
  const DU d;
  const VU zero = hn::Zero(d);
  const VU sign = hn::And(bits, hn::Set(d, 0x80000000u));
  const auto neg = hn::Ne(sign, zero);
  const VU sign8 = hn::ShiftRight<24>(sign);  // 0x80 or 0
  const VU abs = hn::And(bits, hn::Set(d, 0x7FFFFFFFu));
  const VU e = hn::ShiftRight<23>(abs);
  const VU frac = hn::And(abs, hn::Set(d, 0x7FFFFFu));
  const auto is_nan = hn::Gt(abs, hn::Set(d, 0x7F800000u));
  const auto is_inf = hn::Eq(abs, hn::Set(d, 0x7F800000u));
  const VU sig = hn::IfThenElse(hn::Eq(e, zero), frac, hn::Or(frac, hn::Set(d, 0x800000u)));
  const VU emin_b = hn::Set(d, p.emin_b);
  const VU X = hn::Max(e, emin_b);
  const VU eff_e = hn::Max(e, hn::Set(d, 1));
  // s = (X - tm) - (eff_e - 23) = X - eff_e + (23 - tm) >= 20
  const VU s = hn::Add(hn::Sub(X, eff_e), hn::Set(d, 23 - p.tm));
  const VU s1 = hn::Min(s, hn::Set(d, 31));
  const VU kept = hn::operator>>(sig, s1);
  const VU mask = hn::Sub(hn::operator<<(hn::Set(d, 1), s1), hn::Set(d, 1));
  const VU rem = hn::And(sig, mask);
  const VU half = hn::operator<<(hn::Set(d, 1), hn::Sub(s1, hn::Set(d, 1)));
  VU frac32 = zero;
  if constexpr (kR == Rounding::stochastic) {
    // top 32 bits of the discarded fraction: s <= 32 ? rem << (32 - s) : sig >> min(s - 32, 31)
    const auto small_s = hn::Not(hn::Gt(s, hn::Set(d, 32)));
    const VU left = hn::Sub(hn::Set(d, 32), hn::Min(s, hn::Set(d, 32)));
    const VU frac32_small =
        hn::IfThenElse(hn::Eq(left, hn::Set(d, 32)), zero, hn::operator<<(rem, hn::Min(left, hn::Set(d, 31))));
    const VU right = hn::Min(hn::Sub(hn::Max(s, hn::Set(d, 32)), hn::Set(d, 32)), hn::Set(d, 31));
    frac32 = hn::IfThenElse(small_s, frac32_small, hn::operator>>(sig, right));
  }
  const auto up = RoundUp<kR>(kept, rem, half, frac32, neg, rbits);
  const VU nr = hn::Add(kept, hn::IfThenElseZero(up, hn::Set(d, 1)));
  const VU code = hn::Add(nr, hn::ShiftLeftSame(hn::Sub(X, emin_b), static_cast<int>(p.tm)));

  // Overflow: rounded code above the largest finite code, or an infinite input.
  const auto ovf = hn::Or(is_inf, hn::Gt(code, hn::Set(d, p.max_code)));
  const VU max_s = hn::Or(hn::Set(d, p.max_code), sign8);
  const VU ion = p.fnuz ? hn::Set(d, p.inf_or_nan) : hn::Or(hn::Set(d, p.inf_or_nan), sign8);
  VU ovf_code;
  switch (static_cast<Overflow>(p.overflow)) {
    case Overflow::satfinite: ovf_code = max_s; break;
    case Overflow::saturate: ovf_code = hn::IfThenElse(is_inf, ion, max_s); break;
    default: {
      auto toward_zero = hn::Ne(zero, zero);  // rne, rna, stochastic
      if constexpr (kR == Rounding::rz) toward_zero = hn::Eq(zero, zero);
      if constexpr (kR == Rounding::ru) toward_zero = neg;
      if constexpr (kR == Rounding::rd) toward_zero = hn::Not(neg);
      ovf_code = hn::IfThenElse(hn::AndNot(is_inf, toward_zero), max_s, ion);
    }
  }
  // NaN input.
  VU nan_code = hn::IfThenElse(neg, hn::Set(d, p.nan_in_neg), hn::Set(d, p.nan_in_pos));
  if (p.nan_payload) {
    // sign | exp-all-ones | quiet bit | top tm fraction bits
    const VU top = hn::ShiftRightSame(frac, static_cast<int>(23 - p.tm));
    nan_code = hn::Or(hn::Or(sign8, hn::Set(d, p.inf_or_nan | (1u << (p.tm - 1)))), top);
  }
  // Finite result: sign applied; fnuz has no -0.
  VU fin = hn::Or(code, sign8);
  if (p.fnuz) fin = hn::IfThenElse(hn::Eq(code, zero), zero, fin);
  VU out = hn::IfThenElse(ovf, ovf_code, fin);
  out = hn::IfThenElse(is_nan, nan_code, out);
  return out;
}

// ---- UE8M0 kernel --------------------------------------------------------------------------------------------

// f32 bit patterns -> UE8M0 codes.
HWY_INLINE VU EncodeUe8m0(const EncodeParams& p, VU bits, VU rbits) {
  const DU d;
  const VU zero = hn::Zero(d);
  const VU abs = hn::And(bits, hn::Set(d, 0x7FFFFFFFu));
  const VU e = hn::ShiftRight<23>(abs);
  const VU frac = hn::And(abs, hn::Set(d, 0x7FFFFFu));
  const VU ovf = hn::Set(d, p.ue8m0_overflow);
  const VU ff = hn::Set(d, 0xFF);
  const auto is_nan = hn::Gt(abs, hn::Set(d, 0x7F800000u));
  VU out;
  const auto neg = hn::Ne(hn::And(bits, hn::Set(d, 0x80000000u)), zero);
  const auto nonpos = hn::Or(neg, hn::Eq(abs, zero));
  if (static_cast<Ue8m0Method>(p.method) != Ue8m0Method::value) {
    const VU half = hn::Set(d, 0x400000u);
    const auto up = static_cast<Ue8m0Method>(p.method) == Ue8m0Method::bit_ceil
                        ? hn::Ne(frac, zero)
                        : hn::Or(hn::Gt(frac, half), hn::AndNot(hn::Eq(e, zero), hn::Eq(frac, half)));
    const VU code = hn::Add(e, hn::IfThenElseZero(up, hn::Set(d, 1)));
    out = p.clamp ? code : hn::IfThenElse(hn::Gt(code, hn::Set(d, 0xFE)), ovf, code);
    if (static_cast<Ue8m0Sign>(p.ue8m0_sign) == Ue8m0Sign::nonpositive_to_nan) out = hn::IfThenElse(nonpos, ff, out);
    out = hn::IfThenElse(is_nan, ff, out);
  } else {
    const auto is_inf = hn::Eq(abs, hn::Set(d, 0x7F800000u));
    const auto sub = hn::Eq(e, zero);
    // discarded part below the leading one, on a 23-bit scale (f32 subnormals >= 2^-127 use 22 bits, shifted)
    const VU rem = hn::IfThenElse(sub, hn::ShiftLeft<1>(hn::And(frac, hn::Set(d, 0x3FFFFFu))), frac);
    const VU half = hn::Set(d, 0x400000u);
    const VU frac32 = hn::ShiftLeft<9>(rem);
    const auto up = RoundUpAny(p.rounding, hn::Set(d, 1), rem, half, frac32, hn::Ne(zero, zero), rbits);
    VU code = hn::Add(e, hn::IfThenElseZero(up, hn::Set(d, 1)));
    // subnormals below 2^-127 (and zero) clip to 0x00
    code = hn::IfThenElse(hn::And(sub, hn::Lt(frac, hn::Set(d, 0x400000u))), zero, code);
    code = hn::IfThenElse(hn::Or(is_inf, hn::Gt(code, hn::Set(d, 0xFE))), ovf, code);
    if (static_cast<Ue8m0Sign>(p.ue8m0_sign) == Ue8m0Sign::nonpositive_to_nan) code = hn::IfThenElse(nonpos, ff, code);
    out = hn::IfThenElse(is_nan, ff, code);
  }
  if (p.clamp) out = hn::Min(hn::Max(out, hn::Set(d, p.exp_lo)), hn::Set(d, p.exp_hi));
  return out;
}

// ---- Sources -------------------------------------------------------------------------------------------------

// Source kinds: 0 = f32, 1 = bf16, 2 = f16. Raw source bits sit in u32 lanes (16-bit sources zero-extended).
template <int kSrc>
using SrcT = std::conditional_t<kSrc == 0, uint32_t, uint16_t>;

template <int kSrc>
struct SrcLayout;
template <>
struct SrcLayout<0> {  // f32
  static constexpr int kMan = 23, kSignShift = 24;
  static constexpr uint32_t kAbs = 0x7FFFFFFFu, kInf = 0x7F800000u;
};
template <>
struct SrcLayout<1> {  // bf16
  static constexpr int kMan = 7, kSignShift = 8;
  static constexpr uint32_t kAbs = 0x7FFFu, kInf = 0x7F80u;
};
template <>
struct SrcLayout<2> {  // f16
  static constexpr int kMan = 10, kSignShift = 8;
  static constexpr uint32_t kAbs = 0x7FFFu, kInf = 0x7C00u;
};

template <int kSrc>
HWY_INLINE VU LoadRaw(const SrcT<kSrc>* src) {
  const DU d;
  if constexpr (kSrc == 0) {
    return hn::LoadU(d, src);
  } else {
    const hn::Rebind<uint16_t, DU> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, src));
  }
}

// f16 bit patterns (low 16 bits of each lane) -> f32 bit patterns, exactly, in integer and exact FP code.
HWY_INLINE VU WidenF16(VU h) {
  const DU d;
  const hn::Rebind<int32_t, DU> di;
  const hn::Rebind<float, DU> df;
  const VU sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(d, 0x8000u)));
  const VU e = hn::And(hn::ShiftRight<10>(h), hn::Set(d, 0x1F));
  const VU frac = hn::And(h, hn::Set(d, 0x3FFu));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(d, 112))), hn::ShiftLeft<13>(frac));
  const VU special = hn::Or(hn::Set(d, 0x7F800000u), hn::ShiftLeft<13>(frac));
  // subnormal: frac · 2^-24, exact (frac < 2^10 converts exactly; the product is a normal f32)
  const auto sub_f = hn::Mul(hn::ConvertTo(df, hn::BitCast(di, frac)), hn::Set(df, 5.9604644775390625e-8f));
  const VU sub = hn::BitCast(d, sub_f);
  VU mag = hn::IfThenElse(hn::Eq(e, hn::Zero(d)), sub, normal);
  mag = hn::IfThenElse(hn::Eq(e, hn::Set(d, 0x1F)), special, mag);
  return hn::Or(sign, mag);
}

// Raw source lanes -> f32 bit patterns (exact).
template <int kSrc>
HWY_INLINE VU ToF32Bits(VU raw) {
  if constexpr (kSrc == 0) return raw;
  if constexpr (kSrc == 1) return hn::ShiftLeft<16>(raw);
  return WidenF16(raw);
}

// ---- Kernel objects ------------------------------------------------------------------------------------------
// Each holds a copy of what it needs, so nothing is re-read through a pointer the byte stores might alias.
// A kernel maps raw source lanes (u32 lanes; 16-bit sources zero-extended) and random bits to codes in u32
// lanes (operator(), for tails and the checksum sweep), and a block of 4N elements to 4N bytes (Block).

#undef FP8REF_WIDE
#if HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_SSSE3
// u16 lanes, byte shuffles and lane permutations (the scalar target has none; Highway 1.0.3's u16 variable
// shift does not compile for SSSE3, which keeps the general kernels and per-vector stores)
#define FP8REF_WIDE 1
#else
#define FP8REF_WIDE 0
#endif

// kBlocks: the streaming loop stores whole blocks of 4N bytes (else one vector of N codes at a time);
// kWide16: the kernel has its own Block (else four operator() calls packed by Packer::Pack4).
// GeneralFp8 and Ue8m0K take f32 bit patterns; 16-bit sources reach them widened (EncodeWidened).
template <Rounding kR>
struct GeneralFp8 {
  static constexpr bool kBlocks = false, kWide16 = false;
  EncodeParams p;
  bool random() const { return kR == Rounding::stochastic; }
  HWY_INLINE VU operator()(VU bits, VU rbits) const { return EncodeFp8<kR>(p, bits, rbits); }
};

struct Ue8m0K {
  static constexpr bool kBlocks = true, kWide16 = false;
  EncodeParams p;
  bool random() const { return static_cast<Rounding>(p.rounding) == Rounding::stochastic; }
  HWY_INLINE VU operator()(VU bits, VU rbits) const { return EncodeUe8m0(p, bits, rbits); }
};

#if FP8REF_WIDE
using D8 = hn::Repartition<uint8_t, DU>;
using V8 = hn::Vec<D8>;
using D16 = hn::Repartition<uint16_t, DU>;
using V16 = hn::Vec<D16>;
using D64 = hn::Repartition<uint64_t, DU>;

// Byte packing of codes into one full vector of 4N bytes, in element order (N = u32 lanes of a vector).
struct Packer {
  V8 sh4, sh_pairs, sh_nat;
  decltype(hn::SetTableIndices(DU(), static_cast<const int32_t*>(nullptr))) perm32;
  decltype(hn::SetTableIndices(D64(), static_cast<const int64_t*>(nullptr))) perm64;
  Packer() {
    const DU d;
    const D8 d8;
    const D64 d64;
    const size_t N = hn::Lanes(d);
    const size_t blocks = N / 4;  // 128-bit blocks
    HWY_ALIGN uint8_t sh[3][4 * kMaxLanes];
    const int pos_pairs[4] = {0, 2, 1, 3};
    for (size_t o = 0; o < 4 * N; ++o) {
      const size_t b = o % 16;
      sh[0][o] = static_cast<uint8_t>(4 * (b % 4) + b / 4);
      sh[1][o] = static_cast<uint8_t>(4 * (b % 4) + pos_pairs[b / 4]);
      sh[2][o] = static_cast<uint8_t>(2 * (b % 8) + b / 8);
    }
    sh4 = hn::Load(d8, sh[0]);
    sh_pairs = hn::Load(d8, sh[1]);
    sh_nat = hn::Load(d8, sh[2]);
    HWY_ALIGN int32_t i32[kMaxLanes];
    for (size_t o = 0; o < N; ++o) i32[o] = static_cast<int32_t>(4 * (o % blocks) + o / blocks);
    perm32 = hn::SetTableIndices(d, i32);
    HWY_ALIGN int64_t i64[kMaxLanes];
    for (size_t o = 0; o < N / 2; ++o) i64[o] = static_cast<int64_t>(2 * (o % blocks) + o / blocks);
    perm64 = hn::SetTableIndices(d64, i64);
  }
  // c_k: codes of elements [kN, (k+1)N) in u32 lanes. Byte k of u32 lane j <- c_k[j]; a 4x4 byte transpose in
  // each 128-bit block (lanes 4m..4m+3) gathers c_k's 4 bytes into u32 lane 4m+k; the lane permutation orders them.
  HWY_INLINE V8 Pack4(VU c0, VU c1, VU c2, VU c3) const {
    const DU d;
    const D8 d8;
    const VU w = hn::Or(hn::Or(c0, hn::ShiftLeft<8>(c1)), hn::Or(hn::ShiftLeft<16>(c2), hn::ShiftLeft<24>(c3)));
    const VU t = hn::BitCast(d, hn::TableLookupBytes(hn::BitCast(d8, w), sh4));
    return hn::BitCast(d8, hn::TableLookupLanes(t, perm32));
  }
  // p: codes of elements j (u16 lane 2j) and N + j (lane 2j+1); q: the same for 2N + j and 3N + j.
  HWY_INLINE V8 PackPairs(V16 p, V16 q) const {
    const DU d;
    const D8 d8;
    const V16 w = hn::Or(p, hn::ShiftLeft<8>(q));  // u32 lane j: bytes [j, 2N + j, N + j, 3N + j]
    const VU t = hn::BitCast(d, hn::TableLookupBytes(hn::BitCast(d8, w), sh_pairs));
    return hn::BitCast(d8, hn::TableLookupLanes(t, perm32));
  }
  // x: codes of elements [0, 2N) in u16 lanes; y: [2N, 4N).
  HWY_INLINE V8 PackNatural(V16 x, V16 y) const {
    const D8 d8;
    const D64 d64;
    const V16 w = hn::Or(x, hn::ShiftLeft<8>(y));  // u16 lane j: bytes [j, 2N + j]
    const auto t = hn::BitCast(d64, hn::TableLookupBytes(hn::BitCast(d8, w), sh_nat));
    return hn::BitCast(d8, hn::TableLookupLanes(t, perm64));
  }
};

// ---- FastFp8: round-to-nearest-even to FP8, in u16 lanes ----------------------------------------------------
// Input: `a`, the magnitude in a 7-fraction-bit layout (exponent field above bit 7, 8 bits for f32/bf16 and 5 for
// f16) and `sgn` with the sign at bit 7. f32 and f16 are brought to 7 fraction bits by jamming: the dropped bits
// are OR-ed into the lowest kept bit (a sticky bit). That is exact for every rounding at or above the second-
// lowest kept bit — here the rounding point is >= 3 bits higher (f32 -> e4m3fn drops 20 bits, the jam keeps the
// top 7 and a sticky), so the kept LSB, the round bit and "anything below it is non-zero" are all unchanged.
constexpr int kLift = 7;  // L in the algorithm at the top of the file

// sig << c for c in [0, kLift] (per u16 lane; the result < 2^15). AVX-512BW has vpsllvw; on AVX2 and SSE4 Highway
// 1.0.3 emulates the u16 variable shift by a multiply with 2^c built through two f32 conversions and a pack (~8
// ops), which made the bf16 -> e4m3fn stream compute-bound on AVX2 (Zen 3: 0.47 of memcpy). Here 2^c comes from
// a 16-byte table by one byte shuffle (index c in the low byte, an index with bit 7 set zeroes the high byte) and
// one u16 multiply: sig·2^c, exact.
HWY_INLINE V16 ShlSmall(V16 sig, V16 c) {
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
  const D16 d;
  const hn::Repartition<uint8_t, D16> d8;
  alignas(16) static constexpr uint8_t kPow2[16] = {1, 2, 4, 8, 16, 32, 64, 128, 0, 0, 0, 0, 0, 0, 0, 0};
  const V16 idx = hn::Or(c, hn::Set(d, static_cast<uint16_t>(0x8000)));
  const V16 pow2 = hn::BitCast(d, hn::TableLookupBytesOr0(hn::LoadDup128(d8, kPow2), hn::BitCast(d8, idx)));
  return hn::Mul(sig, pow2);
#else
  return hn::operator<<(sig, c);
#endif
}

// kNan: 0 = a NaN input gets what the clamp gives; 1 = the constant nan_v; 2 = nan_v | (sign & nan_smask).
template <int kTm, int kNan, bool kFnuz>
struct FastParams16 {
  uint16_t emin, clampv, nan_v, nan_smask, inf;
  HWY_INLINE V16 Codes(V16 a, V16 sgn) const {
    constexpr int kS = 7 - kTm + kLift;
    static_assert(kLift >= kTm + 2, "lanes L or more binades below the smallest normal must round to 0");
    const D16 d;
    const V16 e = hn::ShiftRight<7>(a);
    const V16 c = hn::Min(hn::SaturatedSub(e, hn::Set(d, static_cast<uint16_t>(emin - kLift))),
                          hn::Set(d, static_cast<uint16_t>(kLift)));
    const V16 sig = hn::OrAnd(hn::Set(d, 0x80), a, hn::Set(d, 0x7F));  // a subnormal source's is wrong, and harmless
    const V16 w = ShlSmall(sig, c);                                       // < 2^15
    // RNE: add half - 1, or half when the kept LSB is odd, then drop the kS bits
    const auto odd = hn::TestBit(w, hn::Set(d, static_cast<uint16_t>(1u << kS)));
    const V16 n = hn::ShiftRight<kS>(
        hn::Add(w, hn::IfThenElse(odd, hn::Set(d, 1u << (kS - 1)), hn::Set(d, (1u << (kS - 1)) - 1))));
    const V16 code = hn::Add(n, hn::ShiftLeft<kTm>(hn::SaturatedSub(e, hn::Set(d, emin))));
    V16 s = sgn;
    if constexpr (kFnuz) s = hn::IfThenZeroElse(hn::Eq(code, hn::Zero(d)), s);  // no -0
    V16 out = hn::OrAnd(hn::Min(code, hn::Set(d, clampv)), s, hn::Set(d, 0x80));
    if constexpr (kNan != 0) {
      // a NaN input: a > inf; both are magnitudes below 0x8000, so a signed compare is exact (no unsigned u16
      // compare before AVX-512: Highway emulates it with two extra XORs)
      const hn::RebindToSigned<D16> di;
      const auto is_nan = hn::RebindMask(d, hn::Gt(hn::BitCast(di, a), hn::Set(di, static_cast<int16_t>(inf))));
      if constexpr (kNan == 1) {
        out = hn::IfThenElse(is_nan, hn::Set(d, nan_v), out);
      } else {
        const V16 nan_code = hn::OrAnd(hn::Set(d, nan_v), s, hn::Set(d, nan_smask));
        out = hn::IfThenElse(is_nan, nan_code, out);
      }
    }
    return out;
  }
};

// Jams a u32 lane's f32 bits to 16 (bf16 layout + sticky): (x >> 16) | (low 16 bits != 0), in u32 lanes.
HWY_INLINE VU Jam32(VU x) {
  const DU d;
  return hn::Or(hn::ShiftRight<16>(x), hn::Min(hn::And(x, hn::Set(d, 0xFFFFu)), hn::Set(d, 1)));
}
// Two f32 vectors -> one u16 vector: lane 2j = jam(A[j]), lane 2j+1 = jam(B[j]).
HWY_INLINE V16 JamPair(VU A, VU B) {
  const DU d;
  const D16 d16;
  const VU hi = hn::OrAnd(hn::ShiftRight<16>(A), B, hn::Set(d, 0xFFFF0000u));
  const VU lo = hn::OrAnd(hn::ShiftLeft<16>(B), A, hn::Set(d, 0xFFFFu));
  return hn::Or(hn::BitCast(d16, hi), hn::Min(hn::BitCast(d16, lo), hn::Set(d16, 1)));
}
// f16 magnitude (in u16 lanes, sign cleared) -> 7 fraction bits + sticky (exponent field keeps its 5 bits).
template <class V>
HWY_INLINE V JamF16(V a) {
  const hn::DFromV<V> d;
  return hn::Or(hn::ShiftRight<3>(a), hn::Min(hn::And(a, hn::Set(d, 7)), hn::Set(d, 1)));
}

template <int kSrc, int kTm, int kNan, bool kFnuz>
struct Fast16 {
  static constexpr bool kBlocks = true, kWide16 = true;
  FastParams16<kTm, kNan, kFnuz> f;
  bool random() const { return false; }
  // u32 lanes (upper u16 halves are 0 and encode to 0)
  HWY_INLINE VU operator()(VU raw, VU /*rbits*/) const {
    const DU d;
    const D16 d16;
    VU a, sgn;
    if constexpr (kSrc == 0) {
      const VU j = Jam32(raw);
      a = hn::And(j, hn::Set(d, 0x7FFFu));
      sgn = hn::ShiftRight<8>(j);
    } else {
      a = hn::And(raw, hn::Set(d, 0x7FFFu));
      if constexpr (kSrc == 2) a = JamF16(a);
      sgn = hn::ShiftRight<8>(raw);
    }
    return hn::BitCast(d, f.Codes(hn::BitCast(d16, a), hn::BitCast(d16, sgn)));
  }
  template <class Src>
  HWY_INLINE V8 Block(const Src& s, size_t at, const Packer& pk) const {
    const DU d;
    const D16 d16;
    const size_t N = hn::Lanes(d);
    const V16 mag = hn::Set(d16, 0x7FFF);
    if constexpr (kSrc == 0) {
      const V16 p = JamPair(s.U32(at), s.U32(at + N));
      const V16 q = JamPair(s.U32(at + 2 * N), s.U32(at + 3 * N));
      const V16 cp = f.Codes(hn::And(p, mag), hn::ShiftRight<8>(p));
      const V16 cq = f.Codes(hn::And(q, mag), hn::ShiftRight<8>(q));
      return pk.PackPairs(cp, cq);
    } else {
      const V16 x = s.U16(at), y = s.U16(at + 2 * N);
      V16 ax = hn::And(x, mag), ay = hn::And(y, mag);
      if constexpr (kSrc == 2) {
        ax = JamF16(ax);
        ay = JamF16(ay);
      }
      return pk.PackNatural(f.Codes(ax, hn::ShiftRight<8>(x)), f.Codes(ay, hn::ShiftRight<8>(y)));
    }
  }
};
#endif  // FP8REF_WIDE

// Calls fn(kernel) with the fast kernel for source kSrc if the spec takes it; returns whether it did.
// Kernels are chosen once per call, never per vector.
template <int kSrc, class Fn>
HWY_INLINE bool WithFast(const EncodeParams& p, const Fn& fn) {
#if FP8REF_WIDE
  if (!p.fast) return false;
  const uint16_t e = static_cast<uint16_t>(p.fast_emin), c = static_cast<uint16_t>(p.fast_clamp);
  const uint16_t v = static_cast<uint16_t>(p.fast_nan_v), m = static_cast<uint16_t>(p.fast_nan_smask);
  const uint16_t inf = kSrc == 2 ? 0x0F80 : 0x7F80;  // +Inf after the jam
  const int nan_mode = !p.fast_nan ? 0 : m == 0 ? 1 : 2;
  auto go = [&](auto tm, auto fnuz) {
    constexpr int kTm = decltype(tm)::value;
    constexpr bool kFnuz = decltype(fnuz)::value;
    switch (nan_mode) {
      case 0: fn(Fast16<kSrc, kTm, 0, kFnuz>{{e, c, v, m, inf}}); return;
      case 1: fn(Fast16<kSrc, kTm, 1, kFnuz>{{e, c, v, m, inf}}); return;
      default: fn(Fast16<kSrc, kTm, 2, kFnuz>{{e, c, v, m, inf}}); return;
    }
  };
  using T = std::true_type;
  using F = std::false_type;
  if (p.tm == 3) {
    if (p.fnuz) {
      go(std::integral_constant<int, 3>(), T());
    } else {
      go(std::integral_constant<int, 3>(), F());
    }
    return true;
  }
  if constexpr (kSrc != 2) {  // (f16 -> e5m2 never takes the fast kernel)
    if (p.fnuz) {
      go(std::integral_constant<int, 2>(), T());
    } else {
      go(std::integral_constant<int, 2>(), F());
    }
    return true;
  }
#else
  (void)p;
  (void)fn;
#endif
  return false;
}

// Calls fn(kernel) with the general FP8 or the UE8M0 kernel (f32 bit patterns in).
template <class Fn>
HWY_INLINE void WithGeneral(const EncodeParams& p, const Fn& fn) {
  if (p.ue8m0) {
    fn(Ue8m0K{p});
    return;
  }
  switch (static_cast<Rounding>(p.rounding)) {
    case Rounding::rne: fn(GeneralFp8<Rounding::rne>{p}); return;
    case Rounding::rz: fn(GeneralFp8<Rounding::rz>{p}); return;
    case Rounding::ru: fn(GeneralFp8<Rounding::ru>{p}); return;
    case Rounding::rd: fn(GeneralFp8<Rounding::rd>{p}); return;
    case Rounding::rna: fn(GeneralFp8<Rounding::rna>{p}); return;
    case Rounding::stochastic: fn(GeneralFp8<Rounding::stochastic>{p}); return;
  }
}

// ---- Loops ---------------------------------------------------------------------------------------------------

// N codes (u32 lanes, each <= 0xFF) -> N bytes.
HWY_INLINE void StoreCodes(VU codes, uint8_t* dst) {
  const hn::Rebind<int32_t, DU> di;
  const hn::Rebind<uint8_t, DU> d8;
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, codes)), d8, dst);
}

template <class K>
HWY_INLINE VU RandomOrZero(const K& k, uint64_t index, uint32_t key) {
  return k.random() ? RandomBitsAt(index, key) : hn::Zero(DU());
}

// Sources of blocks: a pointer, or (for the exhaustive sweep) the bit patterns base + offset themselves.
template <int kSrc>
struct PtrSrc {
  const SrcT<kSrc>* p;
  HWY_INLINE VU U32(size_t at) const { return LoadRaw<kSrc>(p + at); }
#if FP8REF_WIDE
  HWY_INLINE V16 U16(size_t at) const { return hn::LoadU(D16(), reinterpret_cast<const uint16_t*>(p) + at); }
#endif
};
struct PatternSrc {
  uint32_t base;
  HWY_INLINE VU U32(size_t at) const {
    const DU d;
    return hn::Add(hn::Iota(d, 0), hn::Set(d, base + static_cast<uint32_t>(at)));
  }
};

#if FP8REF_WIDE
// 4N elements from s at offset `at` (element index `index`) -> 4N bytes.
template <class K, class Src>
HWY_INLINE V8 BlockOf(const K& k, const Src& s, size_t at, uint64_t index, uint32_t key, const Packer& pk) {
  if constexpr (K::kWide16) {
    (void)index;
    (void)key;
    return k.Block(s, at, pk);
  } else {
    const size_t N = hn::Lanes(DU());
    return pk.Pack4(k(s.U32(at), RandomOrZero(k, index, key)), k(s.U32(at + N), RandomOrZero(k, index + N, key)),
                    k(s.U32(at + 2 * N), RandomOrZero(k, index + 2 * N, key)),
                    k(s.U32(at + 3 * N), RandomOrZero(k, index + 3 * N, key)));
  }
}
#endif

// One vector at a time, then the tail through a padded buffer, same kernel.
template <int kSrc, class K>
HWY_INLINE void RunSmall(const K& k, const SrcT<kSrc>* src, uint8_t* dst, size_t n, uint64_t first, uint32_t key) {
  const DU d;
  const size_t N = hn::Lanes(d);
  size_t i = 0;
  for (; i + N <= n; i += N) StoreCodes(k(LoadRaw<kSrc>(src + i), RandomOrZero(k, first + i, key)), dst + i);
  if (i < n) {
    HWY_ALIGN uint32_t in[kMaxLanes] = {};
    HWY_ALIGN uint8_t out[kMaxLanes] = {};
    const size_t rest = n - i;
    for (size_t l = 0; l < rest; ++l) in[l] = src[i + l];
    StoreCodes(k(hn::Load(d, in), RandomOrZero(k, first + i, key)), out);
    std::memcpy(dst + i, out, rest);
  }
}

constexpr size_t kPrefetchBytes = 4096;

template <int kSrc, class K>
void RunLoop(const K k, const SrcT<kSrc>* src, uint8_t* dst, size_t n, uint64_t first, uint32_t key, bool stream) {
  size_t i = 0;
  const size_t N = hn::Lanes(DU());
#if FP8REF_WIDE
  constexpr bool kBlocks = K::kBlocks;
#else
  constexpr bool kBlocks = false;
#endif
  const size_t U = kBlocks ? 4 * N : N;  // elements per unit: a block (4N bytes stored whole) or a vector
  if (n >= 64 * U) {
    // Four interleaved streams: quarters [i, i+q), [i+q, i+2q), ... advanced in lockstep. The rest (< 4U
    // elements, and the head up to the alignment non-temporal stores need) goes one vector at a time.
    if constexpr (kBlocks) {
#if FP8REF_WIDE
      const D8 d8;
      const Packer pk;
      const PtrSrc<kSrc> s{src};
      // each stream advances by whole 64-byte lines of codes (AVX2: two 32-byte blocks in a row): non-temporal
      // stores that fill a line only partially before the next stream's stores evict the write-combining buffer
      // go out as partial writes — on Zen 3 (AVX2, 32-byte blocks, four streams interleaved block by block) that
      // made the bf16 -> e4m3fn stream ~30% slower than ordinary stores
      const size_t L = U >= 64 ? U : 64;  // elements (= code bytes) per stream step
      if (stream) {  // the streams start on line boundaries
        const size_t head = (L - (reinterpret_cast<uintptr_t>(dst) & (L - 1))) & (L - 1);
        RunSmall<kSrc>(k, src, dst, head, first, key);
        i = head;
      }
      const size_t q = (n - i) / (4 * L) * L;
      auto put = [&](size_t at) __attribute__((always_inline)) {
        // software prefetch of every source line kPrefetchBytes ahead of each stream (on this VM the hardware
        // prefetchers alone leave the four read streams latency-bound)
        const uint8_t* ahead = reinterpret_cast<const uint8_t*>(src + at) + kPrefetchBytes;
        for (size_t l = 0; l < U * sizeof(SrcT<kSrc>); l += 64) hwy::Prefetch(ahead + l);
        const V8 v = BlockOf(k, s, at, first + at, key, pk);
        if (stream) {
          hn::Stream(v, d8, dst + at);
        } else {
          hn::StoreU(v, d8, dst + at);
        }
      };
      for (size_t j = i; j < i + q; j += L) {
        if constexpr (K::kWide16) {  // small kernel: unrolled
          for (size_t b = 0; b < L; b += U) put(j + b);
          for (size_t b = 0; b < L; b += U) put(j + q + b);
          for (size_t b = 0; b < L; b += U) put(j + 2 * q + b);
          for (size_t b = 0; b < L; b += U) put(j + 3 * q + b);
        } else {
#pragma GCC unroll 1
          for (size_t r = 0; r < 4; ++r)  // (one copy of a large kernel, for compile time)
#pragma GCC unroll 1
            for (size_t b = 0; b < L; b += U) put(j + r * q + b);
        }
      }
      i += 4 * q;
#endif
    } else {
      const size_t q = n / (4 * U) * U;
      for (size_t j = 0; j < q; j += U) {
#pragma GCC unroll 1
        for (size_t r = 0; r < 4; ++r) {
          const size_t at = j + r * q;
          StoreCodes(k(LoadRaw<kSrc>(src + at), RandomOrZero(k, first + at, key)), dst + at);
        }
      }
      i = 4 * q;
    }
  }
  RunSmall<kSrc>(k, src + i, dst + i, n - i, first + i, key);
  if (kBlocks && stream) hwy::FlushStream();
}

// 16-bit sources through the general kernels: widened exactly to f32 patterns, a chunk at a time in a buffer.
template <int kSrc, class K>
void EncodeWidened(const K& k, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first, uint32_t key) {
  const DU d;
  const size_t N = hn::Lanes(d);
  constexpr size_t kChunk = 4096;
  HWY_ALIGN uint32_t buf[kChunk];
  for (size_t i = 0; i < n; i += kChunk) {
    const size_t m = n - i < kChunk ? n - i : kChunk;
    size_t j = 0;
    for (; j + N <= m; j += N) hn::Store(ToF32Bits<kSrc>(LoadRaw<kSrc>(src + i + j)), d, buf + j);
    if (j < m) {
      HWY_ALIGN uint32_t in[kMaxLanes] = {};
      HWY_ALIGN uint32_t out[kMaxLanes];
      for (size_t l = 0; l < m - j; ++l) in[l] = src[i + j + l];
      hn::Store(ToF32Bits<kSrc>(hn::Load(d, in)), d, out);
      std::memcpy(buf + j, out, (m - j) * sizeof(uint32_t));
    }
    RunLoop<0>(k, buf, dst + i, m, first + i, key, false);
  }
}

void EncodeF32(const EncodeParams& p, const float* src, uint8_t* dst, size_t n, uint64_t first_index) {
  const auto* s = reinterpret_cast<const uint32_t*>(src);
  auto run = [&](const auto& k) { RunLoop<0>(k, s, dst, n, first_index, p.key, p.stream); };
  if (!WithFast<0>(p, run)) WithGeneral(p, run);
}
template <int kSrc>
void Encode16(const EncodeParams& p, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first_index) {
  if (WithFast<kSrc>(p, [&](const auto& k) { RunLoop<kSrc>(k, src, dst, n, first_index, p.key, p.stream); })) return;
  WithGeneral(p, [&](const auto& k) { EncodeWidened<kSrc>(k, src, dst, n, first_index, p.key); });
}
void EncodeBf16(const EncodeParams& p, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first_index) {
  Encode16<1>(p, src, dst, n, first_index);
}
void EncodeF16(const EncodeParams& p, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first_index) {
  Encode16<2>(p, src, dst, n, first_index);
}

// Every f32 bit pattern in [begin, end) (end <= 2^32), generated in registers, through the kernel encode_f32
// would use (the random bits of element i are keyed by i = the pattern). Checksum Σ code · (pattern | 1)
// mod 2^32, accumulated per lane. With `out`, the codes go through the streaming loop's block path (the same
// code, jam and byte packing included) into out, and the checksum is taken from what was stored.
template <class K>
uint64_t RangeLoop(const K k, uint64_t begin, uint64_t end, uint8_t* out, uint32_t key) {
  const DU d;
  const size_t N = hn::Lanes(d);
  VU acc = hn::Zero(d);
  uint64_t i = begin;
  const VU iota = hn::Iota(d, 0);
  const VU one = hn::Set(d, 1);
#if FP8REF_WIDE
  if (K::kBlocks && out) {
    const D8 d8;
    const hn::Rebind<uint8_t, DU> d8q;
    const size_t B = hn::Lanes(d8);
    const Packer pk;
    const PatternSrc s{static_cast<uint32_t>(begin)};
    for (; i + B <= end; i += B) {
      uint8_t* o = out + (i - begin);
      hn::StoreU(BlockOf(k, s, i - begin, i, key, pk), d8, o);
      for (size_t r = 0; r < 4; ++r) {
        const VU bits = hn::Add(iota, hn::Set(d, static_cast<uint32_t>(i + r * N)));
        acc = hn::Add(acc, hn::Mul(hn::PromoteTo(d, hn::LoadU(d8q, o + r * N)), hn::Or(bits, one)));
      }
    }
  }
#endif
  for (; i + N <= end; i += N) {
    const VU bits = hn::Add(iota, hn::Set(d, static_cast<uint32_t>(i)));
    const VU codes = k(bits, RandomOrZero(k, i, key));
    acc = hn::Add(acc, hn::Mul(codes, hn::Or(bits, one)));
    if (out) StoreCodes(codes, out + (i - begin));
  }
  HWY_ALIGN uint32_t lanes[kMaxLanes];
  hn::Store(acc, d, lanes);
  uint32_t sum = 0;
  for (size_t l = 0; l < N; ++l) sum += lanes[l];
  for (; i < end; ++i) {  // end not a multiple of N: scalar tail through the vector kernel, one lane used
    HWY_ALIGN uint32_t in[kMaxLanes] = {};
    HWY_ALIGN uint8_t o[kMaxLanes] = {};
    in[0] = static_cast<uint32_t>(i);
    StoreCodes(k(hn::Load(d, in), RandomOrZero(k, i, key)), o);
    sum += o[0] * (static_cast<uint32_t>(i) | 1u);
    if (out) out[i - begin] = o[0];
  }
  return sum;
}

uint64_t EncodeRange(const EncodeParams& p, uint64_t begin, uint64_t end, uint8_t* out) {
  uint64_t sum = 0;
  auto run = [&](const auto& k) { sum = RangeLoop(k, begin, end, out, p.key); };
  if (!WithFast<0>(p, run)) WithGeneral(p, run);
  return sum;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }
bool TargetIsX86Avx3() { return HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3; }

}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <functional>
#include <string>
#include <vector>

namespace fp8ref {
HWY_EXPORT(EncodeF32);
HWY_EXPORT(EncodeBf16);
HWY_EXPORT(EncodeF16);
HWY_EXPORT(EncodeRange);
HWY_EXPORT(TargetName);
HWY_EXPORT(TargetIsX86Avx3);

namespace cpu {
namespace {

// Arrays at least this long (elements) are written with non-temporal stores: their codes would not stay in the
// caches anyway, and streaming them skips the read-for-ownership of every destination line.
constexpr size_t kStreamMin = size_t{1} << 22;

// `from`: the source format (f32, bf16 or f16), which decides whether the fast kernel is exact for the spec.
cpu_detail::EncodeParams make_params(const ConversionSpec& s, Format from, size_t n) {
  cpu_detail::EncodeParams p{};
  const FormatInfo& fi = format_info(s.to);
  p.ue8m0 = s.to == Format::ue8m0;
  p.tm = static_cast<uint32_t>(fi.man_bits);
  p.emin_b = static_cast<uint32_t>(128 - fi.bias);
  p.max_code = fi.max_code;
  p.rounding = static_cast<uint32_t>(s.rounding);
  p.overflow = static_cast<uint32_t>(s.overflow);
  p.fnuz = fi.special == SpecialStyle::fnuz;
  p.ieee = fi.special == SpecialStyle::ieee;
  p.key = stochastic_key(s.seed);
  if (p.fnuz) {
    p.nan_in_pos = p.nan_in_neg = 0x80;
    p.inf_or_nan = 0x80;
  } else {
    p.nan_in_pos = s.nan_code;
    p.nan_in_neg = s.nan == NanOut::canonical ? s.nan_code : (s.nan_code | 0x80u);
    p.inf_or_nan = p.ieee ? ((1u << (fi.exp_bits + fi.man_bits)) - (1u << fi.man_bits)) : s.nan_code;
  }
  p.nan_payload = s.nan == NanOut::payload && p.ieee;
  p.method = static_cast<uint32_t>(s.ue8m0_method);
  p.clamp = s.ue8m0_clamp;
  p.exp_lo = static_cast<uint32_t>(s.exp_lo);
  p.exp_hi = static_cast<uint32_t>(s.exp_hi);
  p.ue8m0_overflow = s.overflow == Overflow::satfinite ? 0xFE : 0xFF;
  p.ue8m0_sign = static_cast<uint32_t>(s.ue8m0_sign);
  p.stream = n >= kStreamMin;

  // The fast kernel: FP8 target, RNE, and an overflow/NaN behaviour it expresses as min(code, clamp) | sign
  // (+ a NaN blend). Anything else takes the general kernel.
  p.fast = false;
  if (p.ue8m0 || s.rounding != Rounding::rne || s.overflow == Overflow::saturate || p.nan_payload) return p;
  if (p.tm != 2 && p.tm != 3) return p;
  const int src_bias = from == Format::f16 ? 15 : 127;
  const int emin_t = 1 - fi.bias;                    // target's smallest normal exponent
  const int emin_src = src_bias + emin_t;            // ... as a source exponent field
  if (emin_src < 7) return p;                        // (kLift) f16 -> e5m2, e5m2fnuz
  if (1 - src_bias > emin_t - fi.man_bits - 1) return p;  // source subnormals must all round to zero
  // the code an overflowing magnitude gets under RNE (never "toward zero"), for sign s
  uint32_t clampv;
  if (s.overflow == Overflow::satfinite) {
    clampv = fi.max_code;
  } else if (p.ieee) {
    clampv = p.inf_or_nan;  // Inf
  } else if (p.fnuz) {
    clampv = 0x80;          // 0x80 | s == 0x80
  } else if (s.nan_code == 0x7F) {
    clampv = 0x7F;          // e4m3fn: nan_code | s
  } else {
    return p;               // e4m3fn nonsat with nan_code 0xFF: general kernel
  }
  // what a NaN input must give for sign s; what min(code, clamp) | s gives
  const uint32_t want_pos = p.nan_in_pos, want_neg = p.nan_in_neg;
  const uint32_t got_pos = clampv, got_neg = clampv | 0x80u;
  p.fast_nan = !(want_pos == got_pos && want_neg == got_neg);
  p.fast_nan_v = want_pos;
  p.fast_nan_smask = want_neg & ~want_pos & 0x80u;
  if ((p.fast_nan_v | p.fast_nan_smask) != want_neg) return p;  // not expressible (cannot happen)
  p.fast_emin = static_cast<uint32_t>(emin_src);
  p.fast_clamp = clampv;
  p.fast = true;
  return p;
}

// Splits [0, n) into per-thread chunks (multiples of 64 elements) and runs fn(begin, count) on each.
template <typename Fn>
void parallel_chunks(size_t n, Fn fn) {
  constexpr size_t kMinPerThread = size_t{1} << 16;
  if (n < 2 * kMinPerThread) {
    fn(size_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    const size_t nt = static_cast<size_t>(omp_get_num_threads());
    size_t per = (n + nt - 1) / nt;
    per = (per + 63) / 64 * 64;
    const size_t b = t * per;
    if (b < n) fn(b, (n - b < per) ? n - b : per);
  }
}

}  // namespace

void encode_f32(const float* src, uint8_t* dst, size_t n, const ConversionSpec& spec, uint64_t first_index) {
  const auto p = make_params(spec, Format::f32, n);
  parallel_chunks(n, [&](size_t b, size_t c) { HWY_DYNAMIC_DISPATCH(EncodeF32)(p, src + b, dst + b, c, first_index + b); });
}

void encode_bits16(Format from, const uint16_t* src, uint8_t* dst, size_t n, const ConversionSpec& spec,
                   uint64_t first_index) {
  const auto p = make_params(spec, from, n);
  parallel_chunks(n, [&](size_t b, size_t c) {
    if (from == Format::bf16) {
      HWY_DYNAMIC_DISPATCH(EncodeBf16)(p, src + b, dst + b, c, first_index + b);
    } else {
      HWY_DYNAMIC_DISPATCH(EncodeF16)(p, src + b, dst + b, c, first_index + b);
    }
  });
}

void encode_f64(const double* src, uint8_t* dst, size_t n, const ConversionSpec& spec, uint64_t first_index) {
  // f64 sources: the reference's integer routine, in parallel (not vectorised).
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static)
  for (long long i = 0; i < nn; ++i) dst[i] = ref::encode_f64(src[i], spec, first_index + static_cast<uint64_t>(i));
}

namespace {
// Decoding is a 256-entry table per (format, decode spec), filled from the exact decoder.
template <typename T, typename Fill>
void decode_table(const uint8_t* src, T* dst, size_t n, Fill fill) {
  T table[256];
  for (int c = 0; c < 256; ++c) table[c] = fill(static_cast<uint8_t>(c));
  const long long nn = static_cast<long long>(n);
#pragma omp parallel for schedule(static) if (n > (size_t{1} << 18))
  for (long long i = 0; i < nn; ++i) dst[i] = table[src[i]];
}
}  // namespace

void decode_f32(Format from, const uint8_t* src, float* dst, size_t n, const DecodeSpec& d) {
  decode_table(src, dst, n, [&](uint8_t c) { return ref::decode_f32(from, c, d); });
}

void decode_f64(Format from, const uint8_t* src, double* dst, size_t n, const DecodeSpec& d) {
  decode_table(src, dst, n, [&](uint8_t c) { return ref::decode_f64(from, c, d); });
}

uint64_t encode_f32_range(uint64_t begin, uint64_t end, const ConversionSpec& spec, uint8_t* out) {
  const auto p = make_params(spec, Format::f32, 0);
  uint64_t total = 0;
  parallel_chunks(static_cast<size_t>(end - begin), [&](size_t b, size_t c) {
    const uint64_t sum = HWY_DYNAMIC_DISPATCH(EncodeRange)(p, begin + b, begin + b + c, out ? out + b : nullptr);
#pragma omp atomic
    total += sum;
  });
  return total & 0xFFFFFFFFu;
}

const char* simd_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
bool simd_target_is_avx512() { return HWY_DYNAMIC_DISPATCH(TargetIsX86Avx3)(); }

std::vector<std::string> for_each_simd_target(const std::function<void()>& fn) {
  std::vector<std::string> names;
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    names.push_back(hwy::TargetName(t));
    fn();
    // AVX-512 targets once more without the AVX-512 BF16 kernels (rmsnorm_quant_avx512.h), so that the Highway
    // kernels they replace on this CPU stay under test too
    if (avx512bf16_kernels() && simd_target_is_avx512()) {
      set_avx512bf16_kernels_for_test(false);
      names.push_back(std::string(hwy::TargetName(t)) + " without the AVX-512 BF16 kernels");
      fn();
      set_avx512bf16_kernels_for_test(true);
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return names;
}

}  // namespace cpu
}  // namespace fp8ref
#endif  // HWY_ONCE

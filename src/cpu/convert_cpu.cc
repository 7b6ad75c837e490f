// fp8ref CPU backend — bulk FP8 / UE8M0 encode and decode.
//
// Highway dynamic dispatch (the best SIMD target of this machine is picked at run time) and OpenMP over
// contiguous chunks. Bit-identical to reference/convert_ref.cc for every input: the same integer algorithm,
// vectorised. tests/exhaustive_convert.cc checks all 2^32 f32 and all 2^16 f16/bf16 inputs per convention.
//
// Algorithm (u32 lanes holding f32 bit patterns; f16/bf16 are first widened exactly, in integer code):
//   e = exponent field, sig = fraction | hidden bit, X = max(e, emin_b) with emin_b the target's smallest
//   normal exponent in f32 bias; discarded bits s = (X - tm) - (max(e,1) - 23); n = round(sig >> s);
//   code = n + ((X - emin_b) << tm)  (carries into the next binade and from subnormals to normals fall out);
//   then overflow (code > max_code or Inf), NaN and sign, as the contract in fp8ref/convert.h says.
// f64 sources use the reference's integer routine in an OpenMP loop (rare in practice, not vectorised).

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/convert_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "fp8ref/convert.h"

#ifndef FP8REF_CONVERT_PARAMS_ONCE
#define FP8REF_CONVERT_PARAMS_ONCE
namespace fp8ref::cpu_detail {
// Everything the kernel needs, precomputed once per call from a ConversionSpec.
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

// Rounds up? given the kept LSB (n), the discarded bits rem, one half of the discarded range, the top 32 bits
// of the discarded fraction, the sign mask and the random bits.
HWY_INLINE hn::Mask<DU> RoundUp(const EncodeParams& p, VU n, VU rem, VU half, VU frac32, hn::Mask<DU> neg, VU rbits) {
  const DU d;
  const VU one = hn::Set(d, 1);
  switch (static_cast<Rounding>(p.rounding)) {
    case Rounding::rne: {
      const auto odd = hn::Eq(hn::And(n, one), one);
      return hn::Or(hn::Gt(rem, half), hn::And(hn::Eq(rem, half), odd));
    }
    case Rounding::rna: return hn::Not(hn::Lt(rem, half));
    case Rounding::rz: return hn::Eq(one, hn::Zero(d));
    case Rounding::ru: return hn::AndNot(neg, hn::Ne(rem, hn::Zero(d)));
    case Rounding::rd: return hn::And(neg, hn::Ne(rem, hn::Zero(d)));
    case Rounding::stochastic: return hn::Gt(rbits, hn::Not(frac32));  // frac32 + r >= 2^32
  }
  return hn::Eq(one, hn::Zero(d));
}

// f32 bit patterns -> FP8 codes (one per u32 lane).
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
  // top 32 bits of the discarded fraction: s <= 32 ? rem << (32 - s) : sig >> min(s - 32, 31)
  const auto small_s = hn::Not(hn::Gt(s, hn::Set(d, 32)));
  const VU left = hn::Sub(hn::Set(d, 32), hn::Min(s, hn::Set(d, 32)));
  const VU frac32_small = hn::IfThenElse(hn::Eq(left, hn::Set(d, 32)), zero, hn::operator<<(rem, hn::Min(left, hn::Set(d, 31))));
  const VU right = hn::Min(hn::Sub(hn::Max(s, hn::Set(d, 32)), hn::Set(d, 32)), hn::Set(d, 31));
  const VU frac32 = hn::IfThenElse(small_s, frac32_small, hn::operator>>(sig, right));
  const auto up = RoundUp(p, kept, rem, half, frac32, neg, rbits);
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
      const Rounding r = static_cast<Rounding>(p.rounding);
      auto toward_zero = hn::Eq(zero, zero);
      if (r == Rounding::ru) toward_zero = neg;
      else if (r == Rounding::rd) toward_zero = hn::Not(neg);
      else if (r != Rounding::rz) toward_zero = hn::Ne(zero, zero);
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
    const auto up = RoundUp(p, hn::Set(d, 1), rem, half, frac32, hn::Ne(zero, zero), rbits);
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

HWY_INLINE VU Encode(const EncodeParams& p, VU bits, VU rbits) {
  return p.ue8m0 ? EncodeUe8m0(p, bits, rbits) : EncodeFp8(p, bits, rbits);
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

HWY_INLINE void StoreCodes(VU codes, uint8_t* dst) {
  const hn::Rebind<int32_t, DU> di;
  const hn::Rebind<uint8_t, DU> d8;
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, codes)), d8, dst);
}

// Source kinds for the bulk loop: 0 = f32, 1 = bf16, 2 = f16.
template <int kSrc>
HWY_INLINE VU LoadBits(const void* src, size_t i) {
  const DU d;
  if constexpr (kSrc == 0) {
    return hn::LoadU(d, static_cast<const uint32_t*>(src) + i);
  } else {
    const hn::Rebind<uint16_t, DU> d16;
    const VU h = hn::PromoteTo(d, hn::LoadU(d16, static_cast<const uint16_t*>(src) + i));
    if constexpr (kSrc == 1) return hn::ShiftLeft<16>(h);
    return WidenF16(h);
  }
}

template <int kSrc>
void EncodeLoop(const EncodeParams& p, const void* src, uint8_t* dst, size_t n, uint64_t first_index) {
  const DU d;
  const size_t N = hn::Lanes(d);
  const bool stochastic = static_cast<Rounding>(p.rounding) == Rounding::stochastic;
  const VU no_bits = hn::Zero(d);
  size_t i = 0;
  auto rbits_at = [&](size_t at) -> VU {
    if (!stochastic) return no_bits;
    const uint64_t idx = first_index + at;
    // lanes may straddle a 2^32 boundary only at the very end of a block: fall back to exact per-lane keys
    if (static_cast<uint32_t>(idx) > 0xFFFFFFFFu - (N - 1)) {
      HWY_ALIGN uint32_t tmp[kMaxLanes];
      for (size_t l = 0; l < N; ++l) {
        const uint64_t j = idx + l;
        tmp[l] = lowbias32(static_cast<uint32_t>(j) ^ p.key ^ lowbias32(static_cast<uint32_t>(j >> 32) + 0x85EBCA6Bu));
      }
      return hn::Load(d, tmp);
    }
    const uint32_t key2 = p.key ^ lowbias32(static_cast<uint32_t>(idx >> 32) + 0x85EBCA6Bu);
    return RandomBits(static_cast<uint32_t>(idx), key2);
  };
  for (; i + N <= n; i += N) {
    StoreCodes(Encode(p, LoadBits<kSrc>(src, i), rbits_at(i)), dst + i);
  }
  if (i < n) {  // tail through a padded buffer, same kernel
    HWY_ALIGN uint32_t in[kMaxLanes] = {};
    HWY_ALIGN uint8_t out[kMaxLanes] = {};
    const size_t rest = n - i;
    for (size_t l = 0; l < rest; ++l) {
      if constexpr (kSrc == 0) {
        std::memcpy(&in[l], static_cast<const uint32_t*>(src) + i + l, 4);
      } else {
        in[l] = static_cast<const uint16_t*>(src)[i + l];
      }
    }
    VU bits = hn::Load(d, in);
    if constexpr (kSrc == 1) bits = hn::ShiftLeft<16>(bits);
    if constexpr (kSrc == 2) bits = WidenF16(bits);
    StoreCodes(Encode(p, bits, rbits_at(i)), out);
    std::memcpy(dst + i, out, rest);
  }
}

void EncodeF32(const EncodeParams& p, const float* src, uint8_t* dst, size_t n, uint64_t first_index) {
  EncodeLoop<0>(p, src, dst, n, first_index);
}
void EncodeBf16(const EncodeParams& p, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first_index) {
  EncodeLoop<1>(p, src, dst, n, first_index);
}
void EncodeF16(const EncodeParams& p, const uint16_t* src, uint8_t* dst, size_t n, uint64_t first_index) {
  EncodeLoop<2>(p, src, dst, n, first_index);
}

// Every f32 bit pattern in [begin, end) (end <= 2^32), generated in registers; codes optionally stored;
// checksum Σ code · (pattern | 1) mod 2^32 accumulated per lane.
uint64_t EncodeRange(const EncodeParams& p, uint64_t begin, uint64_t end, uint8_t* out) {
  const DU d;
  const size_t N = hn::Lanes(d);
  const bool stochastic = static_cast<Rounding>(p.rounding) == Rounding::stochastic;
  VU acc = hn::Zero(d);
  uint64_t i = begin;
  const VU iota = hn::Iota(d, 0);
  const uint32_t key2 = p.key ^ lowbias32(0u + 0x85EBCA6Bu);
  for (; i + N <= end; i += N) {
    const VU bits = hn::Add(iota, hn::Set(d, static_cast<uint32_t>(i)));
    const VU rb = stochastic ? Lowbias32(hn::Xor(bits, hn::Set(d, key2))) : hn::Zero(d);
    const VU codes = Encode(p, bits, rb);
    acc = hn::Add(acc, hn::Mul(codes, hn::Or(bits, hn::Set(d, 1))));
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
    const VU bits = hn::Load(d, in);
    const VU rb = stochastic ? Lowbias32(hn::Xor(bits, hn::Set(d, key2))) : hn::Zero(d);
    StoreCodes(Encode(p, bits, rb), o);
    sum += o[0] * (static_cast<uint32_t>(i) | 1u);
    if (out) out[i - begin] = o[0];
  }
  return sum;
}

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace fp8ref::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

namespace fp8ref {
HWY_EXPORT(EncodeF32);
HWY_EXPORT(EncodeBf16);
HWY_EXPORT(EncodeF16);
HWY_EXPORT(EncodeRange);
HWY_EXPORT(TargetName);

namespace cpu {
namespace {

cpu_detail::EncodeParams make_params(const ConversionSpec& s) {
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
  const auto p = make_params(spec);
  parallel_chunks(n, [&](size_t b, size_t c) { HWY_DYNAMIC_DISPATCH(EncodeF32)(p, src + b, dst + b, c, first_index + b); });
}

void encode_bits16(Format from, const uint16_t* src, uint8_t* dst, size_t n, const ConversionSpec& spec,
                   uint64_t first_index) {
  const auto p = make_params(spec);
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
  const auto p = make_params(spec);
  uint64_t total = 0;
  parallel_chunks(static_cast<size_t>(end - begin), [&](size_t b, size_t c) {
    const uint64_t sum = HWY_DYNAMIC_DISPATCH(EncodeRange)(p, begin + b, begin + b + c, out ? out + b : nullptr);
#pragma omp atomic
    total += sum;
  });
  return total & 0xFFFFFFFFu;
}

const char* simd_target() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }

}  // namespace cpu
}  // namespace fp8ref
#endif  // HWY_ONCE

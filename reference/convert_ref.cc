// fp8ref reference — scalar FP8 / UE8M0 encode and decode, written from the contract in fp8ref/convert.h.
//
// Not designed to be fast. Integer arithmetic only: a source value is decomposed into sign · sig · 2^e2
// (sig an integer), rounded to the target's quantum by explicit integer code, and packed. No floating-point
// operation decides a rounding; no global rounding state is read or set. Built with -ffp-contract=off.
#include <cmath>
#include <cstring>

#include "fp8ref/convert.h"

namespace fp8ref::ref {
namespace {

// A finite or special source value: value = (-1)^sign · sig · 2^e2.
struct Decomposed {
  bool sign = false;
  bool nan = false;
  bool inf = false;
  uint64_t sig = 0;  // 0 for zero
  int e2 = 0;
  uint64_t frac = 0;  // raw fraction field (NaN payloads)
  int man_bits = 0;   // fraction bits of the source
};

struct Layout {
  int exp_bits, man_bits;
};

Layout source_layout(Format f) {
  switch (f) {
    case Format::bf16: return {8, 7};
    case Format::f16: return {5, 10};
    case Format::f32: return {8, 23};
    case Format::f64: return {11, 52};
    default: return {0, 0};  // not a source container
  }
}

Decomposed decompose(const Layout& l, uint64_t bits) {
  Decomposed d;
  const int total = 1 + l.exp_bits + l.man_bits;
  const uint64_t exp_max = (uint64_t{1} << l.exp_bits) - 1;
  const int bias = static_cast<int>(exp_max >> 1);
  d.sign = (bits >> (total - 1)) & 1;
  const uint64_t e = (bits >> l.man_bits) & exp_max;
  d.frac = bits & ((uint64_t{1} << l.man_bits) - 1);
  d.man_bits = l.man_bits;
  if (e == exp_max) {
    d.nan = d.frac != 0;
    d.inf = d.frac == 0;
    return d;
  }
  if (e == 0) {  // zero or subnormal: frac · 2^(1 - bias - man)
    d.sig = d.frac;
    d.e2 = 1 - bias - l.man_bits;
  } else {
    d.sig = d.frac | (uint64_t{1} << l.man_bits);
    d.e2 = static_cast<int>(e) - bias - l.man_bits;
  }
  return d;
}

int bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

// Rounds the magnitude sig · 2^e2 to an integer multiple n of 2^q with the given rounding; returns n.
// `negative` is the sign of the value (for ru/rd); `rbits` the 32 random bits of stochastic rounding.
uint64_t round_to_quantum(uint64_t sig, int e2, int q, Rounding r, bool negative, uint32_t rbits) {
  if (e2 >= q) return sig << (e2 - q);  // exact; callers guarantee the result is small
  const int s = q - e2;                 // number of discarded bits, >= 1
  uint64_t n, rem;
  if (s >= 64) {
    n = 0;
    rem = sig;
  } else {
    n = sig >> s;
    rem = sig & ((uint64_t{1} << s) - 1);
  }
  // Compare the discarded part with one half (2^(s-1)); sig < 2^63 so for s >= 64 it is below half.
  int cmp;
  if (s >= 64) {
    cmp = -1;
  } else {
    const uint64_t half = uint64_t{1} << (s - 1);
    cmp = rem > half ? 1 : (rem == half ? 0 : -1);
  }
  // Top 32 bits of the discarded fraction rem / 2^s.
  uint64_t frac32;
  if (s <= 32) {
    frac32 = rem << (32 - s);
  } else if (s - 32 < 64) {
    frac32 = rem >> (s - 32);
  } else {
    frac32 = 0;
  }
  bool up = false;
  switch (r) {
    case Rounding::rne: up = cmp > 0 || (cmp == 0 && (n & 1)); break;
    case Rounding::rna: up = cmp >= 0; break;
    case Rounding::rz: up = false; break;
    case Rounding::ru: up = rem != 0 && !negative; break;
    case Rounding::rd: up = rem != 0 && negative; break;
    case Rounding::stochastic: up = frac32 + rbits >= (uint64_t{1} << 32); break;
  }
  return n + (up ? 1 : 0);
}

// Whether rounding moved (or would move) the magnitude toward zero — IEEE's rule for overflow to ±max.
bool rounds_toward_zero(Rounding r, bool negative) {
  return r == Rounding::rz || (r == Rounding::ru && negative) || (r == Rounding::rd && !negative);
}

// A generic sign-magnitude target (the FP8 formats, and f32 for the f64 -> f32 step of via_f32).
struct Target {
  int exp_bits, man_bits, bias;
  SpecialStyle special;
  uint64_t max_code;  // largest finite magnitude code
};

Target target_of(Format f) {
  const FormatInfo& fi = format_info(f);
  return {fi.exp_bits, fi.man_bits, fi.bias, fi.special, fi.max_code};
}

uint64_t sign_bit(const Target& t) { return uint64_t{1} << (t.exp_bits + t.man_bits); }
uint64_t exp_all_ones(const Target& t) { return ((uint64_t{1} << t.exp_bits) - 1) << t.man_bits; }

// The NaN code for a NaN input, per spec.nan (fnuz: the single NaN 0x80).
uint64_t nan_code(const Target& t, const ConversionSpec& spec, const Decomposed& d) {
  if (t.special == SpecialStyle::fnuz) return 0x80;
  const uint64_t s = d.sign ? sign_bit(t) : 0;
  switch (spec.nan) {
    case NanOut::canonical: return spec.nan_code;
    case NanOut::keep_sign: return spec.nan_code | s;
    case NanOut::payload:
      if (t.special == SpecialStyle::ieee) {
        // quiet bit forced, then the top man_bits of the source fraction OR-ed in (CUDA's 0x7E | top2).
        const uint64_t top = d.frac >> (d.man_bits - t.man_bits);
        return s | exp_all_ones(t) | (uint64_t{1} << (t.man_bits - 1)) | top;
      }
      return spec.nan_code | s;
  }
  return spec.nan_code;
}

// Code for an overflowing magnitude (finite after rounding, or an infinite input). A NaN produced by overflow
// always carries the input's sign (torch, ml_dtypes, CUDA's software path and OCP all do so), whatever `nan`
// says about NaN *inputs*.
uint64_t overflow_code(const Target& t, const ConversionSpec& spec, bool negative, bool input_inf) {
  const uint64_t s = negative ? sign_bit(t) : 0;
  const uint64_t max = t.max_code | s;
  const uint64_t inf_or_nan = t.special == SpecialStyle::ieee   ? (exp_all_ones(t) | s)
                              : t.special == SpecialStyle::fnuz ? 0x80
                                                                : (spec.nan_code | s);
  switch (spec.overflow) {
    case Overflow::satfinite: return max;
    case Overflow::saturate: return input_inf ? inf_or_nan : max;
    case Overflow::nonsat:
      if (!input_inf && rounds_toward_zero(spec.rounding, negative)) return max;
      return inf_or_nan;
  }
  return inf_or_nan;
}

uint64_t encode_generic(const Target& t, const Decomposed& d, const ConversionSpec& spec, uint32_t rbits) {
  if (d.nan) return nan_code(t, spec, d);
  const uint64_t s = d.sign ? sign_bit(t) : 0;
  const uint64_t zero = t.special == SpecialStyle::fnuz ? 0 : s;  // fnuz has no -0
  if (d.inf) return overflow_code(t, spec, d.sign, true);
  if (d.sig == 0) return zero;
  const int u = bit_length(d.sig) - 1 + d.e2;  // floor(log2 |x|)
  const int emin = 1 - t.bias;                 // exponent of the smallest normal
  int q = (u > emin ? u : emin) - t.man_bits;  // quantum exponent at |x|
  uint64_t n = round_to_quantum(d.sig, d.e2, q, spec.rounding, d.sign, rbits);
  if (n == 0) return zero;
  if (n >> (t.man_bits + 1)) {  // rounding carried into the next binade: n == 2^(man+1)
    n >>= 1;
    q += 1;
  }
  const uint64_t hidden = uint64_t{1} << t.man_bits;
  uint64_t code;
  if (n < hidden) {
    code = n;  // subnormal (q == emin - man)
  } else {
    const int64_t bexp = static_cast<int64_t>(q) + t.man_bits + t.bias;
    if (bexp >= (int64_t{1} << t.exp_bits)) return overflow_code(t, spec, d.sign, false);
    code = (static_cast<uint64_t>(bexp) << t.man_bits) | (n - hidden);
  }
  if (code > t.max_code) return overflow_code(t, spec, d.sign, false);
  return code | s;
}

// f64 -> f32 rounded to nearest even (the double rounding's first step); f16 -> f32 widening is exact.
uint64_t f64_bits_to_f32_bits(uint64_t bits) { return narrow(Format::f64, bits, Format::f32); }

uint64_t to_f32_bits(Format from, uint64_t bits) {
  switch (from) {
    case Format::f32: return bits & 0xFFFFFFFFu;
    case Format::bf16: return (bits & 0xFFFF) << 16;
    default: return narrow(from, bits, Format::f32);
  }
}

uint8_t clamp_ue8m0(int code, const ConversionSpec& spec) {
  if (spec.ue8m0_clamp) {
    if (code < spec.exp_lo) code = spec.exp_lo;
    if (code > spec.exp_hi) code = spec.exp_hi;
  }
  return static_cast<uint8_t>(code);
}

uint8_t encode_ue8m0(Format from, uint64_t bits, const ConversionSpec& spec, uint32_t rbits) {
  const uint8_t overflow = spec.overflow == Overflow::satfinite ? 0xFE : 0xFF;
  const Decomposed d = decompose(source_layout(from), bits);
  if (d.nan) return clamp_ue8m0(0xFF, spec);
  const bool nonpositive = d.sign || (!d.inf && d.sig == 0);
  if (nonpositive && spec.ue8m0_sign == Ue8m0Sign::nonpositive_to_nan) return clamp_ue8m0(0xFF, spec);
  if (spec.ue8m0_method != Ue8m0Method::value) {
    // Bit tricks on the f32 pattern, sign ignored: DeepGEMM's ceil, torch's round.
    const uint64_t b = to_f32_bits(from, bits);
    const int e = static_cast<int>((b >> 23) & 0xFF);
    const uint64_t m = b & 0x7FFFFF;
    const bool up = spec.ue8m0_method == Ue8m0Method::bit_ceil ? m != 0 : (m > 0x400000 || (m == 0x400000 && e != 0));
    int code = e + (up ? 1 : 0);
    if (code > 0xFE && !spec.ue8m0_clamp) code = overflow;  // +-Inf, or rounded past 2^127
    return clamp_ue8m0(code, spec);  // with the clamp, the integer code is clamped as is (DeepGEMM)
  }
  if (d.inf) return clamp_ue8m0(overflow, spec);
  if (d.sig == 0) return clamp_ue8m0(0x00, spec);  // magnitude of a zero: clipped to 2^-127
  const int u = bit_length(d.sig) - 1 + d.e2;
  // Round |x| to a power of two: n in {1, 2} units of 2^u (magnitude: ru = away from zero).
  const uint64_t n = round_to_quantum(d.sig, d.e2, u, spec.rounding, false, rbits);
  const int e = u + (n >= 2 ? 1 : 0);
  int code = e + 127;
  if (code < 0) code = 0;  // below 2^-127: clipped to the smallest code
  if (code > 0xFE) code = overflow;
  return clamp_ue8m0(code, spec);
}

}  // namespace

uint8_t encode(Format from, uint64_t bits, const ConversionSpec& spec, uint64_t index) {
  const uint32_t rbits = spec.rounding == Rounding::stochastic ? stochastic_bits(spec.seed, index) : 0;
  if (from == Format::f64 && spec.f64_path == F64Path::via_f32) {
    from = Format::f32;
    bits = f64_bits_to_f32_bits(bits);
  }
  if (spec.to == Format::ue8m0) return encode_ue8m0(from, bits, spec, rbits);
  const Decomposed d = decompose(source_layout(from), bits);
  return static_cast<uint8_t>(encode_generic(target_of(spec.to), d, spec, rbits));
}

float load_f32(Format from, const void* p, int64_t i) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  if (from == Format::f32) {
    uint32_t w;
    std::memcpy(&w, b + 4 * i, 4);
    return f32_from_bits(w);
  }
  uint16_t h;
  std::memcpy(&h, b + 2 * i, 2);
  return f32_from_bits(static_cast<uint32_t>(narrow(from, h, Format::f32)));
}

uint64_t narrow(Format from, uint64_t bits, Format to) {
  const Layout src = source_layout(from), dst = source_layout(to);
  const Decomposed d = decompose(src, bits);
  const FormatInfo& fi = format_info(to);
  const Target t{fi.exp_bits, fi.man_bits, fi.bias, SpecialStyle::ieee, to == Format::f64 ? 0x7FEFFFFFFFFFFFFFull : fi.max_code};
  if (d.nan) {
    const uint64_t payload = dst.man_bits >= src.man_bits ? d.frac << (dst.man_bits - src.man_bits)
                                                           : d.frac >> (src.man_bits - dst.man_bits);
    return (d.sign ? sign_bit(t) : 0) | exp_all_ones(t) | (uint64_t{1} << (t.man_bits - 1)) | payload;
  }
  ConversionSpec s;  // rne, nonsat: IEEE
  return encode_generic(t, d, s, 0);
}

uint8_t encode_f32(float x, const ConversionSpec& spec, uint64_t index) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return encode(Format::f32, b, spec, index);
}

uint8_t encode_f64(double x, const ConversionSpec& spec, uint64_t index) {
  uint64_t b;
  std::memcpy(&b, &x, 8);
  return encode(Format::f64, b, spec, index);
}

double value_of(Format f, uint8_t code) {
  const FormatInfo& fi = format_info(f);
  if (fi.special == SpecialStyle::e8m0) return code == 0xFF ? std::nan("") : std::ldexp(1.0, code - 127);
  const CodeClass c = classify_code(f, code);
  const bool neg = (code & 0x80) != 0;
  const int mag = code & 0x7F;
  const int man = mag & ((1 << fi.man_bits) - 1);
  const int exp_field = mag >> fi.man_bits;
  double v = 0.0;
  switch (c) {
    case CodeClass::nan: return std::nan("");
    case CodeClass::inf: return neg ? -HUGE_VAL : HUGE_VAL;
    case CodeClass::zero: v = 0.0; break;
    case CodeClass::subnormal: v = std::ldexp(static_cast<double>(man), 1 - fi.bias - fi.man_bits); break;
    case CodeClass::normal:
      v = std::ldexp(static_cast<double>(man + (1 << fi.man_bits)), exp_field - fi.bias - fi.man_bits);
      break;
  }
  return neg ? -v : v;
}

uint32_t decode_f32_bits(Format from, uint8_t code, const DecodeSpec& ds) {
  if (classify_code(from, code) == CodeClass::nan) {
    const FormatInfo& fi = format_info(from);
    const bool signed_nan = fi.special != SpecialStyle::e8m0;  // fnuz's 0x80 has the sign bit set
    const uint32_t sign = ds.nan_keep_sign && signed_nan && (code & 0x80) ? 0x80000000u : 0u;
    if (ds.nan_payload && fi.special != SpecialStyle::fnuz && signed_nan) {
      const uint32_t frac = code & ((1u << fi.man_bits) - 1);
      return sign | 0x7FC00000u | (frac << (23 - fi.man_bits));
    }
    return ds.nan_f32 | sign;
  }
  const float v = static_cast<float>(value_of(from, code));  // exact: every FP8/UE8M0 value is an f32
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

uint64_t decode_f64_bits(Format from, uint8_t code, const DecodeSpec& ds) {
  if (classify_code(from, code) == CodeClass::nan) {
    const uint64_t f = decode_f32_bits(from, code, ds);
    return ((f & 0x80000000u) << 32) | (uint64_t{0x7FF} << 52) | ((f & 0x7FFFFF) << 29);
  }
  const double v = value_of(from, code);
  uint64_t b;
  std::memcpy(&b, &v, 8);
  return b;
}

float decode_f32(Format from, uint8_t code, const DecodeSpec& d) {
  const uint32_t b = decode_f32_bits(from, code, d);
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

double decode_f64(Format from, uint8_t code, const DecodeSpec& d) {
  const uint64_t b = decode_f64_bits(from, code, d);
  double f;
  std::memcpy(&f, &b, 8);
  return f;
}

}  // namespace fp8ref::ref

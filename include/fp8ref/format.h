// fp8ref — number formats: the FP8 encodings, the UE8M0 scale format and the wider containers.
//
// Every format is described by one constexpr FormatInfo (ml_dtypes' traits idea, as data):
//
//   format    bits exp man bias  max finite           Inf        NaN                      -0
//   e4m3fn      8   4   3    7   448   (0x7E)          none       0x7F, 0xFF               0x80
//   e5m2        8   5   2   15   57344 (0x7B)          0x7C/0xFC  0x7D-0x7F, 0xFD-0xFF     0x80
//   e4m3fnuz    8   4   3    8   240   (0x7F)          none       0x80 only                none
//   e5m2fnuz    8   5   2   16   57344 (0x7F)          none       0x80 only                none
//   ue8m0       8   8   0  127   2^127 (0xFE)          none       0xFF                     no sign, no zero
//   bf16       16   8   7  127   IEEE-like
//   f16        16   5  10   15   IEEE binary16
//   f32        32   8  23  127   IEEE binary32
//   f64        64  11  52 1023   IEEE binary64
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace fp8ref {

// An f32 and its bit pattern (std::bit_cast in C++20): the one definition every file uses.
inline float f32_from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t bits_of_f32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
// An f64 rounded to f32 *to odd*: the neighbour toward zero with the last bit set when inexact (finite values past
// the f32 range -> ±FLT_MAX, odd); NaN and ±Inf as they are. A later RNE of the result to a format with at most 22
// significand bits whose quantum stays above 2^-149 (bf16, f16, every FP8) equals one RNE of the f64 (Boldo &
// Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
inline float f32_round_to_odd(double v) {
  const float f = static_cast<float>(v);  // RNE
  if (!std::isfinite(v) || static_cast<double>(f) == v) return f;  // NaN, ±Inf, exact
  uint32_t b = bits_of_f32(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --b;  // rounded away from zero: one step back (Inf -> FLT_MAX)
  return f32_from_bits(b | 1u);
}


enum class Format : uint8_t { e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, ue8m0, bf16, f16, f32, f64 };

// How the top exponent code and the 0x80 code are used.
enum class SpecialStyle : uint8_t {
  ieee,  // top exponent = Inf (mantissa 0) / NaN (else); 0x80 = -0           (e5m2, f16, bf16, f32, f64)
  fn,    // "finite": no Inf; only all-ones exponent+mantissa is NaN            (e4m3fn)
  fnuz,  // no Inf, no -0: the negative-zero code 0x80 is the single NaN        (e4m3fnuz, e5m2fnuz)
  e8m0,  // unsigned exponent only: 0xFF = NaN, no zero                        (ue8m0)
};

struct FormatInfo {
  Format format;
  const char* name;
  int bits;          // storage bits
  int exp_bits;
  int man_bits;      // explicit fraction bits
  int bias;
  bool is_signed;
  SpecialStyle special;
  uint32_t max_code;  // code of the largest positive finite value
  double max_value;   // its value
  const char* safetensors_tag;
};

constexpr FormatInfo kFormats[] = {
    {Format::e4m3fn, "e4m3fn", 8, 4, 3, 7, true, SpecialStyle::fn, 0x7E, 448.0, "F8_E4M3"},  // 1.75·2^8
    {Format::e5m2, "e5m2", 8, 5, 2, 15, true, SpecialStyle::ieee, 0x7B, 57344.0, "F8_E5M2"},  // 1.75·2^15
    {Format::e4m3fnuz, "e4m3fnuz", 8, 4, 3, 8, true, SpecialStyle::fnuz, 0x7F, 240.0, "F8_E4M3FNUZ"},  // 1.875·2^7
    {Format::e5m2fnuz, "e5m2fnuz", 8, 5, 2, 16, true, SpecialStyle::fnuz, 0x7F, 57344.0, "F8_E5M2FNUZ"},
    {Format::ue8m0, "ue8m0", 8, 8, 0, 127, false, SpecialStyle::e8m0, 0xFE, 1.7014118346046923e38, "F8_E8M0"},
    {Format::bf16, "bf16", 16, 8, 7, 127, true, SpecialStyle::ieee, 0x7F7F, 3.3895313892515355e38, "BF16"},
    {Format::f16, "f16", 16, 5, 10, 15, true, SpecialStyle::ieee, 0x7BFF, 65504.0, "F16"},
    {Format::f32, "f32", 32, 8, 23, 127, true, SpecialStyle::ieee, 0x7F7FFFFFu, 3.4028234663852886e38, "F32"},
    {Format::f64, "f64", 64, 11, 52, 1023, true, SpecialStyle::ieee, 0xFFFFFFFFu /*unused*/, 1.7976931348623157e308,
     "F64"},
};

constexpr const FormatInfo& format_info(Format f) { return kFormats[static_cast<int>(f)]; }
constexpr const char* format_name(Format f) { return format_info(f).name; }
constexpr bool is_fp8(Format f) { return format_info(f).bits == 8; }
constexpr bool is_container(Format f) { return format_info(f).bits > 8; }

// All formats, in declaration order.
std::vector<Format> all_formats();
// The four signed FP8 element formats (not ue8m0).
std::vector<Format> fp8_element_formats();
// Parses a format name; also accepts the aliases float8_e4m3fn, bfloat16, float32, ... Returns false if unknown.
bool parse_format(std::string_view name, Format* out);

// Classification of one 8-bit code of an FP8 format.
enum class CodeClass : uint8_t { zero, subnormal, normal, inf, nan };
CodeClass classify_code(Format f, uint8_t code);

}  // namespace fp8ref

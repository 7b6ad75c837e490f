// fp8ref — format table helpers.
#include "fp8ref/format.h"

#include <cstring>

namespace fp8ref {

std::vector<Format> all_formats() {
  std::vector<Format> v;
  for (const FormatInfo& f : kFormats) v.push_back(f.format);
  return v;
}

std::vector<Format> fp8_element_formats() { return {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}; }

bool parse_format(std::string_view name, Format* out) {
  struct Alias {
    const char* name;
    Format f;
  };
  static const Alias aliases[] = {
      {"float8_e4m3fn", Format::e4m3fn},   {"f8e4m3fn", Format::e4m3fn},       {"e4m3", Format::e4m3fn},
      {"float8_e5m2", Format::e5m2},       {"f8e5m2", Format::e5m2},           {"float8_e4m3fnuz", Format::e4m3fnuz},
      {"float8_e5m2fnuz", Format::e5m2fnuz}, {"float8_e8m0fnu", Format::ue8m0}, {"e8m0", Format::ue8m0},
      {"e8m0fnu", Format::ue8m0},          {"bfloat16", Format::bf16},         {"float16", Format::f16},
      {"half", Format::f16},               {"float32", Format::f32},           {"float", Format::f32},
      {"float64", Format::f64},            {"double", Format::f64},
  };
  for (const FormatInfo& f : kFormats) {
    if (name == f.name) {
      *out = f.format;
      return true;
    }
  }
  for (const Alias& a : aliases) {
    if (name == a.name) {
      *out = a.f;
      return true;
    }
  }
  return false;
}

CodeClass classify_code(Format f, uint8_t code) {
  const FormatInfo& fi = format_info(f);
  if (fi.special == SpecialStyle::e8m0) return code == 0xFF ? CodeClass::nan : CodeClass::normal;
  const uint8_t mag = code & 0x7F;
  const uint8_t exp_field = static_cast<uint8_t>(mag >> fi.man_bits);
  const uint8_t man = static_cast<uint8_t>(mag & ((1u << fi.man_bits) - 1));
  const uint8_t exp_max = static_cast<uint8_t>((1u << fi.exp_bits) - 1);
  switch (fi.special) {
    case SpecialStyle::fnuz:
      if (code == 0x80) return CodeClass::nan;
      break;
    case SpecialStyle::fn:
      if (mag == 0x7F) return CodeClass::nan;
      break;
    case SpecialStyle::ieee:
      if (exp_field == exp_max) return man == 0 ? CodeClass::inf : CodeClass::nan;
      break;
    case SpecialStyle::e8m0:
      break;
  }
  if (mag == 0) return CodeClass::zero;
  return exp_field == 0 ? CodeClass::subnormal : CodeClass::normal;
}

}  // namespace fp8ref

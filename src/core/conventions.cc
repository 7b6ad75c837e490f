// fp8ref — named conversion conventions: presets of ConversionSpec / DecodeSpec that reproduce real stacks.
// Each preset cites what it reproduces; tests/test_convert_h200.cc checks them against captures from an H200 and
// tests/python/test_ml_dtypes.py against ml_dtypes. Facts: ../shared/NUMERICS.md §2–3.
#include <cstdio>
#include <string>

#include "fp8ref/convert.h"

namespace fp8ref {

namespace {

template <typename E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<Rounding> kRoundings[] = {{Rounding::rne, "rne"}, {Rounding::rz, "rz"},   {Rounding::ru, "ru"},
                                          {Rounding::rd, "rd"},   {Rounding::rna, "rna"}, {Rounding::stochastic, "stochastic"}};
constexpr Named<Overflow> kOverflows[] = {
    {Overflow::satfinite, "satfinite"}, {Overflow::saturate, "saturate"}, {Overflow::nonsat, "nonsat"}};
constexpr Named<NanOut> kNanOuts[] = {
    {NanOut::canonical, "canonical"}, {NanOut::keep_sign, "keep-sign"}, {NanOut::payload, "payload"}};
constexpr Named<F64Path> kF64Paths[] = {{F64Path::direct, "direct"}, {F64Path::via_f32, "via-f32"}};
constexpr Named<Ue8m0Sign> kUe8m0Signs[] = {{Ue8m0Sign::magnitude, "magnitude"},
                                            {Ue8m0Sign::nonpositive_to_nan, "nonpositive-to-nan"}};
constexpr Named<Ue8m0Method> kUe8m0Methods[] = {
    {Ue8m0Method::value, "value"}, {Ue8m0Method::bit_ceil, "bit-ceil"}, {Ue8m0Method::bit_round, "bit-round"}};

template <typename E, size_t N>
const char* name_of(const Named<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return "?";
}

template <typename E, size_t N>
bool parse_in(const Named<E> (&table)[N], std::string_view s, E* out) {
  for (const auto& e : table) {
    if (s == e.name) {
      *out = e.value;
      return true;
    }
  }
  return false;
}

bool is_e4m3fn_or_e5m2(Format f) { return f == Format::e4m3fn || f == Format::e5m2; }
bool is_fnuz(Format f) { return f == Format::e4m3fnuz || f == Format::e5m2fnuz; }

// The positive NaN code a stack writes for a NaN input (fnuz: 0x80; ue8m0: 0xFF).
uint8_t default_nan_code(Format to) {
  if (is_fnuz(to)) return 0x80;
  if (to == Format::ue8m0) return 0xFF;
  return 0x7F;
}

ConversionSpec base(Format to, Rounding r, Overflow o, NanOut n, F64Path p) {
  ConversionSpec s;
  s.to = to;
  s.rounding = r;
  s.overflow = o;
  s.nan = n;
  s.nan_code = default_nan_code(to);
  s.f64_path = p;
  return s;
}

const std::vector<ConventionInfo> kConventions = {
    {"torch-2.11", "PyTorch 2.11 x.to(torch.float8_*) and .to(torch.float32) on the CPU (c10 code; H200 host capture)",
     true, true},
    {"torch-2.11-cuda", "PyTorch 2.11 on CUDA: as torch-2.11 except f16 NaN inputs lose their sign and e5m2 NaNs "
                        "decode to ±0x7FFFFFFF (H200 capture)",
     true, true},
    {"cuda-satfinite", "CUDA 13 __nv_cvt_*_to_fp8(x, __NV_SATFINITE, …) / PTX cvt.rn.satfinite; ue8m0: "
                       "__nv_cvt_*_to_e8m0(x, __NV_SATFINITE, cudaRoundZero|cudaRoundPosInf)",
     true, true},
    {"cuda-nosat", "CUDA 13 __nv_cvt_*_to_fp8(x, __NV_NOSAT, …) (software path); ue8m0: __NV_NOSAT", true, true},
    {"ml_dtypes", "ml_dtypes 0.7 numpy astype (f64 arrays round once; e8m0: nearest, ties up, subnormals too)", true,
     true},
    {"ml_dtypes-0.6", "ml_dtypes 0.5/0.6 numpy astype (f64 arrays round via f32; e8m0: f32 subnormals above 2^-127 "
                      "-> 0x01)",
     true, true},
    {"ocp-sat", "OCP OFP8 v1.0 §5.2.1, saturating mode (overflow and ±Inf to ±max)", true, false},
    {"ocp-nosat", "OCP OFP8 v1.0 §5.2.1, non-saturating mode (e4m3: NaN, e5m2: ±Inf)", true, false},
    {"mx", "OCP MX v1.0 shared scale: 2^floor(log2 |x|) (round toward zero), NaN/Inf -> 0xFF", false, true},
    {"pow2-ceil", "DeepGEMM/sglang/vLLM ceil_to_ue8m0 bit trick: exp_field + (mantissa != 0), no clamp", false, true},
    {"pow2-ceil-clamp", "DeepGEMM ceil_to_ue8m0 with the exponent clamped to [1, 254]", false, true},
    {"exact", "round to nearest even once, saturate nothing: the IEEE-style exact contract (= ocp-nosat for fp8)",
     true, false},
};

}  // namespace

const char* to_string(Rounding r) { return name_of(kRoundings, r); }
const char* to_string(Overflow o) { return name_of(kOverflows, o); }
const char* to_string(NanOut n) { return name_of(kNanOuts, n); }
const char* to_string(F64Path p) { return name_of(kF64Paths, p); }
const char* to_string(Ue8m0Sign s) { return name_of(kUe8m0Signs, s); }
const char* to_string(Ue8m0Method m) { return name_of(kUe8m0Methods, m); }
bool parse_rounding(std::string_view s, Rounding* out) { return parse_in(kRoundings, s, out); }
bool parse_overflow(std::string_view s, Overflow* out) { return parse_in(kOverflows, s, out); }
bool parse_nan_out(std::string_view s, NanOut* out) { return parse_in(kNanOuts, s, out); }
bool parse_f64_path(std::string_view s, F64Path* out) { return parse_in(kF64Paths, s, out); }

bool ConversionSpec::operator==(const ConversionSpec& o) const {
  return to == o.to && rounding == o.rounding && overflow == o.overflow && nan == o.nan && nan_code == o.nan_code &&
         f64_path == o.f64_path && (rounding != Rounding::stochastic || seed == o.seed) &&
         ue8m0_sign == o.ue8m0_sign && ue8m0_method == o.ue8m0_method && ue8m0_clamp == o.ue8m0_clamp &&
         (!ue8m0_clamp || (exp_lo == o.exp_lo && exp_hi == o.exp_hi));
}

std::string ConversionSpec::describe() const {
  char buf[256];
  std::string s = std::string("to=") + format_name(to);
  if (to == Format::ue8m0 && ue8m0_method != Ue8m0Method::value) {
    s += std::string(" rounding=") + to_string(ue8m0_method);
  } else {
    s += std::string(" rounding=") + to_string(rounding);
    if (rounding == Rounding::stochastic) {
      std::snprintf(buf, sizeof buf, "(seed=%llu)", static_cast<unsigned long long>(seed));
      s += buf;
    }
  }
  s += std::string(" overflow=") + to_string(overflow);
  if (to == Format::ue8m0) {
    s += std::string(" sign=") + to_string(ue8m0_sign);
    if (ue8m0_clamp) {
      std::snprintf(buf, sizeof buf, " exp-clamp=%d:%d", exp_lo, exp_hi);
      s += buf;
    }
  } else {
    std::snprintf(buf, sizeof buf, " nan=%s(0x%02x)", to_string(nan), nan_code);
    s += buf;
  }
  s += std::string(" f64=") + to_string(f64_path);
  return s;
}

const std::vector<ConventionInfo>& conventions() { return kConventions; }

std::optional<ConversionSpec> resolve_convention(std::string_view name, Format from, Format to, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<ConversionSpec> {
    if (error) *error = why;
    return std::nullopt;
  };
  const std::string n(name);
  if (!is_fp8(to)) return fail(std::string("target format '") + format_name(to) + "' is not an FP8 format");
  if (!(from == Format::f32 || from == Format::f16 || from == Format::bf16 || from == Format::f64))
    return fail(std::string("source format '") + format_name(from) + "' must be f32, f16, bf16 or f64");
  const ConventionInfo* info = nullptr;
  for (const ConventionInfo& c : kConventions)
    if (n == c.name) info = &c;
  if (!info) return fail("unknown convention '" + n + "' (fp8ref list shows the conventions)");
  const bool ue8m0 = to == Format::ue8m0;
  if (ue8m0 && !info->for_ue8m0) return fail("convention '" + n + "' does not define conversion to ue8m0");
  if (!ue8m0 && !info->for_fp8) return fail("convention '" + n + "' applies to ue8m0 only");

  if (ue8m0) {
    ConversionSpec s = base(to, Rounding::rz, Overflow::nonsat, NanOut::canonical, F64Path::direct);
    if (n == "torch-2.11" || n == "torch-2.11-cuda") {
      // c10 Float8_e8m0fnu on the f32 bits (H200 capture, CPU and CUDA): sign ignored; exp + 1 when the mantissa
      // is > 0x400000, or == 0x400000 for normals; so 1.5 -> 2, 2^-127 -> 0x00, 2^-127 + 1 ulp -> 0x01.
      s.rounding = Rounding::rna;
      s.ue8m0_method = Ue8m0Method::bit_round;
      s.f64_path = F64Path::via_f32;
    } else if (n == "ml_dtypes-0.6") {
      // Same bit rounding as torch (ties up; f32 subnormals above 2^-127 -> 0x01; pytest against ml_dtypes 0.6),
      // but x <= 0 -> NaN.
      s.rounding = Rounding::rna;
      s.ue8m0_method = Ue8m0Method::bit_round;
      s.ue8m0_sign = Ue8m0Sign::nonpositive_to_nan;
      s.f64_path = F64Path::via_f32;
    } else if (n == "ml_dtypes") {
      // ml_dtypes 0.7: the value rounded to the nearest power of two, ties up (f32 subnormals included: 2^-127 + 1
      // ulp -> 0x00), x <= 0 -> NaN; f64 rounded once (pytest against ml_dtypes 0.7).
      s.rounding = Rounding::rna;
      s.ue8m0_sign = Ue8m0Sign::nonpositive_to_nan;
    } else if (n == "cuda-satfinite") {
      s.overflow = Overflow::satfinite;  // rounding: rz by default; --rounding ru (CUDA allows only these)
    } else if (n == "cuda-nosat") {
      // defaults: rz, nonsat, magnitude
    } else if (n == "mx") {
      // floor(log2 |x|): round toward zero on the magnitude
    } else if (n == "pow2-ceil") {
      s.ue8m0_method = Ue8m0Method::bit_ceil;
      s.rounding = Rounding::ru;
      s.f64_path = F64Path::via_f32;
    } else if (n == "pow2-ceil-clamp") {
      s.ue8m0_method = Ue8m0Method::bit_ceil;
      s.rounding = Rounding::ru;
      s.ue8m0_clamp = true;
      s.exp_lo = 1;
      s.exp_hi = 254;
      s.f64_path = F64Path::via_f32;
    }
    return s;
  }

  if ((n.rfind("cuda-", 0) == 0 || n.rfind("ocp-", 0) == 0 || n == "exact") && !is_e4m3fn_or_e5m2(to))
    return fail("convention '" + n + "' defines e4m3fn and e5m2 only, not " + format_name(to));
  if (n == "torch-2.11" || n == "torch-2.11-cuda") {
    // c10 fp8e4m3fn_from_fp32_value & co: RNE, overflow -> NaN (e4m3fn) / Inf (e5m2), NaN keeps its sign;
    // other dtypes (f64) go through the float constructor: double rounding. On CUDA, f16 -> e4m3fn/e5m2 goes
    // through CUDA's conversion, which drops the NaN sign (H200 capture: f16 0xFC01.. -> 0x7F).
    ConversionSpec s = base(to, Rounding::rne, Overflow::nonsat, NanOut::keep_sign, F64Path::via_f32);
    if (n == "torch-2.11-cuda" && from == Format::f16 && is_e4m3fn_or_e5m2(to)) s.nan = NanOut::canonical;
    return s;
  }
  if (n == "cuda-satfinite" || n == "cuda-nosat") {
    const Overflow o = n == "cuda-satfinite" ? Overflow::satfinite : Overflow::nonsat;
    // f32/f16/bf16: a NaN input is replaced by 0x7FFFFFFF (sign dropped) -> 0x7F. f64 inputs go through the
    // software __nv_cvt_double_to_fp8, which keeps the NaN's sign and e5m2 payload bits.
    const NanOut nan = from == Format::f64 ? NanOut::payload : NanOut::canonical;
    return base(to, Rounding::rne, o, nan, F64Path::direct);
  }
  if (n == "ml_dtypes" || n == "ml_dtypes-0.6") {
    // f64 arrays: 0.7 rounds once; 0.5/0.6 round via f32 (their scalar constructors rounded once)
    ConversionSpec s = base(to, Rounding::rne, Overflow::nonsat, NanOut::keep_sign,
                            n == "ml_dtypes" ? F64Path::direct : F64Path::via_f32);
    if (to == Format::e5m2) s.nan_code = 0x7E;  // quiet_NaN() of float8_e5m2, for every source (f16 included)
    return s;
  }
  if (n == "ocp-sat") return base(to, Rounding::rne, Overflow::satfinite, NanOut::keep_sign, F64Path::direct);
  // ocp-nosat and exact
  return base(to, Rounding::rne, Overflow::nonsat, NanOut::keep_sign, F64Path::direct);
}

std::optional<DecodeSpec> resolve_decode(std::string_view name, Format from, std::string* error) {
  const std::string n(name);
  bool known = false;
  for (const ConventionInfo& c : kConventions)
    if (n == c.name) known = true;
  if (!known) {
    if (error) *error = "unknown convention '" + n + "' (fp8ref list shows the conventions)";
    return std::nullopt;
  }
  if (!is_fp8(from)) {
    if (error) *error = std::string("cannot decode from '") + format_name(from) + "': not an FP8 format";
    return std::nullopt;
  }
  DecodeSpec d;  // default: ±0x7FC00000 (ml_dtypes — whose fnuz NaN 0x80 decodes negative —, OCP, exact)
  if (n == "torch-2.11" || n == "torch-2.11-cuda") {
    // H200 capture: e4m3fn NaN -> ±0x7FF00000 (CPU and CUDA); e5m2 NaN -> CPU keeps the payload through f16
    // (±0x7FC00000 | frac << 21), CUDA gives ±0x7FFFFFFF; fnuz 0x80 and e8m0 0xFF -> 0x7F800001.
    if (from == Format::e4m3fn) {
      d.nan_f32 = 0x7FF00000u;
    } else if (from == Format::e5m2) {
      d.nan_f32 = 0x7FFFFFFFu;
      d.nan_payload = n == "torch-2.11";
    } else {
      d.nan_f32 = 0x7F800001u;
      d.nan_keep_sign = false;
    }
  } else if (n == "cuda-satfinite" || n == "cuda-nosat") {
    d.nan_f32 = 0x7FFFFFFFu;  // __half2float(__nv_cvt_fp8_to_halfraw(NaN)): +0x7FFFFFFF for every NaN (capture)
    d.nan_keep_sign = false;
  }
  return d;
}

bool apply_override(std::string_view convention, std::string_view field, std::string_view value,
                    ConversionSpec* spec, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  const std::string f(field), v(value);
  const bool cuda = convention.rfind("cuda-", 0) == 0;
  if (f == "rounding") {
    Rounding r;
    if (!parse_rounding(v, &r)) return fail("unknown rounding '" + v + "' (rne, rz, ru, rd, rna, stochastic)");
    if (spec->to == Format::ue8m0 && cuda && r != Rounding::rz && r != Rounding::ru)
      return fail("CUDA's e8m0 conversion allows only --rounding rz or ru (cudaRoundZero, cudaRoundPosInf), not '" +
                  v + "'");
    if (spec->to == Format::ue8m0 && spec->ue8m0_method != Ue8m0Method::value)
      return fail("convention '" + std::string(convention) + "' rounds with a fixed bit trick; --rounding does not apply");
    spec->rounding = r;
    return true;
  }
  if (f == "overflow") {
    if (!parse_overflow(v, &spec->overflow)) return fail("unknown overflow '" + v + "' (satfinite, saturate, nonsat)");
    return true;
  }
  if (f == "nan") {
    if (!parse_nan_out(v, &spec->nan)) return fail("unknown nan mode '" + v + "' (canonical, keep-sign, payload)");
    return true;
  }
  if (f == "f64-path") {
    if (!parse_f64_path(v, &spec->f64_path)) return fail("unknown f64 path '" + v + "' (direct, via-f32)");
    return true;
  }
  auto parse_int = [](const std::string& s, long long* out) {
    try {
      size_t pos = 0;
      *out = std::stoll(s, &pos, 0);
      return pos == s.size();
    } catch (...) {
      return false;
    }
  };
  long long x = 0;
  if (f == "nan-code") {
    if (!parse_int(v, &x) || x < 0 || x > 255) return fail("--nan-code must be a byte, e.g. 0x7f; got '" + v + "'");
    if (classify_code(spec->to, static_cast<uint8_t>(x)) != CodeClass::nan)
      return fail("--nan-code " + v + " is not a NaN code of " + format_name(spec->to));
    spec->nan_code = static_cast<uint8_t>(x & 0x7F);
    return true;
  }
  if (f == "seed") {
    try {
      size_t pos = 0;
      spec->seed = std::stoull(v, &pos, 0);
      if (pos != v.size()) return fail("--seed must be an unsigned integer; got '" + v + "'");
    } catch (...) {
      return fail("--seed must be an unsigned integer; got '" + v + "'");
    }
    return true;
  }
  if (f == "exp-clamp") {
    const size_t colon = v.find(':');
    long long lo = 0, hi = 0;
    if (colon == std::string::npos || !parse_int(v.substr(0, colon), &lo) || !parse_int(v.substr(colon + 1), &hi) ||
        lo < 0 || hi > 254 || lo > hi)
      return fail("--exp-clamp takes LO:HI with 0 <= LO <= HI <= 254 (DeepGEMM: 1:254); got '" + v + "'");
    if (spec->to != Format::ue8m0) return fail("--exp-clamp applies to ue8m0 only");
    spec->ue8m0_clamp = true;
    spec->exp_lo = static_cast<int>(lo);
    spec->exp_hi = static_cast<int>(hi);
    return true;
  }
  return fail("unknown override '" + f + "'");
}

}  // namespace fp8ref

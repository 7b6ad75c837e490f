// fp8ref — the quantization oracle: scalar, one step at a time, in the order of the contract in
// include/fp8ref/quant.h. Built with -ffp-contract=off: every f32 operation below is one IEEE binary32 operation
// with round-to-nearest-even; casts and scale roundings go through ref::encode / ref::narrow (integer code).
//
// The rounding steps, per named convention (each preset, with its source, is in src/core/quant_conventions.cc):
//
// exact (the contract)
//   1. amax = max |x| (exact; no rounding)
//   2. s = amax / max rounded once to the scale dtype (f32/bf16/f16: RNE; ue8m0: up to a power of two)
//   3. q = x / s rounded once to the target (RNE), from the exact quotient
// vllm-group (research §3.5)
//   1. amax = fmaxf(1e-10, max |x|) (exact)
//   2. s = RN32(amax / max)                                  [ue8m0: s = 2^ceil(log2 fmaxf(s, 1e-10)), exact]
//   3. v = RN32(x / s); clamp fminf(fmaxf(v, -max), max)      (NaN -> -max)
//   4. q = RNE(v) (c10 cast; no overflow after the clamp)
// vllm-per-token (research §4.1)
//   1. amax = max |x|; s = fmaxf(RN32(amax / max), RN32(1 / RN32(max · 512)))
//   2. v = RN32(x / s); clamp fmaxf(-max, fminf(v, max))      (NaN -> +max)
//   3. q = RNE satfinite(v)
// deepseek-act-quant (research §3.6; ⊘ = Triton's division, div=triton-nv: include/fp8ref/triton_div.h)
//   1. amax = fmaxf(max |x|, RN32(1e-4)); s = amax ⊘ 448               [ue8m0: 2^ceil(log2 s), exact]
//   2. v = x ⊘ s, no clamp
//   3. q = RNE satfinite(v)   (Triton cast: Inf -> 448, NaN -> NaN)
// deepgemm (research §3.7, corrected: CUDA tensor / Python scalar multiplies by the reciprocal)
//   1. amax = max |x| (NaN propagates); amax = max(amax, RN32(1e-4)) (NaN kept)
//   2. s = RN32(amax · RN32(1/448))                            [ue8m0: 2^clamp(ceil, 1, 254), exact]
//   3. v = RN32(x · RN32(1 / s)), no clamp
//   4. q = torch-2.11 cast of v (RNE; |v| > 464 -> NaN)
// sglang-triton (research §3.1; ⊘ = Triton's division)
//   1. amax = fmaxf(max |x|, 1e-10); s = amax ⊘ max             [ue8m0: 2^ceil(log2 s), exact]
//   2. v = RN32(x · (1 ⊘ s)); tl.clamp(v, -max, max)            (NaN -> -max, measured on the H200)
//   3. q = RNE satfinite(v)
// sglang-triton-colmajor (research §3.2): as sglang-triton, but v = x ⊘ s (no reciprocal); scales tma-aligned
// sgl-kernel (research §3.3)
//   1. amax = fmaxf(1e-10, max |x|); s = RN32(amax · RN32(1/448))
//      [ue8m0: c = exp(s) + (mant(s) != 0), no clamp; R = bits (254 - c) << 23, i.e. 2^(127-c), -Inf for c = 255]
//   2. v = RN32(x · RN32(448 / amax))                           [ue8m0: v = RN32(x · R)]
//   3. q = RNE satfinite(v), no clamp
// sglang-jit (research §3.4)
//   1. amax as sgl-kernel (the 16-bit max is exact); s = RN32(amax · RN32(1/448))   [ue8m0: c, R as sgl-kernel]
//   2. v = RN32(x · RN32(448 · RN32(1/amax)))                   [ue8m0: v = RN16(x · RN16(R)) in the input's type]
//   3. q = RNE satfinite(v), no clamp
// mx (OCP MX v1.0 §6.3)
//   1. X = 2^(floor(log2 amax) - emax_elem) (exact; NaN/Inf in the block -> NaN)
//   2. q = RNE(x / X) from the exact quotient, saturating to ±max
//
// NaN model: every f32 arithmetic result that is NaN becomes the canonical +NaN 0x7FFFFFFF (NVIDIA GPUs), so the
// host's NaN sign (x86 produces -NaN for Inf·0) never leaks into a code.
#include <cmath>
#include <cstring>
#include <limits>

#include "fp8ref/error.h"
#include "fp8ref/quant.h"
#include "fp8ref/triton_div.h"

namespace fp8ref::ref {

namespace {

constexpr uint32_t kCanonicalNan = 0x7FFFFFFFu;

float f32_from_bits(uint32_t b) { return fp8ref::f32_from_bits(b); }

uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

// One IEEE binary32 operation, then the GPU NaN model.
float gpu(float r) { return std::isnan(r) ? f32_from_bits(kCanonicalNan) : r; }
float div32(float a, float b) { return gpu(a / b); }
float mul32(float a, float b) { return gpu(a * b); }
// The `/` of the spec: IEEE, or Triton's div.full.f32 on NVIDIA (include/fp8ref/triton_div.h).
float divide(const QuantSpec& spec, float a, float b) {
  return spec.div == Division::triton_nv ? triton_nv_div(a, b) : div32(a, b);
}

// CUDA fmaxf / fminf (C99 fmax/fmin): a NaN operand loses to the other.
float fmax_nan_loses(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return a < b ? b : a;
}
float fmin_nan_loses(float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return b < a ? b : a;
}
// torch.clamp / torch max reductions: a NaN operand wins.
float fmax_nan_wins(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return f32_from_bits(kCanonicalNan);
  return a < b ? b : a;
}

// The f32 value of source element i (exact widening).
float load_source(Format from, const void* x, size_t i) { return load_f32(from, x, static_cast<int64_t>(i)); }

int significant_bits(double d) {
  int e;
  const double m = std::frexp(std::fabs(d), &e);  // m in [0.5, 1)
  uint64_t sig = static_cast<uint64_t>(std::ldexp(m, 53));
  int bits = 53;
  while (bits > 0 && (sig & 1) == 0) {
    sig >>= 1;
    --bits;
  }
  return bits;
}

// The exact quotient a/b, as an f64 that every rounding used here treats like the exact value.
// d = RN64(a/b). Every decision point of the targets (the values and midpoints of fp8, ue8m0, bf16, f16 and f32,
// and the clamp bound ±max, an f32) has at most 30 significant bits and is an f64. If d has more than 30 bits it is
// not a decision point, and none lies strictly between a/b and d (it would be an f64 nearer a/b than d), so d
// rounds like a/b. If d has at most 30 bits and is inexact, the neighbour of d on the side of a/b has 53 bits and
// no f64 lies between it and d, so it rounds like a/b. The side is the sign of d·b − a, which fma computes with a
// correctly signed result (no underflow at these magnitudes: a, b are f32 values or f32 constants).
// With f32 operands the nudge never triggers (a − m·b for a decision point m is 0 or at least 2^-49·|a|, far above
// half an f64 ulp); it keeps the function exact for any f64 operands.
double exact_quotient(double a, double b) {
  const double d = a / b;
  if (!std::isfinite(a) || !std::isfinite(b) || b == 0 || !std::isfinite(d) || d == 0) return d;
  const double r = std::fma(d, b, -a);
  if (r == 0 || significant_bits(d) > 30) return d;
  const bool d_above = (r > 0) == (b > 0);
  return std::nextafter(d, d_above ? -HUGE_VAL : HUGE_VAL);
}

ConversionSpec convert_spec(const char* convention, Format from, Format to) {
  std::string err;
  auto s = resolve_convention(convention, from, to, &err);
  if (!s) throw InputError("internal: " + err);
  return *s;
}

// Where group ids come from: the [B, M, K] view and the logical scale shape.
struct Groups {
  GranularityKind kind;
  int64_t M, K, G, Bm, nk, nbm;
  int64_t of(int64_t b, int64_t m, int64_t k) const {
    switch (kind) {
      case GranularityKind::tensor: return 0;
      case GranularityKind::row: return b * M + m;
      case GranularityKind::col: return k;
      case GranularityKind::group:
      case GranularityKind::mx: return (b * M + m) * nk + k / G;
      case GranularityKind::block: return (b * nbm + m / Bm) * nk + k / G;
    }
    return 0;
  }
};

Groups groups_of(const QuantSpec& spec, const QuantLayout& L) {
  Groups g;
  g.kind = spec.granularity.kind;
  g.M = L.M;
  g.K = L.K;
  g.G = spec.granularity.bk;
  g.Bm = spec.granularity.bm;
  const size_t r = L.scale_shape.size();
  g.nk = L.scale_shape[r - 1];
  g.nbm = r >= 2 ? L.scale_shape[r - 2] : 1;
  return g;
}

// ---- scale storage --------------------------------------------------------------------------------------------

// A scale as stored: its bits in the storage format, and the f32 value quantization uses.
struct Scale {
  uint32_t bits = 0;
  float value = 0;
};

// ue8m0 code -> stored scale. scale-store native: the E8M0 code (0xFF = NaN). f32: the f32 power of two with bits
// code << 23 (code 0 -> +0.0), and 0xFF -> +Inf if the scale being rounded was infinite, else NaN.
Scale from_ue8m0(const QuantSpec& spec, uint8_t code, bool was_inf) {
  Scale s;
  if (spec.scale_store == ScaleStore::native) {
    s.bits = code;
    s.value = code == 0xFF ? f32_from_bits(kCanonicalNan) : static_cast<float>(std::ldexp(1.0, code - 127));
    return s;
  }
  if (code == 0xFF) s.bits = was_inf ? 0x7F800000u : kCanonicalNan;
  else s.bits = static_cast<uint32_t>(code) << 23;
  s.value = f32_from_bits(s.bits);
  return s;
}

Scale from_f32(float v) { return {bits_of(v), v}; }

Scale from_narrow(Format dt, uint64_t bits16) {
  Scale s;
  s.bits = static_cast<uint32_t>(bits16);
  s.value = f32_from_bits(static_cast<uint32_t>(narrow(dt, bits16, Format::f32)));
  return s;
}

void store_scale(const QuantSpec& spec, void* scales, size_t i, const Scale& s) {
  uint8_t* p = static_cast<uint8_t*>(scales);
  switch (scale_storage(spec)) {
    case Format::ue8m0: p[i] = static_cast<uint8_t>(s.bits); break;
    case Format::bf16:
    case Format::f16: {
      const uint16_t h = static_cast<uint16_t>(s.bits);
      std::memcpy(p + 2 * i, &h, 2);
      break;
    }
    default: std::memcpy(p + 4 * i, &s.bits, 4);
  }
}

float load_scale(const QuantSpec& spec, const void* scales, size_t i) {
  const uint8_t* p = static_cast<const uint8_t*>(scales);
  switch (scale_storage(spec)) {
    case Format::ue8m0: return p[i] == 0xFF ? f32_from_bits(kCanonicalNan) : static_cast<float>(std::ldexp(1.0, p[i] - 127));
    case Format::bf16:
    case Format::f16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      return f32_from_bits(static_cast<uint32_t>(narrow(scale_storage(spec), h, Format::f32)));
    }
    default: {
      uint32_t b;
      std::memcpy(&b, p + 4 * i, 4);
      return f32_from_bits(b);
    }
  }
}

// Step 3 and 5 of the contract: a guard value applied with the amax-nan rule.
float guard_max(const QuantSpec& spec, float v, float floor) {
  return spec.amax_nan == AmaxNan::ignore ? fmax_nan_loses(v, floor) : fmax_nan_wins(v, floor);
}

// Steps 4–6: the stored scale of a group from its guarded amax.
Scale group_scale(const QuantSpec& spec, float amax) {
  const double max = spec.fp8_max;
  if (spec.scale_round == ScaleRound::mx_floor) {
    // X = 2^(floor(log2 amax) - emax_elem), clipped to 2^-127; the MX convert convention rounds |amax| toward zero
    // to a power of two (0 -> 0x00, NaN/Inf -> 0xFF).
    const uint8_t c = encode(Format::f32, bits_of(amax), convert_spec("mx", Format::f32, Format::ue8m0));
    const int emax_elem = std::ilogb(format_info(spec.to).max_value);
    const uint8_t code = c == 0xFF ? uint8_t{0xFF} : static_cast<uint8_t>(c > emax_elem ? c - emax_elem : 0);
    return from_ue8m0(spec, code, false);
  }
  if (spec.scale_formula == ScaleFormula::exact) {
    // The exact quotient amax/max, floored by min-scale (compared exactly), rounded once to the scale dtype.
    double q;
    if (std::isnan(amax)) q = std::numeric_limits<double>::quiet_NaN();
    else q = exact_quotient(amax, max);
    if (spec.min_scale && !std::isnan(q) && static_cast<double>(amax) < static_cast<double>(*spec.min_scale) * max)
      q = *spec.min_scale;  // min_scale · max is exact in f64 (two f32 values)
    uint64_t qb;
    std::memcpy(&qb, &q, 8);
    switch (spec.scale_dtype) {
      case ScaleDtype::f32: return from_f32(f32_from_bits(static_cast<uint32_t>(narrow(Format::f64, qb, Format::f32))));
      case ScaleDtype::bf16:
      case ScaleDtype::f16: {
        const Format dt = spec.scale_dtype == ScaleDtype::bf16 ? Format::bf16 : Format::f16;
        return from_narrow(dt, narrow(Format::f64, qb, dt));
      }
      case ScaleDtype::ue8m0: {
        // The smallest power of two >= q: value rounding up (ru) of the magnitude, below 2^-127 -> 0x00.
        ConversionSpec up = convert_spec("cuda-nosat", Format::f64, Format::ue8m0);
        up.rounding = Rounding::ru;
        if (spec.scale_round == ScaleRound::pow2_ceil_clamp) {
          up.ue8m0_clamp = true;
          up.exp_lo = 1;
          up.exp_hi = 254;
        }
        return from_ue8m0(spec, encode(Format::f64, qb, up), std::isinf(q));
      }
    }
  }
  // IEEE f32 scale.
  float s = spec.scale_formula == ScaleFormula::div ? divide(spec, amax, spec.fp8_max)
                                                    : mul32(amax, divide(spec, 1.0f, spec.fp8_max));
  if (spec.min_scale) s = guard_max(spec, s, *spec.min_scale);
  switch (spec.scale_dtype) {
    case ScaleDtype::f32: return from_f32(s);
    case ScaleDtype::bf16: return from_narrow(Format::bf16, narrow(Format::f32, bits_of(s), Format::bf16));
    case ScaleDtype::f16: return from_narrow(Format::f16, narrow(Format::f32, bits_of(s), Format::f16));
    case ScaleDtype::ue8m0: {
      const char* rule = spec.scale_round == ScaleRound::pow2_ceil_clamp ? "pow2-ceil-clamp" : "pow2-ceil";
      return from_ue8m0(spec, encode(Format::f32, bits_of(s), convert_spec(rule, Format::f32, Format::ue8m0)),
                        std::isinf(s));
    }
  }
  return {};
}

// Steps 7–9 for one element: the code, and the exact quotient for exact.q.
struct Quantized {
  uint8_t code;
  double exact;
};

// The E8M0 code of a ue8m0 scale from its stored value: the f32 exponent field (native 2^(c-127) -> c, 2^-127 -> 0,
// NaN -> 0xFF; f32-held c << 23 -> c, 0.0 -> 0, Inf/NaN -> 0xFF) — what the kernels' `bits >> 23` reads.
uint32_t ue8m0_code(float sv) { return (bits_of(sv) >> 23) & 0xFF; }

// `x*rcp-bits(s)`: R = the f32 with bits (254 - c) << 23 (unsigned arithmetic: c = 255 gives 0xFF800000 = -Inf).
float rcp_bits(float sv) { return f32_from_bits((254u - ue8m0_code(sv)) << 23); }

// RN of an f32 value to bf16/f16 and back (exact widening).
float round_to(Format f, float v) {
  return f32_from_bits(static_cast<uint32_t>(narrow(f, narrow(Format::f32, bits_of(v), f), Format::f32)));
}

Quantized quantize_one(const QuantSpec& spec, Format from, float y, float sv, float amax) {
  const float mx = spec.fp8_max;
  Quantized out;
  const bool zero_by_zero = y == 0 && sv == 0;
  out.exact = std::isnan(y) || std::isnan(sv) ? std::numeric_limits<double>::quiet_NaN()
                                              : static_cast<double>(y) / static_cast<double>(sv);
  if (spec.formula == QuantFormula::exact) {
    double v;
    if (zero_by_zero) v = y;  // ±0: an all-zero group without guard
    else if (std::isnan(y) || std::isnan(sv)) v = std::numeric_limits<double>::quiet_NaN();
    else v = exact_quotient(y, sv);
    if (std::isnan(v)) v = std::numeric_limits<double>::quiet_NaN();  // Inf/Inf, 0·Inf: the canonical +NaN
    if (zero_by_zero) out.exact = y;
    switch (spec.clamp) {
      case Clamp::none: break;
      case Clamp::nan_to_max: v = std::isnan(v) ? mx : std::fmax(-static_cast<double>(mx), std::fmin(v, mx)); break;
      case Clamp::nan_to_min: v = std::isnan(v) ? -mx : std::fmin(std::fmax(v, -static_cast<double>(mx)), mx); break;
      case Clamp::nan_kept: v = std::isnan(v) ? v : std::fmin(std::fmax(v, -static_cast<double>(mx)), mx); break;
    }
    uint64_t vb;
    std::memcpy(&vb, &v, 8);
    out.code = encode(Format::f64, vb, spec.cast);
    if (std::isnan(out.exact)) out.exact = std::numeric_limits<double>::quiet_NaN();
    return out;
  }
  float v = 0;
  switch (spec.formula) {
    case QuantFormula::div: v = divide(spec, y, sv); break;
    case QuantFormula::mul_rcp: v = mul32(y, divide(spec, 1.0f, sv)); break;
    case QuantFormula::max_div_amax: v = mul32(y, divide(spec, mx, amax)); break;
    case QuantFormula::max_mul_rcp_amax: v = mul32(y, mul32(mx, div32(1.0f, amax))); break;  // __frcp_rn: IEEE
    case QuantFormula::mul_rcp_bits: v = mul32(y, rcp_bits(sv)); break;
    case QuantFormula::mul_rcp_bits_in:
      if (from == Format::f32) {
        v = mul32(y, rcp_bits(sv));
      } else {
        // __hmul2(x, T2(R)): R rounded to the 16-bit type (f16: 2^16 and above overflow to Inf), the product (exact
        // in f32: y has <= 11 significant bits, R is 0, ±Inf or a power of two) rounded once to the 16-bit type.
        const float p = mul32(y, round_to(from, rcp_bits(sv)));
        v = std::isnan(p) ? p : round_to(from, p);
      }
      break;
    case QuantFormula::exact: break;
  }
  switch (spec.clamp) {
    case Clamp::none: break;
    case Clamp::nan_to_max: v = fmax_nan_loses(-mx, fmin_nan_loses(v, mx)); break;
    case Clamp::nan_to_min: v = fmin_nan_loses(fmax_nan_loses(v, -mx), mx); break;
    case Clamp::nan_kept: v = std::isnan(v) ? v : fmin_nan_loses(fmax_nan_loses(v, -mx), mx); break;
  }
  out.code = encode(Format::f32, bits_of(v), spec.cast);
  if (std::isnan(out.exact)) out.exact = std::numeric_limits<double>::quiet_NaN();
  return out;
}

void check_from(Format from) {
  if (from != Format::f32 && from != Format::bf16 && from != Format::f16)
    throw InputError(std::string("quantize reads f32, bf16 or f16, not ") + format_name(from));
}

// Runs steps 7–9 over every element with the scales of each group.
void quantize_elements(const QuantSpec& spec, Format from, const void* x, const QuantLayout& L, const Groups& G,
                       const std::vector<float>& sv, const std::vector<float>& amax, uint8_t* q, double* exact_q) {
  int64_t i = 0;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t m = 0; m < L.M; ++m)
      for (int64_t k = 0; k < L.K; ++k, ++i) {
        const int64_t g = G.of(b, m, k);
        const Quantized r = quantize_one(spec, from, load_source(from, x, static_cast<size_t>(i)), sv[g], amax.empty() ? 0.0f : amax[g]);
        q[i] = r.code;
        if (exact_q) exact_q[i] = r.exact;
      }
}

}  // namespace

float scale_value(const QuantSpec& spec, const void* scales, size_t i) { return load_scale(spec, scales, i); }

void quantize(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape, uint8_t* q,
              void* scales, double* exact_q) {
  require_finalized(spec, "quantize");
  check_from(from);
  const QuantLayout L = quant_layout(spec, shape);
  const Groups G = groups_of(spec, L);
  // Step 2: amax per group, from +0.
  std::vector<float> amax(static_cast<size_t>(L.n_scales), 0.0f);
  int64_t i = 0;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t m = 0; m < L.M; ++m)
      for (int64_t k = 0; k < L.K; ++k, ++i) {
        const float a = std::fabs(load_source(from, x, static_cast<size_t>(i)));
        float& acc = amax[G.of(b, m, k)];
        acc = spec.amax_nan == AmaxNan::ignore ? fmax_nan_loses(acc, a) : fmax_nan_wins(acc, a);
      }
  // Steps 3–6: guard, scale, storage.
  std::vector<float> sv(amax.size());
  for (size_t g = 0; g < amax.size(); ++g) {
    if (spec.amax_floor) amax[g] = guard_max(spec, amax[g], *spec.amax_floor);
    const Scale s = group_scale(spec, amax[g]);
    store_scale(spec, scales, g, s);
    sv[g] = s.value;
  }
  // Steps 7–9.
  quantize_elements(spec, from, x, L, G, sv, amax, q, exact_q);
}

void quantize_static(const QuantSpec& spec, Format from, const void* x, const std::vector<int64_t>& shape,
                     const void* scales, uint8_t* q, double* exact_q) {
  require_finalized(spec, "quantize");
  check_from(from);
  if (spec.formula == QuantFormula::max_div_amax || spec.formula == QuantFormula::max_mul_rcp_amax)
    throw InputError(std::string("formula ") + to_string(spec.formula) + " needs dynamic scales");
  const QuantLayout L = quant_layout(spec, shape);
  const Groups G = groups_of(spec, L);
  std::vector<float> sv(static_cast<size_t>(L.n_scales));
  for (size_t g = 0; g < sv.size(); ++g) sv[g] = load_scale(spec, scales, g);
  quantize_elements(spec, from, x, L, G, sv, {}, q, exact_q);
}

void dequantize(const QuantSpec& spec, const uint8_t* q, const std::vector<int64_t>& shape, const void* scales,
                Format out_format, void* out, double* exact_x) {
  if (out_format != Format::f32 && out_format != Format::bf16 && out_format != Format::f16)
    throw InputError(std::string("dequantize writes f32, bf16 or f16, not ") + format_name(out_format));
  const QuantLayout L = quant_layout(spec, shape);
  const Groups G = groups_of(spec, L);
  uint8_t* o = static_cast<uint8_t*>(out);
  int64_t i = 0;
  for (int64_t b = 0; b < L.B; ++b)
    for (int64_t m = 0; m < L.M; ++m)
      for (int64_t k = 0; k < L.K; ++k, ++i) {
        const double s = load_scale(spec, scales, static_cast<size_t>(G.of(b, m, k)));
        const double p = value_of(spec.to, q[i]) * s;  // exact: <= 4 × 24 significant bits
        if (exact_x) exact_x[i] = p;
        uint32_t f;
        if (std::isnan(p)) {
          f = kCanonicalNan;
        } else {
          uint64_t pb;
          std::memcpy(&pb, &p, 8);
          f = static_cast<uint32_t>(narrow(Format::f64, pb, Format::f32));  // one f32 multiply
        }
        if (out_format == Format::f32) {
          std::memcpy(o + 4 * i, &f, 4);
        } else {
          const uint16_t h = static_cast<uint16_t>(narrow(Format::f32, f, out_format));
          std::memcpy(o + 2 * i, &h, 2);
        }
      }
}

}  // namespace fp8ref::ref

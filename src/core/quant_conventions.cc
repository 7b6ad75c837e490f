// fp8ref — named quantization conventions: presets of QuantSpec that reproduce real implementations step by step,
// the field parsers, and the shape rules (include/fp8ref/quant.h states the contract each field selects).
//
// Every preset lists the implementation's steps in order with the QuantSpec field each one sets, and cites the
// research notes (../shared/research/quant-conventions.md, "research §N") and the source file they were read from.
// The Triton conventions divide with div=triton-nv (Triton's div.full.f32, include/fp8ref/triton_div.h); the CUDA
// ones with IEEE division. Scale layouts are include/fp8ref/scale_layout.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fp8ref/error.h"
#include "fp8ref/quant.h"

namespace fp8ref {

namespace {

template <typename E>
struct Named {
  E value;
  const char* name;
};

constexpr Named<TailPolicy> kTails[] = {{TailPolicy::error, "error"}, {TailPolicy::partial, "partial"}};
constexpr Named<AmaxNan> kAmaxNans[] = {{AmaxNan::ignore, "ignore"}, {AmaxNan::propagate, "propagate"}};
constexpr Named<ScaleFormula> kScaleFormulas[] = {
    {ScaleFormula::div, "amax/max"}, {ScaleFormula::mul_rcp, "amax*(1/max)"}, {ScaleFormula::exact, "exact"}};
constexpr Named<ScaleDtype> kScaleDtypes[] = {
    {ScaleDtype::f32, "f32"}, {ScaleDtype::bf16, "bf16"}, {ScaleDtype::f16, "f16"}, {ScaleDtype::ue8m0, "ue8m0"}};
constexpr Named<ScaleRound> kScaleRounds[] = {{ScaleRound::rne, "rne"},
                                              {ScaleRound::pow2_ceil, "pow2-ceil"},
                                              {ScaleRound::pow2_ceil_clamp, "pow2-ceil-clamp"},
                                              {ScaleRound::mx_floor, "mx-floor"}};
constexpr Named<ScaleStore> kScaleStores[] = {{ScaleStore::native, "native"}, {ScaleStore::f32, "f32"}};
constexpr Named<QuantFormula> kFormulas[] = {{QuantFormula::div, "x/s"},
                                             {QuantFormula::mul_rcp, "x*(1/s)"},
                                             {QuantFormula::max_div_amax, "x*(max/amax)"},
                                             {QuantFormula::max_mul_rcp_amax, "x*(max*rcp(amax))"},
                                             {QuantFormula::exact, "exact"},
                                             {QuantFormula::mul_rcp_bits, "x*rcp-bits(s)"},
                                             {QuantFormula::mul_rcp_bits_in, "x*rcp-bits(s)@in"}};
constexpr Named<Division> kDivisions[] = {{Division::ieee, "ieee"}, {Division::triton_nv, "triton-nv"}};
constexpr Named<Clamp> kClamps[] = {
    {Clamp::none, "none"}, {Clamp::nan_to_max, "nan-to-max"}, {Clamp::nan_to_min, "nan-to-min"}, {Clamp::nan_kept, "nan-kept"}};

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

template <typename E, size_t N>
std::string names_of(const Named<E> (&table)[N]) {
  std::string s;
  for (const auto& e : table) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

bool parse_int(std::string_view s, int64_t lo, int64_t hi, int64_t* out) {
  if (s.empty() || s.size() > 12 || s.find_first_not_of("0123456789") != std::string_view::npos) return false;
  const long long v = std::stoll(std::string(s));
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

// A finite positive number; false if malformed.
bool parse_positive(std::string_view s, double* out) {
  const std::string t(s);
  if (t.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !std::isfinite(v) || !(v > 0)) return false;
  *out = v;
  return true;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  // the shortest %g form that reads back as the same f32 (guards and fp8-max are f32 values)
  if (static_cast<float>(std::strtod(buf, nullptr)) != static_cast<float>(v)) std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The element formats' largest finite values ("finfo max").
float finfo_max(Format to) { return static_cast<float>(format_info(to).max_value); }

bool is_fnuz(Format f) { return f == Format::e4m3fnuz || f == Format::e5m2fnuz; }

const std::vector<QuantConventionInfo> kQuantConventions = {
    {"exact", "the exact contract: scale = amax/max rounded once to the scale dtype, q = x/s rounded once",
     "quant.h (exact contract)", "group:128", "e4m3fn e5m2 e4m3fnuz e5m2fnuz"},
    {"vllm-group", "vLLM per_token_group_quant_fp8 -> CUDA per_token_group_quant_8bit (smem and register kernels)",
     "quant-conventions.md §3.5", "group:128", "e4m3fn e4m3fnuz"},
    {"vllm-per-token", "vLLM scaled_fp8_quant dynamic per-token (dynamic_per_token_scaled_fp8_quant)",
     "quant-conventions.md §4.1", "row", "e4m3fn e4m3fnuz"},
    {"vllm-per-tensor", "vLLM scaled_fp8_quant per-tensor: dynamic_scaled_fp8_quant, or static_scaled_fp8_quant "
                        "with --static",
     "quant-conventions.md §4.1", "tensor", "e4m3fn e4m3fnuz"},
    {"deepseek-act-quant", "DeepSeek-V3 inference/kernel.py act_quant_kernel (Triton)",
     "quant-conventions.md §3.6", "group:128", "e4m3fn"},
    {"deepgemm", "DeepGEMM deep_gemm/utils/math.py per_token_cast_to_fp8 / per_block / per_channel (torch, CUDA)",
     "quant-conventions.md §3.7", "group:128", "e4m3fn"},
    {"sglang-triton", "sglang per_token_group_quant_fp8 Triton _per_token_group_quant_8bit, row-major scales",
     "quant-conventions.md §3.1", "group:128", "e4m3fn e4m3fnuz"},
    {"sglang-triton-colmajor", "sglang Triton _per_token_group_quant_8bit_colmajor (column-major TMA-aligned scales, "
                               "x/s)",
     "quant-conventions.md §3.2", "group:128", "e4m3fn e4m3fnuz"},
    {"sgl-kernel", "sglang sgl-kernel per_token_group_quant_8bit (CUDA, AOT; sgl_per_token_group_quant_fp8)",
     "quant-conventions.md §3.3", "group:128", "e4m3fn"},
    {"sglang-jit", "sglang JIT per_token_group_quant QuantTrait::run (CUDA; the newest sglang path)",
     "quant-conventions.md §3.4", "group:128", "e4m3fn"},
    {"mx", "OCP Microscaling (MX) v1.0 §6.3: shared E8M0 scale 2^(floor(log2 amax) - emax_elem), block 32",
     "NUMERICS.md §3", "mx:32", "e4m3fn e5m2"},
};

bool defines(const QuantConventionInfo& c, Format to) {
  const std::string t = std::string(" ") + c.targets + " ";
  return t.find(std::string(" ") + format_name(to) + " ") != std::string::npos;
}

}  // namespace

const char* to_string(TailPolicy v) { return name_of(kTails, v); }
const char* to_string(AmaxNan v) { return name_of(kAmaxNans, v); }
const char* to_string(ScaleFormula v) { return name_of(kScaleFormulas, v); }
const char* to_string(ScaleDtype v) { return name_of(kScaleDtypes, v); }
const char* to_string(ScaleRound v) { return name_of(kScaleRounds, v); }
const char* to_string(ScaleStore v) { return name_of(kScaleStores, v); }
const char* to_string(QuantFormula v) { return name_of(kFormulas, v); }
const char* to_string(Clamp v) { return name_of(kClamps, v); }
const char* to_string(Division v) { return name_of(kDivisions, v); }
bool parse_scale_dtype(std::string_view s, ScaleDtype* out) { return parse_in(kScaleDtypes, s, out); }

std::string to_string(const Granularity& g) {
  switch (g.kind) {
    case GranularityKind::tensor: return "tensor";
    case GranularityKind::row: return "row";
    case GranularityKind::col: return "col";
    case GranularityKind::group: return "group:" + std::to_string(g.bk);
    case GranularityKind::block: return "block:" + std::to_string(g.bm) + "x" + std::to_string(g.bk);
    case GranularityKind::mx: return "mx:" + std::to_string(g.bk);
  }
  return "?";
}

bool parse_granularity(std::string_view s, Granularity* out, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = "granularity '" + std::string(s) + "': " + why +
                        " (tensor, row, col, group:G, block:BmxBk, mx:32)";
    return false;
  };
  constexpr int64_t kMaxExtent = int64_t{1} << 24;
  Granularity g;
  if (s == "tensor" || s == "row" || s == "col") {
    g.kind = s == "tensor" ? GranularityKind::tensor : s == "row" ? GranularityKind::row : GranularityKind::col;
    g.bm = 1;
    g.bk = 1;
    *out = g;
    return true;
  }
  const size_t colon = s.find(':');
  if (colon == std::string_view::npos) return fail("unknown granularity");
  const std::string_view kind = s.substr(0, colon), arg = s.substr(colon + 1);
  if (kind == "group") {
    g.kind = GranularityKind::group;
    if (!parse_int(arg, 1, kMaxExtent, &g.bk)) return fail("the group size must be an integer in [1, 2^24]");
  } else if (kind == "mx") {
    g.kind = GranularityKind::mx;
    if (!parse_int(arg, 1, kMaxExtent, &g.bk) || g.bk != 32) return fail("OCP MX v1.0 blocks are 32 elements");
  } else if (kind == "block") {
    g.kind = GranularityKind::block;
    const size_t x = arg.find('x');
    if (x == std::string_view::npos || !parse_int(arg.substr(0, x), 1, kMaxExtent, &g.bm) ||
        !parse_int(arg.substr(x + 1), 1, kMaxExtent, &g.bk))
      return fail("a block is BmxBk with integers in [1, 2^24], e.g. block:128x128");
  } else {
    return fail("unknown granularity");
  }
  *out = g;
  return true;
}

std::string QuantSpec::describe() const {
  std::string guard;
  if (amax_floor) guard += "amax-floor:" + number_text(*amax_floor);
  if (min_scale) guard += std::string(guard.empty() ? "" : ",") + "min-scale:" + number_text(*min_scale);
  if (guard.empty()) guard = "none";
  std::string s = "convention=" + convention + " to=" + format_name(to) + " granularity=" + fp8ref::to_string(granularity) +
                  " tail=" + fp8ref::to_string(tail) + " amax-nan=" + fp8ref::to_string(amax_nan) + " guard=" + guard +
                  " scale-formula=" + fp8ref::to_string(scale_formula) + " scale-dtype=" + fp8ref::to_string(scale_dtype) +
                  " scale-round=" + fp8ref::to_string(scale_round);
  if (scale_dtype == ScaleDtype::ue8m0) s += std::string(" scale-store=") + fp8ref::to_string(scale_store);
  s += " fp8-max=" + number_text(fp8_max) + " formula=" + fp8ref::to_string(formula) + " clamp=" +
       fp8ref::to_string(clamp) + " cast=" + cast_convention + " div=" + fp8ref::to_string(div) +
       " scale-layout=" + fp8ref::to_string(scale_layout);
  return s;
}

const std::vector<QuantConventionInfo>& quant_conventions() { return kQuantConventions; }

std::optional<QuantSpec> resolve_quant_convention(std::string_view name, Format to,
                                                  std::optional<ScaleDtype> scale_dtype, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<QuantSpec> {
    if (error) *error = why;
    return std::nullopt;
  };
  const std::string n(name);
  const QuantConventionInfo* info = nullptr;
  for (const QuantConventionInfo& c : kQuantConventions)
    if (n == c.name) info = &c;
  if (!info) {
    std::string names;
    for (const QuantConventionInfo& c : kQuantConventions) names += std::string(names.empty() ? "" : ", ") + c.name;
    return fail("unknown quant convention '" + n + "' (" + names + ")");
  }
  if (!is_fp8(to) || to == Format::ue8m0) return fail(std::string("'") + format_name(to) + "' is not an FP8 element format");
  if (!defines(*info, to))
    return fail("quant convention '" + n + "' defines the targets " + info->targets + ", not " + format_name(to));

  QuantSpec s;
  s.convention = n;
  s.to = to;
  std::string err;
  parse_granularity(info->default_granularity, &s.granularity, &err);
  const ScaleDtype dt = scale_dtype.value_or(n == "mx" ? ScaleDtype::ue8m0 : ScaleDtype::f32);
  s.scale_dtype = dt;
  s.scale_round = dt == ScaleDtype::ue8m0 ? ScaleRound::pow2_ceil : ScaleRound::rne;
  auto only_f32_or_ue8m0 = [&]() -> bool { return dt == ScaleDtype::f32 || dt == ScaleDtype::ue8m0; };

  if (n == "exact") {
    // The exact contract (quant.h): every quantity rounded once. Any scale dtype; ue8m0 = the smallest power of two
    // >= amax/max (pow2-ceil of the exact quotient), stored as E8M0 codes.
    s.amax_nan = AmaxNan::ignore;
    s.scale_formula = ScaleFormula::exact;
    s.formula = QuantFormula::exact;
    s.clamp = Clamp::none;
    s.fp8_max = finfo_max(to);
    s.cast_convention = is_fnuz(to) ? "torch-2.11" : "exact";  // RNE, overflow -> NaN/Inf (the `exact` cast has no fnuz)
    return s;
  }
  if (n == "vllm-group") {
    // research §3.5; vllm csrc/quantization/w8a8/fp8/per_token_group_quant.cu @0f5257e2 ComputeGroupScale,
    // QuantizeGroup and per_token_group_quant_8bit_register_kernel; python wrapper per_token_group_quant_fp8
    // (eps=1e-10; the CUDA op when x is contiguous).
    //   1. y = f32(x)
    //   2. local_absmax = eps; fmaxf(local_absmax, fabsf(y)) + fmaxf shuffles  -> amax-nan=ignore, amax-floor:1e-10
    //   3. y_s = local_absmax / max_8bit (IEEE)                                -> scale-formula=amax/max
    //   4. ue8m0: y_s = exp2f(ceilf(log2f(fmaxf(fabsf(y_s), 1e-10f))))         -> min-scale:1e-10, pow2-ceil, stored
    //      as an f32 power of two (the register kernel's bit trick, "bit-exact" per its comment)
    //   5. q = fminf(fmaxf(y / y_s, min_8bit), max_8bit): fmaxf first, so NaN -> min_8bit = -max  -> x/s,
    //      nan-to-min (the register kernel multiplies by 1/y_s for ue8m0: identical for powers of two)
    //   6. DST_DTYPE(q): the c10 Float8_e4m3fn(float) software conversion      -> cast=torch-2.11
    // max_8bit = finfo.max (448); 224 on FNUZ (get_fp8_min_max). K % G != 0 is a TORCH_CHECK      -> tail=error.
    if (!only_f32_or_ue8m0()) return fail("vllm-group writes f32 or ue8m0 (as f32) scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.amax_floor = 1e-10f;
    s.scale_formula = ScaleFormula::div;
    if (dt == ScaleDtype::ue8m0) {
      s.min_scale = 1e-10f;
      s.scale_store = ScaleStore::f32;
    }
    s.fp8_max = to == Format::e4m3fnuz ? 224.0f : finfo_max(to);
    s.formula = QuantFormula::div;
    s.clamp = Clamp::nan_to_min;
    s.cast_convention = "torch-2.11";
    return s;
  }
  if (n == "vllm-per-token") {
    // research §4.1; vllm csrc/quantization/w8a8/fp8/common.cu @096d3dc9 dynamic_per_token_scaled_fp8_quant_kernel_
    // strided, common.cuh scaled_fp8_conversion, csrc/quantization/utils.cuh @1f89a92c min_scaling_factor.
    //   1. absmax = 0; fmaxf(absmax, fabsf(f32(x))); cub block max                -> amax-nan=ignore, no amax floor
    //   2. token_scale = fmaxf(absmax / qmax, 1.0f / (qmax * 512.0f))          -> amax/max, min-scale:1/(qmax·512)
    //      (scale_ub not modelled: fminf(absmax, *scale_ub) when the caller passes one)
    //   3. r = fmaxf(-qmax, fminf(x / token_scale, qmax)): NaN -> +qmax       -> x/s, clamp=nan-to-max
    //   4. fp8::vec_conversion = __nv_cvt_float_to_fp8(r, __NV_SATFINITE, E4M3) -> cast=cuda-satfinite (ROCm FNUZ:
    //      cvt_c10, torch-2.11 here; identical after the clamp)
    // qmax = 448; 224 for e4m3fnuz (quant_type_max<Float8_e4m3fnuz> = 0x7E). Scales f32 [tokens, 1].
    if (dt != ScaleDtype::f32) return fail("vllm-per-token writes f32 scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.fp8_max = to == Format::e4m3fnuz ? 224.0f : finfo_max(to);
    s.min_scale = 1.0f / (s.fp8_max * 512.0f);  // f32 arithmetic, as in the kernel
    s.scale_formula = ScaleFormula::div;
    s.formula = QuantFormula::div;
    s.clamp = Clamp::nan_to_max;
    s.cast_convention = is_fnuz(to) ? "torch-2.11" : "cuda-satfinite";
    return s;
  }
  if (n == "vllm-per-tensor") {
    // research §4.1; vllm csrc/quantization/w8a8/fp8/common.cu @096d3dc9 segmented_max_reduction,
    // dynamic_scaled_fp8_quant_kernel_strided / static_scaled_fp8_quant_kernel_strided, common.cuh
    // scaled_fp8_conversion<true>.
    //   1. scale memset 0; per block max of fabsf(f32(x)) by fmaxf (NaN skipped);
    //      atomicMaxFloat(scale, block_max / qmax)                             -> amax-nan=ignore, no guard,
    //      (the largest quotient = the quotient of the largest: x -> x/qmax is monotone)   scale-formula=amax/max
    //   2. inverted_scale = 1.0f / scale; r = fmaxf(-qmax, fminf(x * inverted_scale, qmax))
    //                                                                          -> x*(1/s), clamp=nan-to-max
    //      (an all-zero tensor: scale 0, 1/0 = +Inf, 0·Inf = NaN -> +qmax, the stored scale 0)
    //   3. fp8::vec_conversion = __nv_cvt_float_to_fp8(r, __NV_SATFINITE, E4M3) -> cast=cuda-satfinite (ROCm FNUZ:
    //      torch-2.11 here; identical after the clamp)
    //   static (fp8ref quantize --static S): steps 2-3 with the given scale (a per-channel [d] scale: granularity col).
    // qmax = 448; 224 for e4m3fnuz. Scale f32 [1, ..., 1].
    if (dt != ScaleDtype::f32) return fail("vllm-per-tensor writes f32 scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.fp8_max = to == Format::e4m3fnuz ? 224.0f : finfo_max(to);
    s.scale_formula = ScaleFormula::div;
    s.formula = QuantFormula::mul_rcp;
    s.clamp = Clamp::nan_to_max;
    s.cast_convention = is_fnuz(to) ? "torch-2.11" : "cuda-satfinite";
    return s;
  }
  if (n == "deepseek-act-quant") {
    // research §3.6; deepseek-ai/DeepSeek-V3 inference/kernel.py @9b4e978 act_quant_kernel (scale_fmt added in
    // V3.1: config_v3.1.json "scale_fmt": "ue8m0").
    //   1. x = tl.load(...).to(tl.float32)
    //   2. amax = tl.max(tl.abs(x)); amax = tl.maximum(amax, 1e-4)             -> amax-nan=ignore (tl.max/tl.maximum
    //      lower to maxnum: NaN skipped — seen in the H200 capture), amax-floor:1e-4
    //   3. s = amax / 448.  (Triton `/` = div.full.f32)                         -> scale-formula=amax/max, div=triton-nv
    //   4. scale_fmt == "ue8m0": s = exp2(ceil(log2(s)))                       -> pow2-ceil, stored as f32
    //   5. y = x / s (Triton `/`), no clamp                                    -> x/s, clamp=none
    // H200 capture (torch 2.11, Triton 3.6.0, bf16 [256, 512] with NaN/Inf/zero/±max rows): bit-exact, f32 and ue8m0
    // scales (with IEEE division instead, 41% of the f32 scales differ by 1–2 ulps).
    //   6. y.to(float8_e4m3fn): Triton's saturating RNE cast, NaN stays NaN (research §11: +Inf -> 448) -> cast=
    //      cuda-satfinite
    // The kernel asserts K % 128 == 0 (blocks of the flattened tensor = 1×128 groups)   -> tail=error.
    if (!only_f32_or_ue8m0()) return fail("deepseek-act-quant writes f32 (or ue8m0 as f32) scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.amax_floor = 1e-4f;
    s.scale_formula = ScaleFormula::div;
    s.div = Division::triton_nv;
    if (dt == ScaleDtype::ue8m0) s.scale_store = ScaleStore::f32;
    s.fp8_max = 448.0f;
    s.formula = QuantFormula::div;
    s.clamp = Clamp::none;
    s.cast_convention = "cuda-satfinite";
    return s;
  }
  if (n == "deepgemm") {
    // research §3.7; deepseek-ai/DeepGEMM deep_gemm/utils/math.py (@54e2261; same math @38939a4)
    // per_token_cast_to_fp8(x, use_ue8m0, gran_k=128) (per_block_cast_to_fp8 = block:128x128,
    // per_channel_cast_to_fp8 = block:128x1 with the same steps), run on CUDA tensors:
    //   1. x_padded = zeros(m, align(n, 128)); x_padded[:, :n] = x           -> tail=partial (= zero padding)
    //   2. x_amax = x_view.abs().float().amax(dim=2)  — torch max reductions propagate NaN -> amax-nan=propagate
    //   3. .clamp(1e-4)  — torch.clamp keeps NaN                                -> amax-floor:1e-4 (NaN kept)
    //   4. sf = x_amax / 448.0 — a CUDA tensor divided by a Python scalar: ATen div_true_kernel_cuda's
    //      is_cpu_scalar(2) branch computes a * (1/b) with inv_b = RN(1/448)    -> scale-formula=amax*(1/max)
    //      (research §3.7 says IEEE division; that holds for CPU tensors only. Measured on the H200, torch 2.11:
    //      `t / 448.0` equals t·RN(1/448) for 4M of 4M random f32, RN(t/448) for only 45%)
    //   5. use_ue8m0: ceil_to_ue8m0: bits = sf.abs().view(int); exp = ((bits >> 23) & 0xFF) + (mantissa != 0);
    //      (exp.clamp(1, 254) << 23).view(float)                               -> pow2-ceil-clamp, stored as f32
    //   6. x_view * (1.0 / sf): Tensor.__rtruediv__ = reciprocal() * 1.0; bf16 × f32 promotes to f32 -> x*(1/s)
    //   7. .to(torch.float8_e4m3fn) on CUDA, no clamp: torch 2.11 = c10 conversion (overflow -> NaN; research §11)
    //      -> cast=torch-2.11-cuda
    // H200 capture (the function run as torch on CUDA, bf16 [256, 512] and [256, 300], f32 and ue8m0 scales, NaN/Inf
    // rows included): bit-exact, codes and scales.
    if (!only_f32_or_ue8m0()) return fail("deepgemm writes f32 (or ue8m0 as f32) scales, not " + std::string(to_string(dt)));
    s.tail = TailPolicy::partial;
    s.amax_nan = AmaxNan::propagate;
    s.amax_floor = 1e-4f;
    s.scale_formula = ScaleFormula::mul_rcp;
    if (dt == ScaleDtype::ue8m0) {
      s.scale_round = ScaleRound::pow2_ceil_clamp;
      s.scale_store = ScaleStore::f32;
    }
    s.fp8_max = 448.0f;
    s.formula = QuantFormula::mul_rcp;
    s.clamp = Clamp::none;
    s.cast_convention = "torch-2.11-cuda";
    return s;
  }
  if (n == "sglang-triton" || n == "sglang-triton-colmajor") {
    // sglang-triton: research §3.1; sglang python/sglang/srt/layers/quantization/fp8_kernel.py @008601fa
    // _per_token_group_quant_8bit (moved to python/sglang/kernels/ops/quantization/fp8_kernel.py @0499419e).
    //   1. y = tl.load(...).to(tl.float32)
    //   2. _absmax = tl.maximum(tl.max(tl.abs(y)), eps), eps = 1e-10           -> amax-nan=ignore, amax-floor:1e-10
    //   3. y_s = _absmax / fp8_max (Triton `/` = div.full.f32)                  -> scale-formula=amax/max, div=triton-nv
    //   4. [newest] SCALE_UE8M0: y_s = exp2(ceil(log2(abs(y_s))))              -> pow2-ceil, stored as f32 (research
    //      A4: equal to the bit trick on the H200; tl.log2/tl.exp2 of powers of two are exact)
    //   5. y_s_inv = 1.0 / y_s (Triton `/`)
    //   6. y_q = tl.clamp(y * y_s_inv, fp8_min, fp8_max)                       -> x*(1/s), clamp=nan-to-min:
    //      measured on the H200 (torch 2.11, Triton 3.6.0; this kernel with fp8_min/fp8_max passed as runtime
    //      arguments, as sglang does): NaN and Inf·0 quantize to fp8_min = -448 (0xFE). Research §11 recorded
    //      tl.clamp(NaN, -448, 448) = +448 for its own probe; the sglang call form gives -448.
    //   7. .to(fp8): Triton's saturating cast                                  -> cast=cuda-satfinite (FNUZ on ROCm:
    //      torch-2.11 here; identical after the clamp)
    // fp8_max = finfo.max = 448; 224 when is_fp8_fnuz(). Row-major scales (M, K/G). K % G != 0 asserted -> tail=error.
    // sglang-triton-colmajor: research §3.2; the same file's _per_token_group_quant_8bit_colmajor. Steps 1–4 as
    // above; then
    //   5'. y_q = tl.clamp(y / y_s, bit8_min, bit8_max).to(fp8): a direct Triton division, no reciprocal -> x/s
    //   6'. y_s stored at scale_col * y_s_col_stride + scale_row into create_per_token_group_quant_fp8_output_scale
    //       (column_major_scales=True, scale_tma_aligned=True): torch.empty((K/G, align4(M))).T[:M]
    //                                                                           -> scale-layout=tma-aligned (col-major
    //       without scale_tma_aligned). With UE8M0 the kernel writes the f32 powers of two; sglang then calls
    //       DeepGEMM transform_sf_into_required_layout, which packs them (scale-layout=packed-ue8m0).
    // H200 capture (tools/device/capture_quant_kernels.py, Triton 3.6.0; bf16, f16, f32 [254, 512], f32 and
    // ue8m0 scales, both kernels): bit-exact, codes and scales.
    if (!only_f32_or_ue8m0()) return fail(n + " writes f32 (or ue8m0 as f32) scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.amax_floor = 1e-10f;
    s.scale_formula = ScaleFormula::div;
    // Triton `/` is div.full.f32 on NVIDIA; the FNUZ targets are ROCm (gfx94x), where Triton emits LLVM fdiv
    // (research A1), taken as IEEE here (not measured).
    s.div = is_fnuz(to) ? Division::ieee : Division::triton_nv;
    if (dt == ScaleDtype::ue8m0) s.scale_store = ScaleStore::f32;
    s.fp8_max = to == Format::e4m3fnuz ? 224.0f : finfo_max(to);
    s.formula = n == "sglang-triton" ? QuantFormula::mul_rcp : QuantFormula::div;
    s.clamp = Clamp::nan_to_min;
    s.cast_convention = is_fnuz(to) ? "torch-2.11" : "cuda-satfinite";
    if (n == "sglang-triton-colmajor") s.scale_layout = ScaleLayout::tma_aligned;
    return s;
  }
  if (n == "sgl-kernel") {
    // research §3.3; sglang sgl-kernel/csrc/gemm/per_token_group_quant_8bit.cu @00568d90
    // per_token_group_quant_8bit_kernel (8 threads per group, 16-bit inputs: G = 128), fp8 output:
    //   1. local_absmax = LOCAL_ABSMAX_ABS = 1e-10; fmaxf(local_absmax, fabsf(f32(x))), fmaxf shuffles
    //                                                                           -> amax-nan=ignore, amax-floor:1e-10
    //   2. calculate_fp8_scales, f32: scale_inv = amax * MAX_8BIT_INV (constexpr 1.0f / 448) -> scale-formula=
    //      amax*(1/max); scale = 448 / amax (IEEE, a second rounding)         -> formula=x*(max/amax)
    //      UE8M0: e = fast_log2_ceil(amax * MAX_8BIT_INV) = exp - 127 + (mant != 0) -> pow2-ceil (no clamp), native
    //      codes; scale = fast_pow2(-e) = bits (127 - e) << 23 (e = 128 for an Inf amax: -Inf) -> x*rcp-bits(s);
    //      the stored byte is bits(fast_pow2(e)) >> 23 = the code (0xFF for Inf)
    //   3. __fmul2_rn(x, scale) then __nv_cvt_float2_to_fp8x2(.., __NV_SATFINITE, __NV_E4M3), no clamp
    //                                                                           -> clamp=none, cast=cuda-satfinite
    //   4. scales: row-major f32 (output_s + group_id; UE8M0 is refused there: TORCH_CHECK(!scale_ue8m0)), or
    //      column-major (col_idx * scale_stride * P + row_idx * P + pack_idx; P = 4 bytes per int32 for UE8M0)
    //                                                                           -> row-major; ue8m0: packed-ue8m0
    //      (the column-major index uses output_s.size(1) * 4 groups per row: only right when K/G % 4 == 0)
    // H200 capture (the kernel's formulas in tools/device/capture_quant_kernels.cu; bf16, f16 [254, 512], all three
    // layouts): bit-exact, codes and scales.
    if (!only_f32_or_ue8m0()) return fail("sgl-kernel writes f32 or ue8m0 scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.amax_floor = 1e-10f;
    s.scale_formula = ScaleFormula::mul_rcp;
    s.fp8_max = 448.0f;
    s.formula = dt == ScaleDtype::ue8m0 ? QuantFormula::mul_rcp_bits : QuantFormula::max_div_amax;
    if (dt == ScaleDtype::ue8m0) s.scale_layout = ScaleLayout::packed_ue8m0;
    s.clamp = Clamp::none;
    s.cast_convention = "cuda-satfinite";
    return s;
  }
  if (n == "sglang-jit") {
    // research §3.4; sglang python/sglang/jit_kernel/csrc/gemm/per_token_group_quant.cuh @97923ff3 QuantTrait::run,
    // jit_kernel/include/sgl_kernel/deepseek_v4/fp8_utils.cuh @2b6780b4 (16-bit inputs only; G in 16..256):
    //   1. amax = max(|x|) in the 16-bit domain (__habs2, __hmax2: NaN loses; exact), then fmaxf(amax.x, amax.y)
    //      and max(amax, 1e-10f)                                               -> amax-nan=ignore, amax-floor:1e-10
    //   2. raw_scale = amax * kMaxValueInv (constexpr 1.f / 448.f)             -> scale-formula=amax*(1/max)
    //   3. f32 scales: stored raw_scale; quant_scale = kMaxValue * __frcp_rn(amax) -> formula=x*(max*rcp(amax));
    //      q = fp8x2(float2{x * quant_scale}) (SATFINITE, no clip)            -> clamp=none, cast=cuda-satfinite
    //   4. UE8M0: exp = cast_to_ue8m0(raw_scale) = exp field + (mant != 0), no clamp -> pow2-ceil, native codes;
    //      quant_scale = inv_scale_ue8m0(exp) = bits (254 - exp) << 23; scale2 = T2(quant_scale);
    //      q = fp8x2(__hmul2(x, scale2)): the multiply in bf16/f16           -> formula=x*rcp-bits(s)@in (f16: the
    //      multiplier overflows to Inf when s < 2^-15, so such groups give ±448 and NaN for zeros)
    //   5. scales: f32 row-major / column-major by strides; UE8M0 always packed 4 per int32, column-major byte
    //      packed_group * group_stride + token * 4 + g % 4, tail bytes zeroed   -> row-major; ue8m0: packed-ue8m0
    // H200 capture (the kernel's formulas in tools/device/capture_quant_kernels.cu; bf16, f16 [254, 512] and
    // [254, 384]): bit-exact, codes and scales.
    if (!only_f32_or_ue8m0()) return fail("sglang-jit writes f32 or ue8m0 scales, not " + std::string(to_string(dt)));
    s.amax_nan = AmaxNan::ignore;
    s.amax_floor = 1e-10f;
    s.scale_formula = ScaleFormula::mul_rcp;
    s.fp8_max = 448.0f;
    s.formula = dt == ScaleDtype::ue8m0 ? QuantFormula::mul_rcp_bits_in : QuantFormula::max_mul_rcp_amax;
    if (dt == ScaleDtype::ue8m0) s.scale_layout = ScaleLayout::packed_ue8m0;
    s.clamp = Clamp::none;
    s.cast_convention = "cuda-satfinite";
    return s;
  }
  // mx — OCP Microscaling Formats (MX) v1.0 §6.3 (NUMERICS.md §3): "Set X to be the largest power-of-two less than
  // or equal to max(|V_i|), divided by the largest power-of-two representable in the element data type; set P_i
  // to V_i / X quantized to the element data type, normal numbers that exceed the max normal clamped to the max
  // normal, preserving the sign"; roundTiesToEven.
  //   1. amax = max |V_i| over the 32 elements                                 -> amax-nan=propagate
  //   2. X = 2^(floor(log2 amax) - emax_elem), emax_elem = 8 (e4m3), 15 (e5m2)  -> scale-round=mx-floor
  //      (not in the spec text, fp8ref's choice as microsoft/microxcaling's _quantize_mx: X clipped below to
  //      2^-127; amax = 0 -> 2^-127; a NaN or Inf in the block -> X = NaN (0xFF), so the whole block is NaN)
  //   3. P_i = RNE(V_i / X), exactly (X is a power of two)                      -> formula=exact
  //   4. saturate normals to ±max, keep the sign                                -> cast=ocp-sat
  if (dt != ScaleDtype::ue8m0) return fail("mx scales are ue8m0, not " + std::string(to_string(dt)));
  s.amax_nan = AmaxNan::propagate;
  s.scale_formula = ScaleFormula::exact;  // unused by mx-floor
  s.scale_round = ScaleRound::mx_floor;
  s.fp8_max = finfo_max(to);
  s.formula = QuantFormula::exact;
  s.clamp = Clamp::none;
  s.cast_convention = "ocp-sat";
  return s;
}

bool apply_quant_override(std::string_view field, std::string_view value, QuantSpec* spec, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  spec->finalized = false;  // (finalize_quant_spec again: `cast` may no longer match)
  const std::string f(field), v(value);
  if (f == "granularity") return parse_granularity(v, &spec->granularity, error);
  if (f == "tail") {
    if (!parse_in(kTails, v, &spec->tail)) return fail("unknown tail policy '" + v + "' (" + names_of(kTails) + ")");
    return true;
  }
  if (f == "amax-nan") {
    if (!parse_in(kAmaxNans, v, &spec->amax_nan)) return fail("unknown amax-nan '" + v + "' (" + names_of(kAmaxNans) + ")");
    return true;
  }
  if (f == "guard") {
    std::optional<float> floor, min_scale;
    if (v != "none") {
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = v.find(',', pos);
        const std::string item = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        const size_t colon = item.find(':');
        const std::string kind = item.substr(0, colon);
        double x = 0;
        if (colon == std::string::npos || !parse_positive(item.substr(colon + 1), &x) ||
            (kind != "amax-floor" && kind != "min-scale"))
          return fail("guard '" + v + "': expected none, amax-floor:E, min-scale:M or both comma-separated, with "
                      "E, M positive numbers (e.g. amax-floor:1e-10)");
        const float xf = static_cast<float>(x);  // the kernels' float constants: rounded to f32
        if (!(xf > 0) || std::isinf(xf)) return fail("guard '" + v + "': " + item + " is not a positive f32");
        (kind == "amax-floor" ? floor : min_scale) = xf;
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    }
    spec->amax_floor = floor;
    spec->min_scale = min_scale;
    return true;
  }
  if (f == "scale-formula") {
    if (!parse_in(kScaleFormulas, v, &spec->scale_formula))
      return fail("unknown scale-formula '" + v + "' (" + names_of(kScaleFormulas) + ")");
    return true;
  }
  if (f == "scale-round") {
    if (!parse_in(kScaleRounds, v, &spec->scale_round))
      return fail("unknown scale-round '" + v + "' (" + names_of(kScaleRounds) + ")");
    return true;
  }
  if (f == "scale-store") {
    if (!parse_in(kScaleStores, v, &spec->scale_store))
      return fail("unknown scale-store '" + v + "' (" + names_of(kScaleStores) + ")");
    return true;
  }
  if (f == "fp8-max") {
    if (v == "finfo") {
      spec->fp8_max = finfo_max(spec->to);
      return true;
    }
    double x = 0;
    if (!parse_positive(v, &x) || static_cast<double>(static_cast<float>(x)) != x)
      return fail("fp8-max '" + v + "': expected a positive number exactly representable in f32 (e.g. 448, 224) or finfo");
    spec->fp8_max = static_cast<float>(x);
    return true;
  }
  if (f == "formula") {
    if (!parse_in(kFormulas, v, &spec->formula)) return fail("unknown formula '" + v + "' (" + names_of(kFormulas) + ")");
    return true;
  }
  if (f == "clamp") {
    if (!parse_in(kClamps, v, &spec->clamp)) return fail("unknown clamp '" + v + "' (" + names_of(kClamps) + ")");
    return true;
  }
  if (f == "div") {
    if (!parse_in(kDivisions, v, &spec->div)) return fail("unknown div '" + v + "' (" + names_of(kDivisions) + ")");
    return true;
  }
  if (f == "scale-layout") {
    if (!parse_scale_layout(v, &spec->scale_layout))
      return fail("unknown scale-layout '" + v + "' (" + scale_layout_names() + ")");
    return true;
  }
  if (f == "cast") {
    std::string err;
    if (!resolve_convention(v, Format::f32, spec->to, &err)) return fail("cast '" + v + "': " + err);
    spec->cast_convention = v;
    return true;
  }
  return fail("unknown quantize field '" + f +
              "' (granularity, tail, amax-nan, guard, scale-formula, scale-round, scale-store, fp8-max, formula, clamp, "
              "cast, div, scale-layout)");
}

void finalize_quant_spec(QuantSpec* spec, bool dynamic) {
  QuantSpec& s = *spec;
  auto fail = [&](const std::string& why) { throw InputError("quantize (" + s.convention + "): " + why); };
  if (!is_fp8(s.to) || s.to == Format::ue8m0) fail(std::string("'") + format_name(s.to) + "' is not an FP8 element format");
  if (!(s.fp8_max > 0) || std::isinf(s.fp8_max)) fail("fp8-max must be positive and finite");
  const bool ue8m0 = s.scale_dtype == ScaleDtype::ue8m0;
  if (ue8m0 && s.scale_round == ScaleRound::rne)
    fail("ue8m0 scales need scale-round pow2-ceil, pow2-ceil-clamp or mx-floor, not rne");
  if (!ue8m0 && s.scale_round != ScaleRound::rne)
    fail(std::string("scale-round ") + to_string(s.scale_round) + " applies to ue8m0 scales; " +
         to_string(s.scale_dtype) + " scales round with rne");
  if (!ue8m0 && s.scale_store != ScaleStore::native) fail("scale-store f32 applies to ue8m0 scales only");
  if (s.granularity.kind == GranularityKind::mx && s.scale_round != ScaleRound::mx_floor)
    fail("granularity mx:32 means OCP MX scales (scale-dtype ue8m0, scale-round mx-floor); use group:32 for other "
         "scale rules");
  if (s.scale_round == ScaleRound::mx_floor && s.to != Format::e4m3fn && s.to != Format::e5m2)
    fail(std::string("mx-floor scales are defined for the OCP MX element formats e4m3fn and e5m2, not ") + format_name(s.to));
  const bool amax_formula = s.formula == QuantFormula::max_div_amax || s.formula == QuantFormula::max_mul_rcp_amax;
  if (amax_formula && !dynamic)
    fail(std::string("formula ") + to_string(s.formula) + " needs the group's amax: static scales cannot use it");
  if (amax_formula && s.scale_dtype != ScaleDtype::f32)
    fail(std::string("formula ") + to_string(s.formula) +
         " multiplies by max/amax, which only agrees with f32 scales (power-of-two scales: use x/s)");
  if ((s.formula == QuantFormula::mul_rcp_bits || s.formula == QuantFormula::mul_rcp_bits_in) && !ue8m0)
    fail(std::string("formula ") + to_string(s.formula) + " builds 2^(127-e) from the E8M0 code: it needs ue8m0 scales");
  if (s.scale_layout == ScaleLayout::packed_ue8m0 && !ue8m0)
    fail("scale-layout packed-ue8m0 packs E8M0 codes: it needs scale-dtype ue8m0");
  std::string err;
  const Format pre_cast = s.formula == QuantFormula::exact ? Format::f64 : Format::f32;
  auto c = resolve_convention(s.cast_convention, pre_cast, s.to, &err);
  if (!c) fail("cast '" + s.cast_convention + "': " + err);
  if (c->rounding == Rounding::stochastic) fail("a stochastic cast is not supported by quantize");
  if (pre_cast == Format::f64) c->f64_path = F64Path::direct;  // the exact quotient is rounded once
  s.cast = *c;
  s.finalized = true;
}

void require_finalized(const QuantSpec& spec, const char* op) {
  if (!spec.finalized || spec.cast.to != spec.to)
    throw InputError(std::string(op) + " (" + spec.convention +
                     "): the spec is not finalized — call finalize_quant_spec(&spec, dynamic) after "
                     "resolve_quant_convention and the overrides (finalize_rmsnorm_quant_spec for rmsnorm_quant)");
}

Format scale_storage(const QuantSpec& spec) {
  switch (spec.scale_dtype) {
    case ScaleDtype::f32: return Format::f32;
    case ScaleDtype::bf16: return Format::bf16;
    case ScaleDtype::f16: return Format::f16;
    case ScaleDtype::ue8m0: return spec.scale_store == ScaleStore::f32 ? Format::f32 : Format::ue8m0;
  }
  return Format::f32;
}

QuantLayout quant_layout(const QuantSpec& spec, const std::vector<int64_t>& shape) {
  QuantLayout L;
  L.data_shape = shape;
  const size_t r = shape.size();
  const Granularity& g = spec.granularity;
  auto shape_text = [&] {
    std::string t;
    for (size_t i = 0; i < r; ++i) t += (i ? "x" : "") + std::to_string(shape[i]);
    return t.empty() ? std::string("(scalar)") : t;
  };
  if (r == 0) throw InputError("quantize: a scalar has no last dimension to group along; give it shape 1");
  for (int64_t d : shape)
    if (d < 0) throw InputError("quantize: negative dimension in shape " + shape_text());
  L.K = shape[r - 1];
  L.M = r >= 2 ? shape[r - 2] : 1;
  L.B = 1;
  for (size_t i = 0; i + 2 < r; ++i) L.B *= shape[i];
  L.n_elems = L.B * L.M * L.K;
  auto tail_check = [&](int64_t extent, int64_t size, const char* dim) {
    if (extent % size != 0 && spec.tail == TailPolicy::error)
      throw InputError("quantize: shape " + shape_text() + ": " + dim + " = " + std::to_string(extent) +
                       " is not a multiple of " + std::to_string(size) + " (granularity " + to_string(g) +
                       "); pass tail=partial (--tail partial) to give the last " + std::to_string(extent % size) +
                       " elements a group of their own");
  };
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  auto one = [](int64_t d) { return d > 1 ? d : int64_t{1}; };
  L.scale_shape = shape;
  L.block.assign(r, 1);
  switch (g.kind) {
    case GranularityKind::tensor:
      L.scale_shape.assign(r, 1);
      for (size_t i = 0; i < r; ++i) L.block[i] = one(shape[i]);
      break;
    case GranularityKind::row:
      L.scale_shape[r - 1] = 1;
      L.block[r - 1] = one(L.K);
      break;
    case GranularityKind::col:
      L.scale_shape.assign(r, 1);
      L.scale_shape[r - 1] = L.K;
      for (size_t i = 0; i + 1 < r; ++i) L.block[i] = one(shape[i]);
      break;
    case GranularityKind::group:
    case GranularityKind::mx:
      tail_check(L.K, g.bk, "K (the last dimension)");
      L.scale_shape[r - 1] = ceil_div(L.K, g.bk);
      L.block[r - 1] = g.bk;
      break;
    case GranularityKind::block:
      if (r < 2) throw InputError("quantize: granularity " + to_string(g) + " needs rank >= 2, got shape " + shape_text());
      tail_check(L.M, g.bm, "M (the second-to-last dimension)");
      tail_check(L.K, g.bk, "K (the last dimension)");
      L.scale_shape[r - 2] = ceil_div(L.M, g.bm);
      L.scale_shape[r - 1] = ceil_div(L.K, g.bk);
      L.block[r - 2] = g.bm;
      L.block[r - 1] = g.bk;
      break;
  }
  L.n_scales = 1;
  for (int64_t d : L.scale_shape) L.n_scales *= d;
  stored_scales(spec, L);  // the layout must apply to these scales
  return L;
}

StoredScaleShape stored_scales(const QuantSpec& spec, const QuantLayout& L) {
  try {
    return stored_scale_shape(spec.scale_layout, L.scale_shape, format_info(scale_storage(spec)).bits / 8,
                              spec.scale_dtype == ScaleDtype::ue8m0);
  } catch (const InputError& e) {
    throw InputError(std::string("quantize: ") + e.what() + " (granularity " + to_string(spec.granularity) + ")");
  }
}

std::vector<uint8_t> layout_scales(const QuantSpec& spec, const QuantLayout& L, const void* logical) {
  return to_scale_layout(spec.scale_layout, L.scale_shape, format_info(scale_storage(spec)).bits / 8,
                         spec.scale_dtype == ScaleDtype::ue8m0, logical);
}

std::vector<uint8_t> unlayout_scales(const QuantSpec& spec, const QuantLayout& L, const void* stored) {
  return from_scale_layout(spec.scale_layout, L.scale_shape, format_info(scale_storage(spec)).bits / 8,
                           spec.scale_dtype == ScaleDtype::ue8m0, stored);
}

}  // namespace fp8ref

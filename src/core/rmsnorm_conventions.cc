// fp8ref — `rmsnorm_quant` conventions: presets of RmsNormQuantSpec that follow real fused RMSNorm + FP8 group-quant
// kernels step by step (include/fp8ref/rmsnorm.h states the contract of each field), the field parsers and the
// shape rules. Sources: ../shared/research/quant-conventions.md ("research §N") and the files cited per preset.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fp8ref/error.h"
#include "fp8ref/rmsnorm.h"

namespace fp8ref {

namespace {

const std::vector<RmsNormConventionInfo> kConventions = {
    {"exact", "every step rounded once: exact mean of squares, correctly rounded rsqrt, exact group quant",
     "rmsnorm.h (exact)", "the contract itself", "e4m3fn e5m2 e4m3fnuz e5m2fnuz"},
    {"aiter-rmsnorm-quant", "ROCm/aiter fused_rms_fp8_group_quant (Triton), used by sglang/vLLM on ROCm",
     "quant-conventions.md §7.1",
     "not bit-exact with the device: Triton-on-ROCm sum order and rsqrt are not modelled (exact / rn stand in)",
     "e4m3fn e4m3fnuz"},
    {"vllm-rmsnorm-quant", "vLLM rms_norm_per_block_quant (CUDA, fused_layernorm_dynamic_per_token_quant.cu)",
     "quant-conventions.md §7.2",
     "bit-exact with a port of the kernel (real cub + rsqrtf) run on the H200; vLLM itself not run",
     "e4m3fn e4m3fnuz"},
    {"deepseek-rmsnorm", "DeepSeek-V3 inference/model.py RMSNorm, then act_quant (kernel.py)",
     "quant-conventions.md §7.3, §3.6",
     "not bit-exact with the device: the torch mean order is not modelled (exact stands in); rsqrt captured",
     "e4m3fn"},
};

bool defines(const RmsNormConventionInfo& c, Format to) {
  const std::string t = std::string(" ") + c.targets + " ";
  return t.find(std::string(" ") + format_name(to) + " ") != std::string::npos;
}

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  if (static_cast<float>(std::strtod(buf, nullptr)) != static_cast<float>(v)) std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

QuantSpec quant_preset(const char* name, Format to, std::optional<ScaleDtype> scale_dtype, std::string* error, bool* ok) {
  auto q = resolve_quant_convention(name, to, scale_dtype, error);
  *ok = q.has_value();
  return q ? *q : QuantSpec{};
}

}  // namespace

const char* to_string(ResidualSum v) { return v == ResidualSum::f32 ? "f32" : "dtype"; }
const char* to_string(Rsqrt v) { return v == Rsqrt::rn ? "rn" : v == Rsqrt::ieee ? "ieee" : "cuda-rsqrtf"; }
const char* to_string(NormWeight v) {
  switch (v) {
    case NormWeight::f32: return "f32";
    case NormWeight::dtype_twice: return "dtype-twice";
    case NormWeight::dtype_once: return "dtype-once";
  }
  return "?";
}

std::string RmsNormQuantSpec::variance_text() const {
  switch (variance) {
    case Variance::exact: return "exact";
    case Variance::f32_seq: return "f32-seq";
    case Variance::cub: return cub_threads == 0 ? "cub:auto" : "cub:" + std::to_string(cub_threads);
  }
  return "?";
}

std::string RmsNormQuantSpec::describe() const {
  return "convention=" + convention + " residual-sum=" + to_string(residual_sum) + " variance=" + variance_text() +
         " eps=" + number_text(eps) + " rsqrt=" + to_string(rsqrt) + " weight=" + to_string(weight) + " quant: " +
         quant.describe();
}

const std::vector<RmsNormConventionInfo>& rmsnorm_quant_conventions() { return kConventions; }

std::optional<RmsNormQuantSpec> resolve_rmsnorm_quant_convention(std::string_view name, Format to, std::string* error,
                                                                 std::optional<ScaleDtype> scale_dtype) {
  auto fail = [&](const std::string& why) -> std::optional<RmsNormQuantSpec> {
    if (error) *error = why;
    return std::nullopt;
  };
  const std::string n(name);
  const RmsNormConventionInfo* info = nullptr;
  for (const auto& c : kConventions)
    if (n == c.name) info = &c;
  if (!info) {
    std::string names;
    for (const auto& c : kConventions) names += std::string(names.empty() ? "" : ", ") + c.name;
    return fail("unknown rmsnorm-quant convention '" + n + "' (" + names + ")");
  }
  if (!is_fp8(to) || to == Format::ue8m0) return fail(std::string("'") + format_name(to) + "' is not an FP8 element format");
  if (!defines(*info, to))
    return fail("rmsnorm-quant convention '" + n + "' defines the targets " + info->targets + ", not " + format_name(to));
  RmsNormQuantSpec s;
  s.convention = n;
  bool ok = false;
  if (n == "exact") {
    // rmsnorm.h: every quantity rounded once.
    s.residual_sum = ResidualSum::f32;
    s.variance = Variance::exact;
    s.rsqrt = Rsqrt::rn;
    s.weight = NormWeight::f32;
    s.quant = quant_preset("exact", to, scale_dtype, error, &ok);
  } else if (n == "aiter-rmsnorm-quant") {
    // research §7.1; ROCm/aiter aiter/ops/triton/_triton_kernels/quant/fused_fp8_quant.py (@e4048607a5, group path
    // unchanged since PR #1148 e0d26ecbfb) _fused_rms_fp8_group_quant_kernel, _rmsmorm_op, _fp8_quant_op:
    //   1. x = inp1.to(f32); if res1: x = x + res1.to(f32) (f32, unrounded); out_res1 = x.to(inp1 dtype)
    //                                                                          -> residual-sum=f32
    //   2. row_norm = tl.sum(x * x) — Triton tree on ROCm, layout-dependent: NOT modelled  -> variance=exact
    //   3. norm_factor = tl.math.rsqrt(row_norm / n_cols + epsilon) — ROCm rsq: NOT modelled -> rsqrt=rn
    //      (row_norm / n_cols: LLVM fdiv on ROCm, IEEE here)
    //   4. rms_norm = x * norm_factor * g (left to right, f32; no rounding before quant)  -> weight=f32
    //   5. _fp8_quant_op: m = max(max|y|, 1e-10); scale_out = m / DTYPE_MAX; scale_recip = 1 / scale_out (`/` is
    //      LLVM fdiv on ROCm: IEEE here, div=ieee);
    //      q = clamp(y * scale_recip, -DTYPE_MAX, DTYPE_MAX) -> fp8. DTYPE_MAX = torch.finfo(dtype).max (240 for
    //      e4m3fnuz, not vLLM's 224)  -> quant convention sglang-triton's steps with fp8-max=finfo (clamp NaN -> -max
    //      as measured for Triton on the H200; the ROCm cast after the clamp is RNE either way)
    //   6. group_size default 128; scales f32 (M, ceil(N/G)) row-major.
    s.residual_sum = ResidualSum::f32;
    s.variance = Variance::exact;
    s.rsqrt = Rsqrt::rn;
    s.weight = NormWeight::f32;
    s.quant = quant_preset("sglang-triton", to, scale_dtype, error, &ok);
    if (ok) {
      s.quant.fp8_max = static_cast<float>(format_info(to).max_value);
      s.quant.div = Division::ieee;  // Triton `/` on ROCm is LLVM fdiv (research A1), not NVIDIA's div.full.f32
    }
  } else if (n == "vllm-rmsnorm-quant") {
    // research §7.2; vllm csrc/quantization/fused_kernels/fused_layernorm_dynamic_per_token_quant.cu
    // rms_norm_per_block_quant_kernel + layernorm_utils.cuh (@83e16d27) vectorized::compute_rms,
    // compute_dynamic_per_token_scales<group_size>, norm_and_quant<is_scale_inverted = (out is int8)>:
    //   1. x = f32(in) [+ f32(residual)] (f32); residual[i] = scalar_t(x)               -> residual-sum=f32
    //   2. ss: per thread, vec4 loads i = tid, tid+blockDim, ...; `ss += x.val[j] * x.val[j]` (fma);
    //      cub::BlockReduce<float,1024>.Reduce(ss, plus, blockDim.x); blockDim = min(hidden, tokens <= 256 ? 512 : 256)
    //      (rms_norm_per_block_quant_dispatch)                                       -> variance=cub:auto
    //   3. rms = rsqrtf(ss / hidden_size + epsilon) — MUFU.RSQ, captured on the H200  -> rsqrt=cuda-rsqrtf
    //   4. x = float(scalar_t(x * rms) * weight[i]) (c10 BFloat16/Half operator*: f32 product, rounded)
    //                                                                                   -> weight=dtype-twice
    //   5. per group: fmaxf over |x| from 0; scale = max(amax / qmax, min_scaling_factor = 1/(qmax·512))
    //   6. fp8: no inversion ("exact match with FBGemm"): fmaxf(-qmax, fminf(x / scale, qmax)) -> cast
    //      -> quant convention vllm-per-token's steps at granularity group:G (qmax 224 on e4m3fnuz)
    //   group_size 64 or 128 (TORCH_CHECK), hidden % group == 0 and hidden % 4 == 0.
    s.residual_sum = ResidualSum::f32;
    s.variance = Variance::cub;
    s.cub_threads = 0;
    s.rsqrt = Rsqrt::cuda;
    s.weight = NormWeight::dtype_twice;
    s.quant = quant_preset("vllm-per-token", to, scale_dtype, error, &ok);
  } else {
    // deepseek-rmsnorm — research §7.3; deepseek-ai/DeepSeek-V3 inference/model.py @adecc0e RMSNorm.forward:
    //   x = x.float(); var = x.pow(2).mean(-1, keepdim=True) — torch reduction order: NOT modelled -> variance=exact
    //   x = x * torch.rsqrt(var + self.eps) — on CUDA the same bits as rsqrtf (H200 capture)  -> rsqrt=cuda-rsqrtf
    //   return (self.weight * x).to(dtype)  — w promoted to f32, one rounding                  -> weight=dtype-once
    // Block.forward adds the residual in bf16 before the norm (x = x + attn(...)): z = bf16(x + r) -> residual-sum=dtype
    // then act_quant (inference/kernel.py; research §3.6)                               -> deepseek-act-quant steps
    s.residual_sum = ResidualSum::dtype;
    s.variance = Variance::exact;
    s.rsqrt = Rsqrt::cuda;
    s.weight = NormWeight::dtype_once;
    s.quant = quant_preset("deepseek-act-quant", to, scale_dtype, error, &ok);
  }
  if (!ok) {  // the quant preset refused the target or the scale dtype: say which rmsnorm convention asked
    if (error) *error = "rmsnorm-quant convention '" + n + "': its group quant " + *error;
    return std::nullopt;
  }
  s.quant.convention = n;
  std::string err;
  if (!parse_granularity("group:128", &s.quant.granularity, &err)) return fail(err);
  return s;
}

bool apply_rmsnorm_override(std::string_view field, std::string_view value, RmsNormQuantSpec* spec, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  const std::string f(field), v(value);
  if (f == "residual-sum") {
    if (v == "f32") spec->residual_sum = ResidualSum::f32;
    else if (v == "dtype") spec->residual_sum = ResidualSum::dtype;
    else return fail("unknown residual-sum '" + v + "' (f32, dtype)");
    return true;
  }
  if (f == "variance") {
    if (v == "exact") spec->variance = Variance::exact;
    else if (v == "f32-seq") spec->variance = Variance::f32_seq;
    else if (v == "cub:auto") spec->variance = Variance::cub, spec->cub_threads = 0;
    else if (v.rfind("cub:", 0) == 0 && v.size() > 4 && v.size() <= 8 &&
             v.find_first_not_of("0123456789", 4) == std::string::npos && std::stoi(v.substr(4)) >= 1 &&
             std::stoi(v.substr(4)) <= 1024)
      spec->variance = Variance::cub, spec->cub_threads = std::stoi(v.substr(4));
    else return fail("unknown variance '" + v + "' (exact, f32-seq, cub:auto, cub:T with T in [1, 1024])");
    return true;
  }
  if (f == "eps") {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(d) || d < 0 || std::isinf(static_cast<float>(d)))
      return fail("eps '" + v + "': expected a finite number >= 0 (rounded to f32), e.g. 1e-6");
    spec->eps = static_cast<float>(d);
    return true;
  }
  if (f == "rsqrt") {
    if (v == "rn") spec->rsqrt = Rsqrt::rn;
    else if (v == "ieee") spec->rsqrt = Rsqrt::ieee;
    else if (v == "cuda-rsqrtf") spec->rsqrt = Rsqrt::cuda;
    else return fail("unknown rsqrt '" + v + "' (rn, ieee, cuda-rsqrtf)");
    return true;
  }
  if (f == "weight") {
    if (v == "f32") spec->weight = NormWeight::f32;
    else if (v == "dtype-twice") spec->weight = NormWeight::dtype_twice;
    else if (v == "dtype-once") spec->weight = NormWeight::dtype_once;
    else return fail("unknown weight '" + v + "' (f32, dtype-twice, dtype-once)");
    return true;
  }
  if (f == "group") return apply_quant_override("granularity", "group:" + v, &spec->quant, error);
  return apply_quant_override(field, value, &spec->quant, error);
}

void finalize_rmsnorm_quant_spec(RmsNormQuantSpec* spec) {
  const GranularityKind k = spec->quant.granularity.kind;
  if (k != GranularityKind::group && k != GranularityKind::row)
    throw InputError("rmsnorm-quant (" + spec->convention + "): granularity " + to_string(spec->quant.granularity) +
                     " — the fused op quantizes each row: group:G or row");
  if (spec->variance == Variance::cub && (spec->cub_threads < 0 || spec->cub_threads > 1024))
    throw InputError("rmsnorm-quant: cub threads must be in [1, 1024]");
  if (!(spec->eps >= 0) || std::isinf(spec->eps)) throw InputError("rmsnorm-quant: eps must be finite and >= 0");
  finalize_quant_spec(&spec->quant, true);
}

RmsNormLayout rmsnorm_layout(const RmsNormQuantSpec& spec, Format from, const std::vector<int64_t>& shape,
                             const std::vector<int64_t>& weight_shape, const std::vector<int64_t>* residual_shape) {
  auto text = [](const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
    return t + "]";
  };
  if (from != Format::f32 && from != Format::bf16 && from != Format::f16)
    throw InputError(std::string("rmsnorm-quant reads f32, bf16 or f16, not ") + format_name(from));
  if (shape.empty()) throw InputError("rmsnorm-quant: x is a scalar; it needs a last dimension K (rank >= 1)");
  RmsNormLayout L;
  L.K = shape.back();
  L.M = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) L.M *= shape[i];
  if (weight_shape != std::vector<int64_t>{L.K})
    throw InputError("rmsnorm-quant: weight has shape " + text(weight_shape) + ", expected [" + std::to_string(L.K) +
                     "] (K, the last dimension of x " + text(shape) + ")");
  if (residual_shape && *residual_shape != shape)
    throw InputError("rmsnorm-quant: residual has shape " + text(*residual_shape) + ", expected x's shape " + text(shape));
  L.quant = quant_layout(spec.quant, shape);
  if (spec.variance == Variance::cub) {
    if (L.K % 4 != 0)
      throw InputError("rmsnorm-quant: variance=cub (vLLM's vectorized kernel) needs K % 4 == 0, got K = " +
                       std::to_string(L.K));
    L.cub_threads = spec.cub_threads;
    if (L.cub_threads == 0) {
      // rms_norm_per_block_quant_dispatch: dim3 block(std::min(hidden_size, max_block_size)),
      // max_block_size = (num_tokens <= 256) ? 512 : 256.
      const int64_t max_block = L.M <= 256 ? 512 : 256;
      L.cub_threads = static_cast<int>(L.K < max_block ? L.K : max_block);
      if (L.cub_threads < 1) L.cub_threads = 1;
    }
  }
  return L;
}

}  // namespace fp8ref

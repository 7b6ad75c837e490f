// fp8ref — the `rmsnorm_quant` op in the registry (contract: include/fp8ref/rmsnorm.h).
//
//   rmsnorm_quant from=bf16 to=e4m3fn shape=64x512 convention=vllm-rmsnorm-quant residual=yes fill=normal:amax=8 seed=1
//     tensors: input.x [shape] (BF16/F16/F32), input.weight [K], input.residual [shape] (residual=yes);
//              output.q [shape] (F8 tag of `to`), output.scale [..., ceil(K/G)] (the scale storage: F32 by default,
//              scale-dtype=ue8m0 as the convention stores it, e.g. F32 powers of two for deepseek-rmsnorm;
//              scale-layout col-major [ceil(K/G), M] / tma-aligned [ceil(K/G), align4(M)] as stored, named in
//              fp8ref.outputs with its logical shape),
//              output.residual [shape] (residual=yes: the updated residual, in the input dtype);
//              exact.q [shape] (F64: y / s, the normed value over its stored scale, before the cast).
//     Fills: input.x `fill` (stream 0), input.weight `weight-fill` (stream 1), input.residual `fill` (stream 2).
#include <cstring>
#include <optional>
#include <string>

#include "fp8ref/error.h"
#include "fp8ref/rmsnorm.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

// Descriptor keys that override one field of the convention (apply_rmsnorm_override).
const char* const kOverrides[] = {"group",    "eps",  "residual-sum", "variance", "rsqrt",   "weight",
                                  "granularity", "tail", "amax-nan",     "guard",    "scale-formula", "formula",
                                  "clamp",    "fp8-max", "cast", "scale-layout", "scale-round", "scale-store", "div"};

struct Case {
  Format from;
  RmsNormQuantSpec spec;
  bool residual = false;
  std::vector<int64_t> shape, wshape;
  RmsNormLayout layout;
};

Case parse_case(const Descriptor& d) {
  Case c;
  if (!parse_format(d.get("from"), &c.from)) throw InputError(where(d) + "unknown format '" + d.get("from") + "' for from");
  Format to;
  if (!parse_format(d.get("to"), &to)) throw InputError(where(d) + "unknown format '" + d.get("to") + "' for to");
  c.shape = parse_shape(d.get("shape"));
  const std::string& res = d.get("residual");
  if (res != "yes" && res != "no") throw InputError(where(d) + "residual is yes or no, not '" + res + "'");
  c.residual = res == "yes";
  std::string err;
  const std::optional<ScaleDtype> dt = scale_dtype_key(d);
  auto spec = resolve_rmsnorm_quant_convention(d.get("convention"), to, &err, dt);
  if (!spec) throw InputError(where(d) + err);
  for (const char* key : kOverrides)
    if (d.get(key) != "-" && !apply_rmsnorm_override(key, d.get(key), &*spec, &err)) throw InputError(where(d) + err);
  try {
    finalize_rmsnorm_quant_spec(&*spec);
    c.wshape = {c.shape.empty() ? 0 : c.shape.back()};
    c.layout = rmsnorm_layout(*spec, c.from, c.shape, c.wshape, c.residual ? &c.shape : nullptr);
  } catch (const InputError& e) {
    throw InputError(where(d) + e.what());
  }
  c.spec = *spec;
  return c;
}

// Runs `backend` (ref or cpu) on a case; exact_q optional.
Tensors compute(const Descriptor& d, const Tensors& inputs, bool cpu, io::Tensor* exact_q) {
  const Case c = parse_case(d);
  const io::DType dt = io::format_dtype(c.from);
  RmsNormQuantArgs a;
  a.from = c.from;
  a.shape = c.shape;
  a.weight_shape = c.wshape;
  a.x = find_input(d, inputs, "input.x", dt, c.shape).data.data();
  a.weight = find_input(d, inputs, "input.weight", dt, c.wshape).data.data();
  io::Tensor q = io::make_tensor("output.q", io::format_dtype(c.spec.quant.to), c.shape);
  io::Tensor s = io::make_tensor("output.scale", io::format_dtype(scale_storage(c.spec.quant)), c.layout.quant.scale_shape);
  io::Tensor r = io::make_tensor("output.residual", dt, c.residual ? c.shape : std::vector<int64_t>{0});
  a.q = q.data.data();
  a.scales = s.data.data();
  if (c.residual) {
    a.residual = find_input(d, inputs, "input.residual", dt, c.shape).data.data();
    a.residual_out = r.data.data();
  }
  if (exact_q) a.exact_q = reinterpret_cast<double*>(exact_q->data.data());
  // The kernels write the logical row-major scales; scale-layout transforms them as stored (vLLM's
  // is_scale_transposed, sglang/DeepGEMM column-major and TMA-aligned scales).
  RmsNormQuantSpec logical = c.spec;
  logical.quant.scale_layout = ScaleLayout::row_major;
  if (cpu) cpu::rmsnorm_quant(logical, a);
  else ref::rmsnorm_quant(logical, a);
  if (c.spec.quant.scale_layout != ScaleLayout::row_major) {
    const StoredScaleShape st = stored_scales(c.spec.quant, c.layout.quant);
    io::Tensor stored = io::make_tensor("output.scale", st.packed ? io::DType::I32 : s.dtype, st.shape);
    stored.data = layout_scales(c.spec.quant, c.layout.quant, s.data.data());
    s = std::move(stored);
  }
  Tensors out = {q, s};
  if (c.residual) out.push_back(r);
  return out;
}

std::string dims_of(size_t rank) {
  if (rank == 2) return R"(["row", "col"])";
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", \"d" : "\"d") + std::to_string(i) + "\"";
  return s + "]";
}

}  // namespace

OpInfo rmsnorm_quant_op() {
  OpInfo op;
  op.name = "rmsnorm_quant";
  op.summary = "fused (residual add +) RMSNorm + FP8 group quant under a named convention (aiter, vLLM, DeepSeek, exact)";
  op.params = {
      {"from", "bf16", "input dtype of x, weight and residual: f32, bf16, f16"},
      {"to", "e4m3fn", "target: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz (each convention defines some)"},
      {"shape", "64x512", "shape of input.x and output.q ([..., K]); weight is [K]"},
      {"convention", "exact", "exact, aiter-rmsnorm-quant, vllm-rmsnorm-quant, deepseek-rmsnorm"},
      {"residual", "no", "yes: input.residual is added first and output.residual returned"},
      {"scale-dtype", "-", "f32, bf16, f16, ue8m0: the scale variant of the convention's group quant (default f32)"},
      {"group", "-", "override: the group size G (granularity group:G; default 128)"},
      {"eps", "-", "override: epsilon (default 1e-6), rounded to f32"},
      {"residual-sum", "-", "override: f32, dtype"},
      {"variance", "-", "override: exact, f32-seq, cub:auto, cub:T"},
      {"rsqrt", "-", "override: rn, ieee, cuda-rsqrtf"},
      {"weight", "-", "override: f32, dtype-twice, dtype-once"},
      {"granularity", "-", "override: group:G or row"},
      {"tail", "-", "override: error, partial"},
      {"amax-nan", "-", "override: ignore, propagate"},
      {"guard", "-", "override: none, amax-floor:E, min-scale:M, or both"},
      {"scale-formula", "-", "override: amax/max, amax*(1/max), exact"},
      {"formula", "-", "override: x/s, x*(1/s), x*(max/amax), x*(max*rcp(amax)), exact"},
      {"clamp", "-", "override: none, nan-to-max, nan-to-min, nan-kept"},
      {"fp8-max", "-", "override: a positive f32 value or finfo"},
      {"cast", "-", "override: the convert convention of the final cast"},
      {"scale-layout", "-", "override: row-major, col-major, tma-aligned, packed-ue8m0 (output.scale as stored)"},
      {"scale-round", "-", "override: rne, pow2-ceil, pow2-ceil-clamp, mx-floor"},
      {"scale-store", "-", "override: native, f32 (ue8m0 held as f32)"},
      {"div", "-", "override: ieee, triton-nv"},
      {"fill", "normal:amax=8", "fill of input.x and input.residual (docs/golden-format.md)"},
      {"weight-fill", "normal:amax=3", "fill of input.weight"},
      {"seed", "1", "case seed"},
  };
  op.make_inputs = [](const Descriptor& d) -> Tensors {
    const Case c = parse_case(d);
    const uint64_t seed = std::stoull(d.get("seed"));
    const io::DType dt = io::format_dtype(c.from);
    Tensors t = {fill_tensor("input.x", dt, c.shape, d.get("fill"), seed, 0),
                 fill_tensor("input.weight", dt, c.wshape, d.get("weight-fill"), seed, 1)};
    if (c.residual) t.push_back(fill_tensor("input.residual", dt, c.shape, d.get("fill"), seed, 2));
    return t;
  };
  op.outputs_json = [](const Descriptor& d) {
    const Case c = parse_case(d);
    const std::string dims = dims_of(c.shape.size());
    std::string block = "[";
    for (size_t i = 0; i < c.layout.quant.block.size(); ++i)
      block += (i ? ", " : "") + std::to_string(c.layout.quant.block[i]);
    block += "]";
    std::string j = std::string(R"({"output.q": {"role": "data", "format": ")") + format_name(c.spec.quant.to) +
                    R"(", "contract": "exact", "dims": )" + dims + R"(, "scale": "output.scale"}, "output.scale": )" +
                    R"({"role": "scale", "format": ")" + format_name(scale_storage(c.spec.quant)) +
                    R"(", "contract": "exact", "of": "output.q", "block": )" + block;
    if (c.spec.quant.scale_layout != ScaleLayout::row_major) {  // stored transformed: the diff reads it back
      std::string logical = "[";
      for (size_t i = 0; i < c.layout.quant.scale_shape.size(); ++i)
        logical += (i ? ", " : "") + std::to_string(c.layout.quant.scale_shape[i]);
      j += std::string(R"(, "layout": ")") + to_string(c.spec.quant.scale_layout) + R"(", "logical_shape": )" + logical + "]";
    }
    j += "}";
    if (c.residual)
      j += std::string(R"(, "output.residual": {"role": "data", "format": ")") + format_name(c.from) +
           R"(", "contract": "exact", "dims": )" + dims + "}";
    return j + "}";
  };
  op.convention = [](const Descriptor& d) { return d.get("convention"); };
  op.models = [](const Descriptor& d) {
    return key_variants(d, "convention", {"exact", "aiter-rmsnorm-quant", "vllm-rmsnorm-quant", "deepseek-rmsnorm"});
  };
  op.exact = [](const Descriptor& d, const Tensors& inputs) -> Tensors {
    const Case c = parse_case(d);
    io::Tensor e = io::make_tensor("exact.q", io::DType::F64, c.shape);
    compute(d, inputs, false, &e);
    return {e};
  };
  return op;
}

std::vector<Kernel> rmsnorm_quant_kernels() {
  return {
      {"rmsnorm_quant", "reference", "ref::rmsnorm_quant (scalar, one row at a time)",
       [](const Descriptor& d, const Tensors& in) { return compute(d, in, false, nullptr); }},
      {"rmsnorm_quant", "cpu", "cpu::rmsnorm_quant (Highway + OpenMP over rows)",
       [](const Descriptor& d, const Tensors& in) { return compute(d, in, true, nullptr); }},
  };
}

}  // namespace fp8ref::golden

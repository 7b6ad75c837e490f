// fp8ref — the `quantize` and `dequantize` ops in the registry (contract: include/fp8ref/quant.h).
//
//   quantize from=bf16 to=e4m3fn shape=64x512 granularity=group:128 convention=vllm-group fill=normal:amax=8 seed=1
//     tensors: input.x [shape] (BF16/F16/F32); mode=static adds input.scale [stored scale shape];
//              output.q [shape] (F8 tag of `to`); output.scale [stored scale shape] (F32, BF16, F16 or F8_E8M0, or I32
//              words of 4 codes for packed-ue8m0; dynamic mode only); exact.q [shape] (F64: x / s by the stored
//              scale, before any f32 rounding or cast). The scales are in the layout scale-layout (the convention's,
//              or the override; include/fp8ref/scale_layout.h), named in fp8ref.outputs ("layout", and
//              "logical_shape" for layouts other than row-major).
//     Static cases: input.scale = the dynamic scales of the same input and spec, multiplied by 0.75 (f32/bf16/f16:
//     rounded to the dtype) or halved (ue8m0: one code lower) — so that some quotients exceed max and the clamp and
//     the cast's overflow policy are exercised.
//   dequantize from=e4m3fn to=f32 shape=64x512 granularity=group:128 scale-dtype=f32 fill=codes:format=e4m3fn
//     tensors: input.q [shape] (F8 tag), input.scale [scale shape] (random: f32 2^[-12,4)·[1,2); ue8m0 codes in
//     [112, 142]); output.x [shape] (F32/BF16/F16); exact.x (F64: value(q)·value(s), exact).
#include <cmath>
#include <cstring>
#include <string>

#include "fp8ref/error.h"
#include "fp8ref/quant.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

const char* const kQuantOverrides[] = {"granularity", "tail",    "amax-nan", "guard", "scale-formula", "scale-round",
                                       "scale-store", "fp8-max", "formula",  "clamp", "cast",          "div",
                                       "scale-layout"};

struct QuantCase {
  Format from;
  QuantSpec spec;
  bool dynamic = true;
  std::vector<int64_t> shape;
  QuantLayout layout;
};

Format format_key(const Descriptor& d, const char* key) {
  Format f;
  if (!parse_format(d.get(key), &f)) throw InputError(where(d) + "unknown format '" + d.get(key) + "' for " + key);
  return f;
}

QuantCase parse_quant_case(const Descriptor& d) {
  QuantCase c;
  c.from = format_key(d, "from");
  if (c.from != Format::f32 && c.from != Format::bf16 && c.from != Format::f16)
    throw InputError(where(d) + "quantize reads f32, bf16 or f16, not " + d.get("from"));
  const Format to = format_key(d, "to");
  c.shape = parse_shape(d.get("shape"));
  const std::string& mode = d.get("mode");
  if (mode != "dynamic" && mode != "static") throw InputError(where(d) + "mode is dynamic or static, not '" + mode + "'");
  c.dynamic = mode == "dynamic";
  const std::optional<ScaleDtype> dt = scale_dtype_key(d);
  std::string err;
  auto spec = resolve_quant_convention(d.get("convention"), to, dt, &err);
  if (!spec) throw InputError(where(d) + err);
  for (const char* key : kQuantOverrides)
    if (d.get(key) != "-" && !apply_quant_override(key, d.get(key), &*spec, &err)) throw InputError(where(d) + err);
  try {
    finalize_quant_spec(&*spec, c.dynamic);
    c.layout = quant_layout(*spec, c.shape);
  } catch (const InputError& e) {
    throw InputError(where(d) + e.what());
  }
  c.spec = *spec;
  return c;
}

io::DType scale_dtype_of(const QuantSpec& s) { return io::format_dtype(scale_storage(s)); }

// The scale tensor as stored (scale-layout): its dtype and shape.
io::DType stored_dtype_of(const QuantSpec& s, const QuantLayout& L) {
  return stored_scales(s, L).packed ? io::DType::I32 : scale_dtype_of(s);
}

std::string dims_json(size_t rank) {
  if (rank == 2) return R"(["row", "col"])";
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", \"d" : "\"d") + std::to_string(i) + "\"";
  return s + "]";
}

std::string ints_json(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const char* scale_format_name(const QuantSpec& s) { return format_name(scale_storage(s)); }

// ---- quantize kernels ---------------------------------------------------------------------------------------

// input.scale in its stored layout -> the logical row-major scale bytes.
std::vector<uint8_t> logical_input_scales(const Descriptor& d, const Tensors& inputs, const QuantSpec& spec,
                                          const QuantLayout& L) {
  const io::Tensor& s = find_input(d, inputs, "input.scale", stored_dtype_of(spec, L), stored_scales(spec, L).shape);
  return unlayout_scales(spec, L, s.data.data());
}

Tensors run_quantize(const Descriptor& d, const Tensors& inputs, bool cpu) {
  const QuantCase c = parse_quant_case(d);
  const io::Tensor& x = find_input(d, inputs, "input.x", io::format_dtype(c.from), c.shape);
  io::Tensor q = io::make_tensor("output.q", io::format_dtype(c.spec.to), c.shape);
  if (c.dynamic) {
    std::vector<uint8_t> logical(static_cast<size_t>(c.layout.n_scales) * io::dtype_size(scale_dtype_of(c.spec)));
    if (cpu) cpu::quantize(c.spec, c.from, x.data.data(), c.shape, q.data.data(), logical.data());
    else ref::quantize(c.spec, c.from, x.data.data(), c.shape, q.data.data(), logical.data());
    io::Tensor s = io::make_tensor("output.scale", stored_dtype_of(c.spec, c.layout), stored_scales(c.spec, c.layout).shape);
    s.data = layout_scales(c.spec, c.layout, logical.data());
    return {q, s};
  }
  const std::vector<uint8_t> sv = logical_input_scales(d, inputs, c.spec, c.layout);
  if (cpu) cpu::quantize_static(c.spec, c.from, x.data.data(), c.shape, sv.data(), q.data.data());
  else ref::quantize_static(c.spec, c.from, x.data.data(), c.shape, sv.data(), q.data.data());
  return {q};
}

Tensors quantize_reference(const Descriptor& d, const Tensors& inputs) { return run_quantize(d, inputs, false); }
// The cpu backend: cpu::quantize (src/cpu/quant_cpu.cc; it runs the reference for the specs it does not vectorise).
Tensors quantize_cpu(const Descriptor& d, const Tensors& inputs) { return run_quantize(d, inputs, true); }

// ---- dequantize -----------------------------------------------------------------------------------------------

struct DequantCase {
  QuantSpec spec;  // to = the codes' format; granularity, tail, scale dtype and store
  Format out;
  std::vector<int64_t> shape;
  QuantLayout layout;
};

DequantCase parse_dequant_case(const Descriptor& d) {
  DequantCase c;
  c.spec.to = format_key(d, "from");
  if (!is_fp8(c.spec.to) || c.spec.to == Format::ue8m0)
    throw InputError(where(d) + "dequantize reads FP8 codes (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), not " + d.get("from"));
  c.out = format_key(d, "to");
  if (c.out != Format::f32 && c.out != Format::bf16 && c.out != Format::f16)
    throw InputError(where(d) + "dequantize writes f32, bf16 or f16, not " + d.get("to"));
  c.shape = parse_shape(d.get("shape"));
  std::string err;
  if (!parse_scale_dtype(d.get("scale-dtype"), &c.spec.scale_dtype))
    throw InputError(where(d) + "unknown scale-dtype '" + d.get("scale-dtype") + "' (f32, bf16, f16, ue8m0)");
  c.spec.scale_round = c.spec.scale_dtype == ScaleDtype::ue8m0 ? ScaleRound::pow2_ceil : ScaleRound::rne;
  for (const char* key : {"granularity", "tail", "scale-store", "scale-layout"})
    if (!apply_quant_override(key, d.get(key), &c.spec, &err)) throw InputError(where(d) + err);
  if (c.spec.scale_store == ScaleStore::f32 && c.spec.scale_dtype != ScaleDtype::ue8m0)
    throw InputError(where(d) + "scale-store f32 applies to ue8m0 scales only");
  if (c.spec.granularity.kind == GranularityKind::mx && c.spec.scale_dtype != ScaleDtype::ue8m0)
    throw InputError(where(d) + "granularity mx:32 has ue8m0 scales");
  try {
    c.layout = quant_layout(c.spec, c.shape);
  } catch (const InputError& e) {
    throw InputError(where(d) + e.what());
  }
  return c;
}

Tensors run_dequantize(const Descriptor& d, const Tensors& inputs, bool cpu) {
  const DequantCase c = parse_dequant_case(d);
  const io::Tensor& q = find_input(d, inputs, "input.q", io::format_dtype(c.spec.to), c.shape);
  const std::vector<uint8_t> sv = logical_input_scales(d, inputs, c.spec, c.layout);
  io::Tensor x = io::make_tensor("output.x", io::format_dtype(c.out), c.shape);
  if (cpu) cpu::dequantize(c.spec, q.data.data(), c.shape, sv.data(), c.out, x.data.data());
  else ref::dequantize(c.spec, q.data.data(), c.shape, sv.data(), c.out, x.data.data());
  return {x};
}

Tensors dequantize_reference(const Descriptor& d, const Tensors& inputs) { return run_dequantize(d, inputs, false); }
Tensors dequantize_cpu(const Descriptor& d, const Tensors& inputs) { return run_dequantize(d, inputs, true); }

// Random positive scales for dequantize cases (logical; run_dequantize reads them in spec.scale_layout).
io::Tensor random_scales(const QuantSpec& spec, const std::vector<int64_t>& shape, uint64_t seed) {
  io::Tensor t = io::make_tensor("input.scale", scale_dtype_of(spec), shape);
  Rng rng(seed, 1);
  const size_t n = static_cast<size_t>(t.numel());
  const Format st = scale_storage(spec);
  for (size_t i = 0; i < n; ++i) {
    const int e = static_cast<int>(rng.next() % 30) - 15;  // codes 112..141
    if (spec.scale_dtype == ScaleDtype::ue8m0) {
      if (st == Format::ue8m0) {
        t.data[i] = static_cast<uint8_t>(127 + e);
      } else {
        const uint32_t b = static_cast<uint32_t>(127 + e) << 23;
        std::memcpy(&t.data[4 * i], &b, 4);
      }
      continue;
    }
    const int ex = static_cast<int>(rng.next() % 16) - 12;  // (drawn first: argument order is unspecified)
    const double v = std::ldexp(1.0 + rng.uniform(), ex);
    uint64_t vb;
    std::memcpy(&vb, &v, 8);
    const uint64_t bits = ref::narrow(Format::f64, vb, st);
    std::memcpy(&t.data[io::dtype_size(t.dtype) * i], &bits, io::dtype_size(t.dtype));
  }
  return t;
}

// "quant convention: exact, vllm-group, ..." — every preset of quant_conventions()
const char* convention_help() {
  static const std::string help = [] {
    std::string h = "quant convention:";
    for (const QuantConventionInfo& c : quant_conventions()) h += std::string(h.back() == ':' ? " " : ", ") + c.name;
    return h;
  }();
  return help.c_str();
}

}  // namespace

OpInfo quantize_op() {
  OpInfo op;
  op.name = "quantize";
  op.summary = "FP8 quantization with tensor/row/col/group/block/MX scales under a named quant convention";
  op.params = {
      {"from", "f32", "source format: f32, bf16, f16"},
      {"to", "e4m3fn", "target: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz"},
      {"shape", "64x512", "shape of input.x and output.q"},
      {"granularity", "-", "tensor, row, col, group:G, block:BmxBk, mx:32 (default: the convention's)"},
      {"convention", "exact", convention_help()},
      {"mode", "dynamic", "dynamic (scales from amax; output.scale) or static (input.scale given)"},
      {"scale-dtype", "-", "f32, bf16, f16, ue8m0 (default: the convention's)"},
      {"scale-round", "-", "override: rne, pow2-ceil, pow2-ceil-clamp, mx-floor"},
      {"scale-store", "-", "override (ue8m0): native (E8M0 codes) or f32 (powers of two as f32)"},
      {"guard", "-", "override: none, amax-floor:E, min-scale:M, or both comma-separated"},
      {"scale-formula", "-", "override: amax/max, amax*(1/max), exact"},
      {"formula", "-", "override: x/s, x*(1/s), x*(max/amax), x*(max*rcp(amax)), exact, x*rcp-bits(s), "
                       "x*rcp-bits(s)@in"},
      {"div", "-", "override: ieee, triton-nv (Triton's div.full.f32 on NVIDIA)"},
      {"scale-layout", "-", "override: row-major, col-major, tma-aligned, packed-ue8m0 (the stored scale tensors)"},
      {"clamp", "-", "override: none, nan-to-max, nan-to-min, nan-kept"},
      {"fp8-max", "-", "override: a positive f32 value or finfo"},
      {"cast", "-", "override: the convert convention of the final cast"},
      {"amax-nan", "-", "override: ignore, propagate"},
      {"tail", "-", "override: error, partial"},
      {"fill", "normal:amax=448", "input fill (docs/golden-format.md)"},
      {"seed", "1", "case seed"},
  };
  op.make_inputs = [](const Descriptor& d) -> Tensors {
    const QuantCase c = parse_quant_case(d);
    Tensors t = {fill_tensor("input.x", io::format_dtype(c.from), c.shape, d.get("fill"), std::stoull(d.get("seed")), 0)};
    if (!c.dynamic) {
      // The dynamic scales of the same input, then lowered so that some quotients exceed max.
      io::Tensor s = io::make_tensor("input.scale", scale_dtype_of(c.spec), c.layout.scale_shape);
      std::vector<uint8_t> q(static_cast<size_t>(c.layout.n_elems));
      ref::quantize(c.spec, c.from, t[0].data.data(), c.shape, q.data(), s.data.data());
      const Format st = scale_storage(c.spec);
      const size_t es = io::dtype_size(s.dtype);
      for (size_t i = 0; i < static_cast<size_t>(c.layout.n_scales); ++i) {
        if (st == Format::ue8m0) {  // one power of two lower
          if (s.data[i] >= 1 && s.data[i] <= 254) s.data[i] -= 1;
          continue;
        }
        uint64_t bits = 0;
        std::memcpy(&bits, &s.data[es * i], es);
        const uint32_t w = static_cast<uint32_t>(st == Format::f32 ? bits : ref::narrow(st, bits, Format::f32));
        float f;
        std::memcpy(&f, &w, 4);
        // ue8m0 held as f32: halve (exact); f32/bf16/f16: times 0.75, rounded back to the dtype.
        const double lowered = static_cast<double>(f) * (c.spec.scale_dtype == ScaleDtype::ue8m0 ? 0.5 : 0.75);
        uint64_t lb;
        std::memcpy(&lb, &lowered, 8);
        bits = ref::narrow(Format::f64, lb, st);
        std::memcpy(&s.data[es * i], &bits, es);
      }
      // in the case's scale layout
      io::Tensor stored = io::make_tensor("input.scale", stored_dtype_of(c.spec, c.layout),
                                          stored_scales(c.spec, c.layout).shape);
      stored.data = layout_scales(c.spec, c.layout, s.data.data());
      t.push_back(stored);
    }
    return t;
  };
  op.outputs_json = [](const Descriptor& d) {
    const QuantCase c = parse_quant_case(d);
    const std::string dims = dims_json(c.shape.size());
    std::string j = std::string(R"({"output.q": {"role": "data", "format": ")") + format_name(c.spec.to) +
                    R"(", "contract": "exact", "dims": )" + dims + R"(, "scale": ")" +
                    (c.dynamic ? "output.scale" : "input.scale") + "\"}";
    if (c.dynamic) {
      j += std::string(R"(, "output.scale": {"role": "scale", "format": ")") + scale_format_name(c.spec) +
           R"(", "contract": "exact", "of": "output.q", "block": )" + ints_json(c.layout.block);
      if (c.spec.scale_layout != ScaleLayout::row_major)  // stored transformed: the diff reads it back to logical
        j += std::string(R"(, "layout": ")") + to_string(c.spec.scale_layout) + R"(", "logical_shape": )" +
             ints_json(c.layout.scale_shape);
      j += "}";
    }
    return j + "}";
  };
  op.convention = [](const Descriptor& d) { return d.get("convention"); };
  op.models = [](const Descriptor& d) {  // dynamic quantization: which stack's rounding a device output follows
    std::vector<const char*> names;
    for (const QuantConventionInfo& c : quant_conventions()) names.push_back(c.name);
    return key_variants(d, "convention", names);
  };
  op.exact = [](const Descriptor& d, const Tensors& inputs) -> Tensors {
    const QuantCase c = parse_quant_case(d);
    const io::Tensor& x = find_input(d, inputs, "input.x", io::format_dtype(c.from), c.shape);
    io::Tensor e = io::make_tensor("exact.q", io::DType::F64, c.shape);
    std::vector<uint8_t> q(static_cast<size_t>(c.layout.n_elems));
    double* ex = reinterpret_cast<double*>(e.data.data());
    if (c.dynamic) {
      std::vector<uint8_t> s(static_cast<size_t>(c.layout.n_scales) * io::dtype_size(scale_dtype_of(c.spec)));
      ref::quantize(c.spec, c.from, x.data.data(), c.shape, q.data(), s.data(), ex);
    } else {
      const std::vector<uint8_t> sv = logical_input_scales(d, inputs, c.spec, c.layout);
      ref::quantize_static(c.spec, c.from, x.data.data(), c.shape, sv.data(), q.data(), ex);
    }
    return {e};
  };
  return op;
}

std::vector<Kernel> quantize_kernels() {
  return {
      {"quantize", "reference", "ref::quantize (scalar, one group at a time)", quantize_reference},
      {"quantize", "cpu", "cpu::quantize (Highway + OpenMP; the reference for specs it does not vectorise)", quantize_cpu},
      {"dequantize", "reference", "ref::dequantize (scalar)", dequantize_reference},
      {"dequantize", "cpu", "cpu::dequantize (Highway + OpenMP)", dequantize_cpu},
  };
}

OpInfo dequantize_op() {
  OpInfo op;
  op.name = "dequantize";
  op.summary = "x = value(q) · scale (one f32 multiply; bf16/f16 outputs rounded again), per granularity";
  op.params = {
      {"from", "e4m3fn", "the codes' format: e4m3fn, e5m2, e4m3fnuz, e5m2fnuz"},
      {"to", "f32", "output: f32, bf16, f16"},
      {"shape", "64x512", "shape of input.q and output.x"},
      {"granularity", "group:128", "tensor, row, col, group:G, block:BmxBk, mx:32"},
      {"scale-dtype", "f32", "f32, bf16, f16, ue8m0"},
      {"scale-store", "native", "ue8m0: native (E8M0 codes) or f32 (powers of two as f32)"},
      {"tail", "error", "error, partial"},
      {"scale-layout", "row-major", "layout of input.scale: row-major, col-major, tma-aligned, packed-ue8m0"},
      {"fill", "codes:format=e4m3fn", "fill of input.q (docs/golden-format.md)"},
      {"seed", "1", "case seed"},
  };
  op.make_inputs = [](const Descriptor& d) -> Tensors {
    const DequantCase c = parse_dequant_case(d);
    const uint64_t seed = std::stoull(d.get("seed"));
    const io::Tensor logical = random_scales(c.spec, c.layout.scale_shape, seed);
    io::Tensor s = io::make_tensor("input.scale", stored_dtype_of(c.spec, c.layout), stored_scales(c.spec, c.layout).shape);
    s.data = layout_scales(c.spec, c.layout, logical.data.data());
    return {fill_tensor("input.q", io::format_dtype(c.spec.to), c.shape, d.get("fill"), seed, 0), s};
  };
  op.outputs_json = [](const Descriptor& d) {
    const DequantCase c = parse_dequant_case(d);
    return std::string(R"({"output.x": {"role": "data", "format": ")") + format_name(c.out) +
           R"(", "contract": "exact", "dims": )" + dims_json(c.shape.size()) + "}}";
  };
  op.convention = [](const Descriptor&) { return std::string("-"); };
  op.exact = [](const Descriptor& d, const Tensors& inputs) -> Tensors {
    const DequantCase c = parse_dequant_case(d);
    const io::Tensor& q = find_input(d, inputs, "input.q", io::format_dtype(c.spec.to), c.shape);
    const std::vector<uint8_t> sv = logical_input_scales(d, inputs, c.spec, c.layout);
    io::Tensor e = io::make_tensor("exact.x", io::DType::F64, c.shape);
    std::vector<uint8_t> out(static_cast<size_t>(c.layout.n_elems) * 4);
    ref::dequantize(c.spec, q.data.data(), c.shape, sv.data(), Format::f32, out.data(),
                    reinterpret_cast<double*>(e.data.data()));
    return {e};
  };
  return op;
}

}  // namespace fp8ref::golden

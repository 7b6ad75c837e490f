// fp8ref — the `convert` op in the registry: encode (f32/f16/bf16/f64 -> FP8/UE8M0) and decode (FP8 -> f32/f64).
//
//   convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 fill=normal:amax=448 seed=1
//   tensors: input.x [shape] (source dtype), output.y [shape] (target dtype)
// Stochastic rounding draws element i's bits from stochastic_bits(seed, i), seed = the case seed.
#include <cstring>
#include <string>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

struct ConvertCase {
  Format from, to;
  bool decode;
  ConversionSpec spec;
  DecodeSpec dspec;
  std::vector<int64_t> shape;
};

Format format_key(const Descriptor& d, const char* key) {
  Format f;
  if (!parse_format(d.get(key), &f)) throw InputError("descriptor '" + to_string(d) + "': unknown format '" + d.get(key) + "' for " + key);
  return f;
}

ConvertCase parse_case(const Descriptor& d) {
  ConvertCase c;
  c.from = format_key(d, "from");
  c.to = format_key(d, "to");
  c.shape = parse_shape(d.get("shape"));
  c.decode = is_fp8(c.from);
  const std::string& conv = d.get("convention");
  std::string err;
  const std::string where = "descriptor '" + to_string(d) + "': ";
  if (c.decode) {
    if (c.to != Format::f32 && c.to != Format::f64)
      throw InputError(where + "decoding from " + format_name(c.from) + " goes to f32 or f64, not " + format_name(c.to));
    auto ds = resolve_decode(conv, c.from, &err);
    if (!ds) throw InputError(where + err);
    c.dspec = *ds;
    return c;
  }
  auto s = resolve_convention(conv, c.from, c.to, &err);
  if (!s) throw InputError(where + err);
  for (const char* key : {"rounding", "overflow", "nan", "f64-path", "exp-clamp"}) {
    if (d.get(key) != "-" && !apply_override(conv, key, d.get(key), &*s, &err)) throw InputError(where + err);
  }
  s->seed = std::stoull(d.get("seed"));
  c.spec = *s;
  return c;
}

io::Tensor output_tensor(const ConvertCase& c) { return io::make_tensor("output.y", io::format_dtype(c.to), c.shape); }

const io::Tensor& input_x(const Descriptor& d, const Tensors& inputs, const ConvertCase& c) {
  for (const io::Tensor& t : inputs) {
    if (t.name == "input.x") {
      if (t.dtype != io::format_dtype(c.from) || t.shape != c.shape)
        throw InputError("tensor 'input.x': expected " + std::string(io::dtype_name(io::format_dtype(c.from))) + " [" +
                         shape_string(c.shape) + "], got " + io::dtype_name(t.dtype) + " [" + shape_string(t.shape) +
                         "] (descriptor '" + to_string(d) + "')");
      return t;
    }
  }
  throw InputError("missing tensor 'input.x' (descriptor '" + to_string(d) + "')");
}

Tensors run_reference(const Descriptor& d, const Tensors& inputs) {
  const ConvertCase c = parse_case(d);
  const io::Tensor& x = input_x(d, inputs, c);
  io::Tensor y = output_tensor(c);
  const size_t n = static_cast<size_t>(x.numel());
  const size_t in_size = io::dtype_size(x.dtype);
  for (size_t i = 0; i < n; ++i) {
    if (c.decode) {
      if (c.to == Format::f32) {
        const uint32_t b = ref::decode_f32_bits(c.from, x.data[i], c.dspec);
        std::memcpy(&y.data[4 * i], &b, 4);
      } else {
        const uint64_t b = ref::decode_f64_bits(c.from, x.data[i], c.dspec);
        std::memcpy(&y.data[8 * i], &b, 8);
      }
    } else {
      uint64_t bits = 0;
      std::memcpy(&bits, &x.data[in_size * i], in_size);
      y.data[i] = ref::encode(c.from, bits, c.spec, i);
    }
  }
  return {y};
}

Tensors run_cpu(const Descriptor& d, const Tensors& inputs) {
  const ConvertCase c = parse_case(d);
  const io::Tensor& x = input_x(d, inputs, c);
  io::Tensor y = output_tensor(c);
  const size_t n = static_cast<size_t>(x.numel());
  if (c.decode) {
    if (c.to == Format::f32) cpu::decode_f32(c.from, x.data.data(), reinterpret_cast<float*>(y.data.data()), n, c.dspec);
    else cpu::decode_f64(c.from, x.data.data(), reinterpret_cast<double*>(y.data.data()), n, c.dspec);
    return {y};
  }
  switch (c.from) {
    case Format::f32: cpu::encode_f32(reinterpret_cast<const float*>(x.data.data()), y.data.data(), n, c.spec); break;
    case Format::f64: cpu::encode_f64(reinterpret_cast<const double*>(x.data.data()), y.data.data(), n, c.spec); break;
    default:
      cpu::encode_bits16(c.from, reinterpret_cast<const uint16_t*>(x.data.data()), y.data.data(), n, c.spec);
  }
  return {y};
}

std::string dims_json(size_t rank) {
  if (rank == 2) return R"(["row", "col"])";
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? ", \"d" : "\"d") + std::to_string(i) + "\"";
  return s + "]";
}

}  // namespace

OpInfo convert_op() {
  OpInfo op;
  op.name = "convert";
  op.summary = "FP8 / UE8M0 encode from f32/f16/bf16/f64, or decode to f32/f64, under a named convention";
  op.params = {
      {"from", "f32", "source format: f32, f16, bf16, f64 (encode) or an FP8 format (decode)"},
      {"to", "e4m3fn", "target format: an FP8 format (encode) or f32/f64 (decode)"},
      {"shape", "64x128", "shape of input.x and output.y"},
      {"convention", "exact", "conversion convention (fp8ref list)"},
      {"rounding", "-", "override: rne, rz, ru, rd, rna, stochastic"},
      {"overflow", "-", "override: satfinite, saturate, nonsat"},
      {"nan", "-", "override: canonical, keep-sign, payload"},
      {"f64-path", "-", "override: direct, via-f32"},
      {"exp-clamp", "-", "override (ue8m0): LO:HI"},
      {"fill", "normal:amax=448", "input fill (docs/golden-format.md)"},
      {"seed", "1", "case seed (fill and stochastic rounding)"},
  };
  op.make_inputs = [](const Descriptor& d) -> Tensors {
    const ConvertCase c = parse_case(d);
    return {fill_tensor("input.x", io::format_dtype(c.from), c.shape, d.get("fill"), std::stoull(d.get("seed")), 0)};
  };
  op.outputs_json = [](const Descriptor& d) {
    const ConvertCase c = parse_case(d);
    return std::string(R"({"output.y": {"role": "data", "format": ")") + format_name(c.to) +
           R"(", "contract": "exact", "dims": )" + dims_json(c.shape.size()) + "}}";
  };
  op.convention = [](const Descriptor& d) { return d.get("convention"); };
  op.exact_source = [](const Descriptor& d) -> std::optional<Format> {
    const ConvertCase c = parse_case(d);
    if (c.decode) return std::nullopt;  // (exact.y: the code's value, no rounding to model)
    return c.from;
  };
  op.models = [](const Descriptor& d) {  // which conversion a device output follows (encoding only)
    std::vector<std::pair<std::string, Descriptor>> out;
    const ConvertCase c = parse_case(d);
    if (c.decode) return out;
    // every convention defined for the target, then this case's under each other rounding mode (a kernel that
    // truncates, or rounds ties away) — the descriptor's other overrides kept
    const bool ue8m0 = c.to == Format::ue8m0;
    for (const ConventionInfo& ci : conventions())
      if (ue8m0 ? ci.for_ue8m0 : ci.for_fp8) {
        Descriptor x = d;
        x.set("convention", ci.name);
        out.emplace_back(ci.name, x);
      }
    for (const char* r : {"rz", "rd", "ru", "rna"}) {
      Descriptor x = d;
      x.set("rounding", r);
      if (x == d) continue;
      out.emplace_back(d.get("convention") + " rounding=" + r, x);
    }
    return out;
  };
  op.exact = [](const Descriptor& d, const Tensors& inputs) -> Tensors {
    // The exact value being rounded: the source widened to f64 (encode), or the code's value (decode).
    const ConvertCase c = parse_case(d);
    const io::Tensor& x = input_x(d, inputs, c);
    io::Tensor e = io::make_tensor("exact.y", io::DType::F64, c.shape);
    const size_t n = static_cast<size_t>(x.numel()), in_size = io::dtype_size(x.dtype);
    for (size_t i = 0; i < n; ++i) {
      uint64_t bits = 0, out;
      std::memcpy(&bits, &x.data[in_size * i], in_size);
      if (c.decode) {
        const double v = ref::value_of(c.from, x.data[i]);
        std::memcpy(&out, &v, 8);
      } else {
        out = c.from == Format::f64 ? bits : ref::narrow(c.from, bits, Format::f64);
      }
      std::memcpy(&e.data[8 * i], &out, 8);
    }
    return {e};
  };
  return op;
}

std::vector<Kernel> convert_kernels() {
  return {
      {"convert", "reference", "ref::encode / ref::decode (scalar, integer code)", run_reference},
      {"convert", "cpu", "cpu::encode_* / cpu::decode_* (Highway dynamic dispatch + OpenMP)", run_cpu},
  };
}

}  // namespace fp8ref::golden

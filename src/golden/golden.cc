// fp8ref — golden files and result files (schema: docs/golden-format.md), suites.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "golden/ops.h"

#ifndef FP8REF_SOURCE_DIR
#define FP8REF_SOURCE_DIR "."
#endif

namespace fp8ref::golden {

namespace {

std::map<std::string, std::string> metadata_for(const Descriptor& d, const std::string& backend, const Tensors& all) {
  const OpInfo& op = op_info(d.op);
  std::map<std::string, std::string> m;
  m["fp8ref.version"] = kVersion;
  m["fp8ref.op"] = d.op;
  m["fp8ref.descriptor"] = to_string(d);
  m["fp8ref.convention"] = op.convention ? op.convention(d) : "-";
  m["fp8ref.model"] = d.has("model") ? d.get("model") : "-";
  m["fp8ref.seed"] = d.has("seed") ? d.get("seed") : "-";
  m["fp8ref.backend"] = backend;
  m["fp8ref.outputs"] = op.outputs_json(d);
  for (const io::Tensor& t : all) m["fp8ref.sha256." + t.name] = io::sha256_hex(t.data);
  return m;
}

// bound.X of an op is its derived bound B on |output − exact|; the file's bound.X is B + |output.X − exact.X| (the
// golden output's own distance to exact), so that |actual − golden| <= bound.X holds for every actual within B of
// exact — what `fp8ref diff --tol bound` checks. +Inf where the golden output is not finite.
void add_golden_distance(Tensors& exact, const Tensors& outs) {
  auto find = [](const Tensors& ts, const std::string& name) -> const io::Tensor* {
    for (const io::Tensor& t : ts)
      if (t.name == name) return &t;
    return nullptr;
  };
  for (io::Tensor& b : exact) {
    if (b.name.compare(0, 6, "bound.") != 0 || b.numel() == 0) continue;
    const std::string base = b.name.substr(6);
    const io::Tensor* x = find(exact, "exact." + base);
    const io::Tensor* g = find(outs, "output." + base);
    const std::optional<Format> gf = g ? io::dtype_format(g->dtype) : std::nullopt;
    if (!x || !gf || x->numel() != b.numel() || g->numel() != b.numel())
      throw std::logic_error("golden: " + b.name + " without its exact and output tensors");
    const size_t gs = io::dtype_size(g->dtype);
    double* bp = reinterpret_cast<double*>(b.data.data());
    for (int64_t i = 0; i < b.numel(); ++i) {
      uint64_t gb = 0;
      std::memcpy(&gb, &g->data[static_cast<size_t>(i) * gs], gs);
      const uint64_t r = ref::narrow(*gf, gb, Format::f64);
      double rv, xv;
      std::memcpy(&rv, &r, 8);
      std::memcpy(&xv, &x->data[static_cast<size_t>(i) * 8], 8);
      bp[i] += std::isfinite(rv) ? std::fabs(rv - xv) : std::numeric_limits<double>::infinity();
    }
  }
}

}  // namespace

io::SafetensorsFile make_golden(const Descriptor& d) {
  const OpInfo& op = op_info(d.op);
  io::SafetensorsFile f;
  f.tensors = op.make_inputs(d);
  Tensors outs = find_kernel(d.op, "reference").run(d, f.tensors);
  Tensors exact = op.exact ? op.exact(d, f.tensors) : Tensors{};
  add_golden_distance(exact, outs);
  f.tensors.insert(f.tensors.end(), outs.begin(), outs.end());
  f.tensors.insert(f.tensors.end(), exact.begin(), exact.end());
  f.metadata = metadata_for(d, "reference", f.tensors);
  return f;
}

Descriptor case_descriptor(const io::SafetensorsFile& f, const std::string& what) {
  auto it = f.metadata.find("fp8ref.descriptor");
  if (it == f.metadata.end()) throw InputError(what + ": no 'fp8ref.descriptor' in the metadata: not an fp8ref case file");
  try {
    return parse_descriptor(it->second);
  } catch (const InputError& e) {
    throw InputError(what + ": " + e.what());
  }
}

void check_recorded_sha256(const std::map<std::string, std::string>& metadata, const std::string& name,
                           const uint8_t* bytes, size_t size, const std::string& what) {
  auto it = metadata.find("fp8ref.sha256." + name);
  if (it == metadata.end() || io::sha256_hex(bytes, size) == it->second) return;
  throw InputError(what + ": tensor '" + name + "': its bytes do not match the SHA-256 recorded in the file's " +
                   "metadata (fp8ref.sha256." + name + "): the file was damaged or edited after `fp8ref golden` " +
                   "wrote it");
}

Tensors tensors_with_prefix(const io::SafetensorsFile& f, std::string_view prefix) {
  Tensors out;
  for (const io::Tensor& t : f.tensors)
    if (t.name.compare(0, prefix.size(), prefix) == 0) out.push_back(t);
  return out;
}

io::SafetensorsFile run_case(const io::SafetensorsFile& case_file, std::string_view backend, const std::string& what) {
  const Descriptor d = case_descriptor(case_file, what);
  const Kernel& k = find_kernel(d.op, backend);
  Tensors inputs = tensors_with_prefix(case_file, "input.");
  for (const io::Tensor& t : inputs) check_recorded_sha256(case_file.metadata, t.name, t.data.data(), t.data.size(), what);
  // Inputs must have the names, dtypes and shapes the op makes for this descriptor.
  const Tensors expected = op_info(d.op).make_inputs(d);
  for (const io::Tensor& e : expected) {
    const io::Tensor* got = nullptr;
    for (const io::Tensor& t : inputs)
      if (t.name == e.name) got = &t;
    if (!got) throw InputError(what + ": missing tensor '" + e.name + "'");
    if (got->dtype != e.dtype || got->shape != e.shape)
      throw InputError(what + ": tensor '" + e.name + "' is " + io::dtype_name(got->dtype) + " [" +
                       shape_string(got->shape) + "], the descriptor needs " + io::dtype_name(e.dtype) + " [" +
                       shape_string(e.shape) + "]");
  }
  io::SafetensorsFile out;
  try {
    out.tensors = k.run(d, inputs);
  } catch (const InputError& e) {
    throw InputError(what + ": " + e.what());
  }
  out.metadata = metadata_for(d, std::string(backend), out.tensors);
  return out;
}

std::string suites_dir() {
  if (const char* env = std::getenv("FP8REF_SUITES")) return env;
  return std::string(FP8REF_SOURCE_DIR) + "/golden/suites";
}

std::vector<Descriptor> load_suite(const std::string& name_or_path) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.substr(name_or_path.size() - 5) == ".json");
  const std::string path = is_path ? name_or_path : suites_dir() + "/" + name_or_path + ".json";
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open suite '" + name_or_path + "'");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("cases") || !j["cases"].is_array())
    throw InputError(path + ": a suite is {\"name\": ..., \"cases\": [\"<descriptor>\", ...]}");
  std::vector<Descriptor> out;
  size_t i = 0;
  for (const auto& c : j["cases"]) {
    if (!c.is_string()) throw InputError(path + ": case " + std::to_string(i) + " is not a descriptor string");
    try {
      out.push_back(parse_descriptor(c.get<std::string>()));
    } catch (const InputError& e) {
      throw InputError(path + ": case " + std::to_string(i) + ": " + e.what());
    }
    ++i;
  }
  return out;
}

std::string case_file_name(const Descriptor& d) {
  const std::string line = to_string(d);
  return d.op + "-" + io::sha256_hex(reinterpret_cast<const uint8_t*>(line.data()), line.size()).substr(0, 12) +
         ".safetensors";
}

std::string where(const Descriptor& d) { return "descriptor '" + to_string(d) + "': "; }

std::optional<ScaleDtype> scale_dtype_key(const Descriptor& d) {
  if (d.get("scale-dtype") == "-") return std::nullopt;
  ScaleDtype v;
  if (!parse_scale_dtype(d.get("scale-dtype"), &v))
    throw InputError(where(d) + "unknown scale-dtype '" + d.get("scale-dtype") + "' (f32, bf16, f16, ue8m0)");
  return v;
}

const io::Tensor& find_input(const Descriptor& d, const Tensors& inputs, const std::string& name, io::DType dtype,
                             const std::vector<int64_t>& shape) {
  for (const io::Tensor& t : inputs) {
    if (t.name != name) continue;
    if (t.dtype != dtype || t.shape != shape)
      throw InputError("tensor '" + name + "': expected " + io::dtype_name(dtype) + " [" + shape_string(shape) +
                       "], got " + io::dtype_name(t.dtype) + " [" + shape_string(t.shape) + "] (" + where(d) + ")");
    return t;
  }
  throw InputError("missing tensor '" + name + "' (" + where(d) + ")");
}


}  // namespace fp8ref::golden

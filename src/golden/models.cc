// fp8ref — the distance of a device output to each model of its op (fp8ref diff --models; include/fp8ref/golden.h).
//
// A device output that fails the diff against the golden model may still follow another known model rounding by
// rounding (cuBLAS with fast accumulation, a split-K run, DeepGEMM's FMA promotion, another attention kernel's
// softmax). The case of EXPECTED — its descriptor and the input.* tensors it carries, so a case made by another tool
// works too — is run by the cpu backend under every model the op lists (OpInfo::models), and each run is compared
// with ACTUAL bitwise: the share of bit-equal elements, the largest distance on the ordered encodings, and the
// elements whose special-value class differs. Ranked best first; a model that rejects the case is listed with why.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "golden/ops.h"

namespace fp8ref::golden {

namespace {

io::Tensor copy_of(const io::TensorView& v) {
  io::Tensor t;
  t.name = v.name;
  t.dtype = v.dtype;
  t.shape = v.shape;
  t.data.assign(v.bytes, v.bytes + v.size);
  return t;
}

// Sign-magnitude bits -> a monotone integer image of the value, as the diff's own distances count (−0 and +0 the same
// point, so a distance across zero is the same number in the models table as in the diff's report).
int64_t ordered(uint64_t bits, int width) {
  const uint64_t sign = uint64_t{1} << (width - 1);
  const int64_t mag = static_cast<int64_t>(bits & (sign - 1));
  return (bits & sign) ? -mag : mag;
}

bool is_special(Format f, uint64_t bits) {
  if (io::dtype_size(io::format_dtype(f)) == 1) return !std::isfinite(ref::value_of(f, static_cast<uint8_t>(bits)));
  uint64_t w = ref::narrow(f, bits, Format::f64);  // widening: exact
  double d;
  std::memcpy(&d, &w, 8);
  return !std::isfinite(d);
}

// Adds the comparison of one output tensor to *m.
void compare(const io::Tensor& model, const io::TensorView& actual, diff::ModelDistance* m) {
  const std::optional<Format> f = io::dtype_format(model.dtype);
  const size_t es = io::dtype_size(model.dtype);
  const int64_t n = model.numel();
  for (int64_t i = 0; i < n; ++i) {
    uint64_t x = 0, y = 0;
    std::memcpy(&x, model.data.data() + static_cast<size_t>(i) * es, es);
    std::memcpy(&y, actual.bytes + static_cast<size_t>(i) * es, es);
    ++m->elements;
    if (x == y) {
      ++m->equal;
      continue;
    }
    if (f && (is_special(*f, x) || is_special(*f, y))) {
      ++m->special_mismatch;
      continue;
    }
    const int width = static_cast<int>(es * 8);
    const int64_t d = ordered(x, width) - ordered(y, width);
    m->max_ulp = std::max<uint64_t>(m->max_ulp, static_cast<uint64_t>(d < 0 ? -d : d));
  }
}

}  // namespace

std::vector<std::pair<std::string, Descriptor>> key_variants(const Descriptor& d, const char* key,
                                                             const std::vector<const char*>& values) {
  std::vector<std::pair<std::string, Descriptor>> out;
  for (const char* v : values) {
    Descriptor x = d;
    x.set(key, v);
    out.emplace_back(v, x);
  }
  return out;
}

std::vector<diff::ModelDistance> model_distances(const io::MappedSafetensors& expected,
                                                 const io::MappedSafetensors& actual, std::string* note) {
  note->clear();
  auto it = expected.metadata().find("fp8ref.descriptor");
  if (it == expected.metadata().end()) {
    *note = "EXPECTED has no fp8ref.descriptor: no models to run";
    return {};
  }
  const Descriptor base = parse_descriptor(it->second);
  const OpInfo& op = op_info(base.op);
  if (!op.models) {
    *note = std::string("op ") + op.name + " has no alternative models";
    return {};
  }
  io::SafetensorsFile case_file;
  for (const io::TensorView& v : expected.tensors())
    if (v.name.compare(0, 6, "input.") == 0) case_file.tensors.push_back(copy_of(v));
  if (case_file.tensors.empty()) {
    *note = "EXPECTED carries no input.* tensors (a result file, not a golden or case file): no models to run";
    return {};
  }
  std::vector<diff::ModelDistance> rows;
  for (const auto& [name, d] : op.models(base)) {
    diff::ModelDistance m;
    m.name = name;
    m.descriptor = to_string(d);
    m.is_reference = d == base;
    case_file.metadata["fp8ref.descriptor"] = m.descriptor;
    io::SafetensorsFile run;
    try {
      run = run_case(case_file, "cpu", "model " + name);
    } catch (const InputError& e) {
      m.skipped = e.what();
      rows.push_back(m);
      continue;
    }
    bool any = false;
    for (const io::Tensor& t : run.tensors) {
      if (t.name.compare(0, 7, "output.") != 0) continue;
      const io::TensorView* a = actual.find(t.name);
      if (!a || a->dtype != t.dtype || a->shape != t.shape) continue;  // the diff itself reports presence problems
      compare(t, *a, &m);
      any = true;
    }
    if (!any) m.skipped = "ACTUAL has no output tensor of this model's dtype and shape";
    rows.push_back(m);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const diff::ModelDistance& a, const diff::ModelDistance& b) {
    if (a.skipped.empty() != b.skipped.empty()) return a.skipped.empty();
    const double fa = a.elements ? static_cast<double>(a.equal) / static_cast<double>(a.elements) : 0;
    const double fb = b.elements ? static_cast<double>(b.equal) / static_cast<double>(b.elements) : 0;
    if (fa != fb) return fa > fb;
    if (a.special_mismatch != b.special_mismatch) return a.special_mismatch < b.special_mismatch;
    return a.max_ulp < b.max_ulp;
  });
  return rows;
}

}  // namespace fp8ref::golden

// fp8ref — cases, suites, the op registry and golden files (docs/golden-format.md is the schema).
//
// A case is one descriptor line: `op key=value ...` (e.g. `convert from=f32 to=e4m3fn shape=64x128
// convention=torch-2.11 fill=normal:amax=448 seed=1`). The op registry says which keys an op takes (with
// defaults, in canonical order), how to make its inputs, which kernels compute it on which backend, and how to
// read its outputs. Golden generation runs the `reference` backend; `run` runs any registered backend.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8ref/diff.h"
#include "fp8ref/io.h"

namespace fp8ref::golden {

constexpr const char* kVersion = "0.6.0";

// ---- descriptors --------------------------------------------------------------------------------------------
struct Descriptor {
  std::string op;
  std::vector<std::pair<std::string, std::string>> fields;  // in canonical order once canonicalized

  const std::string& get(std::string_view key) const;  // throws InputError if absent
  bool has(std::string_view key) const;
  void set(std::string_view key, std::string value);
  bool operator==(const Descriptor& o) const { return op == o.op && fields == o.fields; }
};

// Parses `op key=value ...`; checks the op exists and every key is one of its keys; fills defaults and puts keys
// in canonical order. Throws InputError naming the problem.
Descriptor parse_descriptor(std::string_view line);
// The canonical line (parse(to_string(d)) == d; to_string(parse(s)) == s for a canonical s).
std::string to_string(const Descriptor& d);
// "fp8ref golden --case '<descriptor>' --out DIR": the repro of a case.
std::string repro_command(const Descriptor& d);

// Shape "64x128" <-> {64, 128}; "" or "-" is a scalar.
std::vector<int64_t> parse_shape(std::string_view s);
std::string shape_string(const std::vector<int64_t>& shape);

// ---- fills --------------------------------------------------------------------------------------------------
// xoshiro256** seeded by splitmix64 — the documented PRNG of every fill.
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream);
  uint64_t next();
  double uniform();  // [0, 1), 53 bits
  double normal();   // Box-Muller
 private:
  uint64_t s_[4];
};

// Fills n source values as doubles (rounded to `format` by the caller's encode), per a fill spec (see
// docs/golden-format.md). Throws InputError for an unknown fill.
std::vector<double> fill_values(std::string_view fill, size_t n, Format source, uint64_t seed, uint64_t stream);
// A tensor of `dtype` holding the fill, each value rounded once (RNE) to the dtype.
io::Tensor fill_tensor(const std::string& name, io::DType dtype, const std::vector<int64_t>& shape,
                       std::string_view fill, uint64_t seed, uint64_t stream);

// ---- registry -----------------------------------------------------------------------------------------------
using Tensors = std::vector<io::Tensor>;

struct Param {
  const char* key;
  const char* default_value;
  const char* help;
};

struct OpInfo {
  const char* name;
  const char* summary;
  std::vector<Param> params;
  // Inputs of a case (named input.*), deterministic in the descriptor.
  std::function<Tensors(const Descriptor&)> make_inputs;
  // The fp8ref.outputs JSON (how the diff reads each output) and the convention/model names.
  std::function<std::string(const Descriptor&)> outputs_json;
  std::function<std::string(const Descriptor&)> convention;
  // Optional: the exact results before each output's final rounding (named exact.*, F64), for the diff.
  std::function<Tensors(const Descriptor&, const Tensors& inputs)> exact;
  // Optional: the deterministic models (conventions, accumulation models) of the op as variants of a case — the
  // same inputs, other model keys. `fp8ref diff --models` runs the case under each and ranks them against ACTUAL.
  std::function<std::vector<std::pair<std::string, Descriptor>>(const Descriptor&)> models;
  // Optional: where exact.* holds an input value as it is (a conversion), its format — the diff then tries double
  // roundings only through formats that value could have been rounded to first (none from a 16-bit source).
  // Unset: exact.* is a computed value (a quotient, a sum) of any precision.
  std::function<std::optional<Format>(const Descriptor&)> exact_source;
};

struct Kernel {
  const char* op;
  const char* backend;  // "reference", "cpu", ...
  const char* name;     // e.g. "ref::encode", "cpu::encode_f32 (Highway AVX3)"
  // Outputs (named output.*) from the inputs.
  std::function<Tensors(const Descriptor&, const Tensors& inputs)> run;
};

const std::vector<OpInfo>& ops();
const OpInfo& op_info(std::string_view name);  // throws InputError
const std::vector<Kernel>& kernels();
const Kernel& find_kernel(std::string_view op, std::string_view backend);  // throws InputError
std::vector<std::string> backends();

// ---- cases and suites ---------------------------------------------------------------------------------------
// The golden file of a case: inputs, reference outputs, metadata (docs/golden-format.md).
io::SafetensorsFile make_golden(const Descriptor& d);
// Runs `backend` on a case file (ours or another tool's: descriptor in metadata + input.* tensors) and returns a
// result file: the outputs plus metadata.
io::SafetensorsFile run_case(const io::SafetensorsFile& case_file, std::string_view backend,
                             const std::string& what);
// fp8ref diff --models: the case of EXPECTED (descriptor + input.* tensors) run by the cpu backend under every model
// of its op (OpInfo::models) and compared bitwise with ACTUAL's output.* tensors; best match first (bit-equal
// fraction, then the largest ULP distance). *note says why nothing was compared (no descriptor, the op has no
// models, a file misses an input). Throws InputError for a malformed EXPECTED.
std::vector<diff::ModelDistance> model_distances(const io::MappedSafetensors& expected,
                                                 const io::MappedSafetensors& actual, std::string* note);
// The descriptor of a case file; throws InputError naming `what` if absent or malformed.
Descriptor case_descriptor(const io::SafetensorsFile& f, const std::string& what);
// The tensor `name` (bytes, size) against the SHA-256 the file's metadata records for it (fp8ref.sha256.<name>,
// written by `fp8ref golden`; nothing to check where none is recorded). InputError naming `what` and the tensor on
// a mismatch: the file was damaged or edited after it was written (`fp8ref diff` checks EXPECTED's tensors, `fp8ref
// run` a case file's inputs).
void check_recorded_sha256(const std::map<std::string, std::string>& metadata, const std::string& name,
                           const uint8_t* bytes, size_t size, const std::string& what);
// Tensors with a given prefix ("input." / "output.").
Tensors tensors_with_prefix(const io::SafetensorsFile& f, std::string_view prefix);

// A suite: a JSON file `golden/suites/NAME.json` ({"name":..., "cases": ["<descriptor>", ...]}) or a path.
std::vector<Descriptor> load_suite(const std::string& name_or_path);
std::string suites_dir();  // the golden/suites directory of this source tree (or $FP8REF_SUITES)

// File name of a case: "<op>-<hash of the descriptor>.safetensors", stable across runs.
std::string case_file_name(const Descriptor& d);

}  // namespace fp8ref::golden

// fp8ref — the numerical diff: judges a result file (ACTUAL) against a golden file (EXPECTED).
//
// Before a verdict other than PASS: EXPECTED's tensors against the SHA-256 its metadata records (fp8ref.sha256.*):
// a golden file damaged or edited since `fp8ref golden` wrote it is bad input (InputError), not a device error. (A
// passing diff does not hash: a device output cannot match a damaged value by chance in practice.)
// Per output tensor (output.*), in this order (docs/golden-format.md is the file schema):
//   1. presence, dtype, shape (missing / extra / dtype / shape mismatch; a 2-D output with its shape reversed is
//      named "transposed", and checked against the transpose of EXPECTED);
//   2. scale tensors (role "scale" in fp8ref.outputs) first, bitwise: each differing block with its index, the
//      data range it covers and the factor actual/expected ("x2 (ue8m0 off by +1)" for powers of two), and
//      whether the wrong scales are other blocks' scales;
//   3. special values by encoding class (NaN, +-Inf, +-0, saturated +-max, finite): counts per class in EXPECTED
//      and ACTUAL, and the confusion table when they differ — before any metric;
//   4. metrics: bitwise-equal fraction; ULP distance = steps on the ordered finite encodings of the tensor's
//      format (-max ... -0 = +0 ... +max; NaN and Inf are classes, never a distance), with its histogram;
//      max/mean absolute and relative error (relative error only where EXPECTED != 0); the worst-K elements;
//   5. structure: mismatches per row (the leading dimensions flattened), per 1x128 group, per 128x128 block,
//      per named dimension (fp8ref.outputs "dims"), per sequence for token rows of a case with
//      input.query_start_loc (paged attention), and a text heatmap;
//   6. a mismatch class per differing element, first match wins:
//        nan_policy      both NaN with different codes, or any difference where the exact value is NaN (a NaN
//                        input: NaN vs +-max, NaN flushed to 0, ...), or where it is +-Inf (an Inf input) and
//                        the two are not an overflow pair
//        overflow        both among +-max, +-Inf and NaN, of different classes, signs agreeing (NaN has none),
//                        and the exact value (when known) beyond max: saturation vs Inf vs NaN
//        scale           (a) the element's block has a differing scale and the dequantized values agree to
//                        within the rounding of both sides, or ACTUAL is +-max / +-Inf / NaN where EXPECTED's
//                        value under ACTUAL's scale lies beyond max (saturated or overflowed by the wrong scale),
//                        or (b) post-pass: every nonzero element of the block (the attached scale's block, else
//                        its 1x128 group) changed by one common factor
//        signed_zero     +0 vs -0
//        tie             the exact value is the midpoint of expected and actual, which are neighbours
//        double_rounding {expected, actual} = {RNE(x), RNE(RNE_F(x))} for F in f32, f16, bf16 (exact needed;
//                        a convert case from f32 tries f16 and bf16 only, one from f16 or bf16 none)
//        subnormal_flush expected subnormal, actual +-0
//        accumulation    |actual - expected| within the derived bound (a bound.<name> F64 tensor in EXPECTED)
//        wrong           anything else
//      exact.<name> (F64, EXPECTED only) enables tie, double_rounding and the exact tests; without it only what
//      the codes alone show is classified;
//   7. the smallest tolerance that would have passed, and the verdict under the tolerance in force;
//   8. trust: MISTRUSTED when EXPECTED is > 90% zeros, > 50% saturated (+-max) or > 50% NaN. A tensor that
//      fails is FAIL whatever its trust; one that passes but is mistrusted is MISTRUSTED (exit 0, not a pass).
//
// Tolerances (--tol):
//   exact           bitwise equal (default for contract "exact")
//   ulp:K[,frac:F]  every element within K ULP (NaN vs NaN of any code and -0 vs +0 are distance 0; any other
//                   class difference fails) and at most a fraction F of the elements not bitwise equal (F = 1)
//   abs:A,rel:R     |actual - expected| <= A + R*|expected| for every element (NaN matches NaN, Inf its own sign)
//   bound           |actual - expected| <= bound.<name> (the op's bound on |output - exact| plus |expected - exact|,
//                   docs/golden-format.md); without one: judged exact, noted.
//                   (default for contract "bound")
//
// Computation: one streaming pass per tensor, OpenMP-parallel over fixed chunks (results do not depend on the
// thread count). Memory beyond the inputs: the counts per row, per index of each dimension and per 128x128 block;
// for the 1x128 groups, no count per group but a summary of at most ~0.5 KB per chunk of 64 Ki elements, plus 4
// bytes per group with >= 2 mismatches and no bitwise-equal nonzero element (the post-pass's candidates); O(K) for
// worst-K. Two 1 GiB one-byte tensors: ~20 MiB with 0.1% of the elements differing at random.
// The inputs are read in place: the MappedSafetensors overload diffs two memory-mapped files without copying a
// byte of tensor data (what `fp8ref diff` uses); the SafetensorsFile overload reads the vectors it is given.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8ref/io.h"

namespace fp8ref::diff {

// ---- tolerances ---------------------------------------------------------------------------------------------
struct Tolerance {
  enum class Kind : uint8_t { exact, ulp, absrel, bound };
  Kind kind = Kind::exact;
  uint64_t ulp = 0;    // ulp: K
  double frac = 1.0;   // ulp: F (fraction of elements allowed to differ at all)
  double abs = 0.0;    // absrel
  double rel = 0.0;    // absrel
  std::string to_string() const;  // "exact", "ulp:1,frac:0.003", "abs:0.5,rel:0.01", "bound"
};
// Parses the --tol grammar above. Throws InputError naming the problem.
Tolerance parse_tolerance(std::string_view text);

// ---- classes ------------------------------------------------------------------------------------------------
enum class ValueClass : uint8_t { nan, pos_inf, neg_inf, pos_zero, neg_zero, pos_max, neg_max, finite };
constexpr int kNumValueClasses = 8;
const char* to_string(ValueClass c);  // "NaN", "+Inf", "-Inf", "+0", "-0", "+max", "-max", "finite"

enum class Mismatch : uint8_t {
  nan_policy, overflow, scale, signed_zero, tie, double_rounding, subnormal_flush, accumulation, wrong
};
constexpr int kNumMismatchClasses = 9;
const char* to_string(Mismatch m);  // "nan_policy", "overflow", "scale", "tie", "double_rounding", ...

enum class Verdict : uint8_t { pass, mistrusted, fail };
const char* to_string(Verdict v);  // "PASS", "MISTRUSTED", "FAIL"

// ---- options ------------------------------------------------------------------------------------------------
struct DiffOptions {
  std::optional<Tolerance> tol;  // nullopt: each tensor's contract default (exact -> exact, bound -> bound)
  size_t top_k = 10;             // worst elements listed per tensor
  int threads = 0;               // 0: OpenMP's default
  int heatmap_rows = 16, heatmap_cols = 64;
  std::string expected_name = "EXPECTED", actual_name = "ACTUAL";  // file names, for messages and the report
};

// ---- the report ---------------------------------------------------------------------------------------------
struct WorstElement {
  uint64_t flat = 0;
  std::vector<int64_t> index;  // multi-dimensional
  uint64_t expected_bits = 0, actual_bits = 0;
  double expected = 0, actual = 0;
  std::optional<double> exact;  // exact.<name> when present
  std::optional<uint64_t> ulp;  // nullopt: no distance (NaN/Inf class differs)
  double abs_err = 0, rel_err = 0;  // NaN when undefined
  Mismatch cls = Mismatch::wrong;
};

struct ScaleBlockDiff {
  uint64_t flat = 0;                                  // index into the scale tensor (= block id)
  std::vector<int64_t> index;                         // multi-dimensional index in the scale tensor
  std::vector<std::pair<int64_t, int64_t>> covers;    // data element range [begin, end) per data dimension
  uint64_t expected_bits = 0, actual_bits = 0;
  double expected = 0, actual = 0;
  double factor = 0;                                  // actual / expected (NaN if undefined)
  std::optional<uint64_t> other_block;                // actual scale == EXPECTED's scale of this other block
  std::vector<int64_t> other_index;                   // its multi-dimensional index
};

struct ScaleSection {
  bool present = false;  // this tensor is a scale tensor, or has one attached (then `tensor` names it)
  bool is_scale = false;
  std::string tensor;    // the scale tensor (for a data tensor) or the data tensor it scales (for a scale tensor)
  std::vector<int64_t> block;
  uint64_t blocks = 0, blocks_differing = 0;
  std::vector<ScaleBlockDiff> listed;  // the first differing blocks (at most 16)
  std::vector<std::pair<double, uint64_t>> factors;  // distinct factors, most frequent first (at most 8)
  uint64_t from_other_block = 0;  // differing blocks whose actual scale is another block's expected scale
  // data tensors: elements in blocks whose scale differs, and how many of their mismatches the scale explains
  uint64_t data_in_differing_blocks = 0, data_explained = 0;
};

struct SpecialsSection {
  uint64_t expected[kNumValueClasses] = {}, actual[kNumValueClasses] = {};
  uint64_t confusion[kNumValueClasses][kNumValueClasses] = {};  // [expected class][actual class]
  bool differ = false;  // some element changed class
};

struct MetricsSection {
  uint64_t numel = 0, bitwise_equal = 0;
  uint64_t no_distance = 0;         // pairs with no ULP distance (NaN/Inf vs another class, NaN codes differ)
  uint64_t incompatible = 0;        // pairs that fail every non-exact tolerance (class differs; NaN-NaN excluded)
  uint64_t max_ulp = 0;
  std::vector<std::pair<std::string, uint64_t>> ulp_histogram;  // "0", "1", "2", "3-4", "5-8", ... (nonzero bins)
  uint64_t finite_pairs = 0;        // both finite: where abs/rel errors are taken
  double max_abs = 0, mean_abs = 0;
  uint64_t max_abs_flat = 0;
  uint64_t rel_pairs = 0;           // both finite and expected != 0
  double max_rel = 0, mean_rel = 0;
  uint64_t max_rel_flat = 0;
  uint64_t rel_undefined = 0;       // expected == 0, actual != 0 (finite)
  std::vector<WorstElement> worst;
};

struct Breakdown {
  std::string name;        // "row", "group 1x128", "block 128x128", or a dimension name
  uint64_t units = 0, units_with_mismatch = 0;
  uint64_t unit_elements = 0;   // elements per unit (0: varies)
  std::vector<std::pair<uint64_t, uint64_t>> top;          // (unit, mismatches), most first (at most 8)
  std::vector<std::pair<int64_t, int64_t>> ranges;         // affected units as inclusive ranges (at most 16)
  bool ranges_truncated = false;
};

struct StructureSection {
  int64_t rows = 0, cols = 0;   // the 2-D view: leading dimensions flattened x last dimension
  std::vector<Breakdown> breakdowns;
  int heat_rows = 0, heat_cols = 0;
  std::vector<std::string> heatmap;  // heat_rows lines of heat_cols chars ('.' none, '1'-'9' tenths, '#' all)
  std::string cell;                  // "each cell: 4 rows x 2 cols"
  std::vector<std::string> notes;    // "actual equals expected transposed", scale-error blocks, ...
};

struct ClassSection {
  uint64_t counts[kNumMismatchClasses] = {};
  bool exact_available = false;
  bool bound_available = false;
  uint64_t scale_blocks = 0;  // blocks the post-pass found off by one common factor
  std::vector<std::string> scale_block_examples;  // "group (row 3, cols 128-255): x0.5"
};

struct TensorReport {
  std::string name;  // "output.y"
  std::string role = "data", format, contract = "exact";
  std::vector<std::string> dims;
  // 1. presence
  enum class Presence : uint8_t { ok, missing, extra, dtype_mismatch, shape_mismatch, transposed };
  Presence presence = Presence::ok;
  std::string expected_dtype, actual_dtype;
  std::vector<int64_t> expected_shape, actual_shape;
  std::string presence_note;
  bool compared = false;  // sections 2-7 are filled
  ScaleSection scale;
  SpecialsSection specials;
  MetricsSection metrics;
  StructureSection structure;
  ClassSection classes;
  // 7. tolerance
  Tolerance tol;
  std::string tol_note;              // e.g. "no derived bound: judged exact"
  std::string min_tolerance;         // "exact", "ulp:1,frac:0.0003", "none (special values differ)"
  std::vector<std::string> min_tolerance_alternatives;  // "abs:0.125,rel:0", "abs:0,rel:0.0625"
  bool tol_pass = true;
  uint64_t tol_violations = 0;
  // 8. trust
  bool mistrusted = false;
  std::string trust_note;  // "zeros 95.0% > 90%" or "zeros 0.1%, saturated 0%, NaN 0%"
  Verdict verdict = Verdict::pass;
  std::string summary;     // the one-line summary
};

// The distance of ACTUAL to one model of the op (fp8ref diff --models; golden::model_distances fills these): the
// case of EXPECTED (its descriptor and input.* tensors) run by the cpu backend under the model, then every output.*
// tensor of ACTUAL compared with that run bitwise.
struct ModelDistance {
  std::string name;        // "hopper-tc --promote never --split-k 2", "vllm-paged-v1"
  std::string descriptor;  // the case under this model (its repro: fp8ref golden --case '<descriptor>')
  std::string skipped;     // why the model did not run on this case (it rejects the case); empty when it ran
  uint64_t elements = 0, equal = 0;  // over every compared output tensor; equal = bitwise
  uint64_t max_ulp = 0;              // largest distance on the ordered encodings (finite pairs)
  uint64_t special_mismatch = 0;     // elements where exactly one of the two is NaN/Inf, or both but different
  bool is_reference = false;         // the model EXPECTED itself was made with
  std::string note;                  // e.g. an output tensor this model stores in another dtype/shape (counted as differing)
};

struct DiffReport {
  std::vector<ModelDistance> models;  // filled on request (fp8ref diff --models), best match first
  std::string models_note;            // why the table is absent or partial
  std::string expected_name, actual_name;
  std::string descriptor;   // EXPECTED's fp8ref.descriptor (may be empty)
  std::string repro;        // the repro command, or empty when EXPECTED has no descriptor
  std::string expected_backend, actual_backend;
  std::vector<TensorReport> tensors;  // scale tensors first, then data tensors, EXPECTED's file order
  Verdict verdict = Verdict::pass;
  int exit_code() const { return verdict == Verdict::fail ? 1 : 0; }
};

// Compares every output.* tensor. Throws InputError for malformed metadata (fp8ref.outputs), an exact.* or
// bound.* tensor that does not match its output, or a scale tensor whose shape does not fit its block.
DiffReport diff_files(const io::SafetensorsFile& expected, const io::SafetensorsFile& actual,
                      const DiffOptions& options = {});
// The same on two memory-mapped files (zero-copy; the report is identical to the one for the files read).
DiffReport diff_files(const io::MappedSafetensors& expected, const io::MappedSafetensors& actual,
                      const DiffOptions& options = {});

// The human-readable report (sections 1-8 per tensor, one summary line per tensor, verdict, repro on failure).
// quiet: only the summary lines, the verdict and the repro.
std::string render_text(const DiffReport& report, bool quiet = false);
// Everything, as one JSON object.
std::string render_json(const DiffReport& report);

}  // namespace fp8ref::diff

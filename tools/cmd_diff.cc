// fp8ref diff — judges a result file against a golden file (include/fp8ref/diff.h has the details).
//
// Both files are read and the whole diff computed before anything is printed or written, so bad input (exit 2)
// leaves no partial report and no --json file.
#include <cstdio>
#include <string>

#include "cli.h"
#include "fp8ref/diff.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref diff EXPECTED ACTUAL [--tol T] [--json FILE] [--top K] [--quiet] [--threads N] [--models WHEN]\n"
    "\n"
    "Compares every output.* tensor of ACTUAL (a result file) with EXPECTED (a golden file), in this order:\n"
    "  1. presence, dtype and shape (a reversed shape is named 'transposed');\n"
    "  2. scale tensors first, bitwise: each differing block, the data it covers, the factor actual/expected;\n"
    "  3. special values by class (NaN, +-Inf, +-0, saturated +-max) and their confusion table;\n"
    "  4. metrics: bitwise-equal fraction, ULP distance on the format's ordered encodings and its histogram,\n"
    "     max/mean abs and rel error, the worst K elements with index, bits, values and exact value;\n"
    "  5. structure: mismatches per row, 1x128 group, 128x128 block and named dimension, with a heatmap;\n"
    "  6. a class per mismatch: nan_policy, overflow, scale, tie, double_rounding, subnormal_flush,\n"
    "     accumulation, wrong (EXPECTED's exact.* tensors make tie and double rounding visible);\n"
    "  7. the smallest tolerance that would have passed, and the verdict under --tol;\n"
    "  8. trust: MISTRUSTED when EXPECTED is > 90% zeros, > 50% saturated or > 50% NaN.\n"
    "A failing diff prints the case's repro line (from EXPECTED's fp8ref.descriptor).\n"
    "\n"
    "Options:\n"
    "  --tol T          exact (default for contract exact) | ulp:K[,frac:F] (within K ULP, at most a fraction F\n"
    "                   not bitwise equal) | abs:A,rel:R (|a-e| <= A + R|e|) | bound (the op's derived bound;\n"
    "                   default for contract bound). Applies to every output tensor.\n"
    "  --json FILE      also write the whole report as JSON to FILE ('-': JSON on stdout instead of the text)\n"
    "  --top K          worst elements listed per tensor (default 10)\n"
    "  --quiet          print only the per-tensor summary lines, the verdict and the repro\n"
    "  --threads N      worker threads (default: OpenMP's)\n"
    "  --models WHEN    auto (default: when the verdict is FAIL) | always | never: run EXPECTED's case (its\n"
    "                   descriptor and inputs) under every model of its op (scaled_mm: exact, f32-kblock both\n"
    "                   ways, hopper-tc promote 128/never x split-K 1-5, mma-sync-sm90; quantize, rmsnorm_quant,\n"
    "                   kv_cache_write, paged_attention: each convention) on the cpu backend and list ACTUAL's\n"
    "                   distance to each, best first: for a\n"
    "                   device output of unknown model, which stack's arithmetic it follows\n"
    "  -h, --help       this help\n"
    "\n"
    "Exit codes: 0 PASS or MISTRUSTED (printed as such), 1 FAIL (a device output missing, extra, of the wrong dtype\n"
    "or shape is a FAIL too: it is the device's result), 2 bad usage or bad input: an unreadable or malformed file, a\n"
    "golden file whose tensors no longer match their recorded SHA-256, the two files swapped (nothing written).\n";

int diff_main(int argc, char** argv) {
  Args args(argc, argv,
            {{"--tol"}, {"--json"}, {"--top"}, {"--quiet", Kind::flag}, {"--threads"}, {"--models"}});
  args.expect_positionals({"EXPECTED", "ACTUAL"});
  const std::string exp_path = args.positionals()[0], act_path = args.positionals()[1];
  diff::DiffOptions opt;
  if (auto t = args.get("--tol")) {
    try {
      opt.tol = diff::parse_tolerance(*t);
    } catch (const InputError& e) {
      throw UsageError(e.what());
    }
  }
  if (auto k = args.get("--top")) opt.top_k = static_cast<size_t>(parse_integer("--top", *k, 0, 100000));
  if (auto n = args.get("--threads")) opt.threads = static_cast<int>(parse_integer("--threads", *n, 1, 4096));
  opt.expected_name = exp_path;
  opt.actual_name = act_path;
  // memory-mapped, zero-copy: the tensors are read in place
  const io::MappedSafetensors expected(exp_path);
  const io::MappedSafetensors actual(act_path);
  const std::string models = args.get("--models").value_or("auto");
  if (models != "auto" && models != "always" && models != "never")
    throw UsageError("--models is auto, always or never, not '" + models + "'");
  diff::DiffReport rep = diff::diff_files(expected, actual, opt);
  bool structure_ok = true;  // (a model's distance means nothing to an output of the wrong shape or dtype)
  for (const diff::TensorReport& t : rep.tensors) structure_ok = structure_ok && t.presence == diff::TensorReport::Presence::ok;
  if (models == "always" || (models == "auto" && rep.verdict == diff::Verdict::fail)) {
    if (structure_ok) rep.models = golden::model_distances(expected, actual, &rep.models_note);
    else rep.models_note = "not run: ACTUAL's outputs differ from EXPECTED's in name, dtype or shape (fix those first)";
  }
  const auto json_path = args.get("--json");
  if (json_path && *json_path == "-") {
    std::fputs(diff::render_json(rep).c_str(), stdout);
  } else {
    if (json_path) {
      const std::string j = diff::render_json(rep);
      io::write_file_atomic(*json_path, reinterpret_cast<const uint8_t*>(j.data()), j.size());
    }
    std::fputs(diff::render_text(rep, args.has("--quiet")).c_str(), stdout);
  }
  std::fflush(stdout);
  return rep.exit_code();
}

}  // namespace

const Command kCmd_diff = {"diff", "judge a result file against a golden file: classes, metrics, structure, verdict",
                           &diff_main, kHelp};

}  // namespace fp8ref::cli

// fp8ref run — the CPU fallback on a case file: what a device runner does on its device.
#include <string>

#include "cli.h"
#include "fp8ref/golden.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref run [--backend reference|cpu] CASE.safetensors -o OUT.safetensors\n"
    "\n"
    "Reads a case file — written by `fp8ref golden`, or by any tool that stores the descriptor in the metadata key\n"
    "fp8ref.descriptor and the input.* tensors (docs/golden-format.md) — runs the op on the chosen backend and\n"
    "writes a result file with the output.* tensors and metadata (fp8ref.backend names the backend). Compare it\n"
    "with `fp8ref diff CASE OUT`.\n"
    "\n"
    "Options:\n"
    "  --backend B     reference (the scalar oracle) or cpu (the fast CPU fallback; default)\n"
    "  -o, --out FILE  the result file (written atomically)\n"
    "  -h, --help      this help\n";

int run(int argc, char** argv) {
  Args args(argc, argv, {{"--backend"}, {"--out", Kind::value, "-o"}});
  args.expect_positionals({"CASE.safetensors"});
  const std::string in = args.positionals()[0];
  const std::string out = args.require("--out");
  const std::string backend = args.get("--backend").value_or("cpu");
  check_paths({in, out}, {1}, {});  // (a result written over its case file would lose the golden outputs)
  const io::SafetensorsFile c = io::read_safetensors(in);
  const io::SafetensorsFile r = golden::run_case(c, backend, in);
  io::write_safetensors(out, r.tensors, r.metadata);
  return 0;
}

}  // namespace

const Command kCmd_run = {"run", "run a backend on a case file and write the result file", &run, kHelp};

}  // namespace fp8ref::cli

// fp8ref validate — golden + run + diff for a suite on one backend.
#include <string>

#include "cli.h"
#include "validate.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref validate --suite NAME|FILE.json [--backend cpu|reference] [--out DIR] [--quiet]\n"
    "\n"
    "For each case of the suite: the golden file from the reference backend, the chosen backend run on it, and\n"
    "`fp8ref diff` of the two — all through files, as a device team's flow. Prints one table (case, backend,\n"
    "verdict, bitwise-equal %, max ULP, mismatch classes) and a repro line for every failing case.\n"
    "Exit 0 when no case fails, 1 when one does, 2 on bad input.\n"
    "\n"
    "Options:\n"
    "  --suite NAME    smoke, full (golden/suites/), or a suite JSON file\n"
    "  --backend B     backend to check (default cpu)\n"
    "  --out DIR       keep the case and result files there (default: temporary, removed)\n"
    "  --quiet         only the summary line and the repro lines of failures\n"
    "  -h, --help      this help\n";

int run(int argc, char** argv) {
  Args args(argc, argv, {{"--suite"}, {"--backend"}, {"--out"}, {"--quiet", Kind::flag}});
  args.expect_positionals({});
  return validate_suite(args.require("--suite"), args.get("--backend").value_or("cpu"), args.get("--out").value_or(""),
                        args.has("--quiet"));
}

}  // namespace

const Command kCmd_validate = {"validate", "golden + run + diff over a suite, one summary table", &run, kHelp};

}  // namespace fp8ref::cli

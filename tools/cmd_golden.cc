// fp8ref golden — write golden case files (inputs, reference outputs, provenance) for a suite or one case.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref golden (--suite NAME|FILE.json | --case \"<descriptor>\" ...) --out DIR [--shard I/N] [--quiet]\n"
    "\n"
    "Writes one safetensors file per case into DIR: the inputs (input.*), the expected outputs of the reference\n"
    "backend (output.*, scales included), the exact pre-rounding values (exact.*) where the op has them, and\n"
    "metadata (fp8ref version, op, descriptor, convention, model, seed, sha256 per tensor). The schema is\n"
    "docs/golden-format.md. File names are <op>-<hash of the descriptor>.safetensors, so a case always lands in\n"
    "the same file. A progress bar is drawn on a terminal; otherwise one summary line is printed.\n"
    "\n"
    "Options:\n"
    "  --suite NAME      a suite of golden/suites/ (smoke, full) or a suite JSON file\n"
    "  --case DESC       one case by its descriptor line (repeatable)\n"
    "  --out DIR         output directory (created if missing)\n"
    "  --shard I/N       only cases i with i % N == I (0-based), for splitting a suite over processes\n"
    "  --quiet           print nothing on success\n"
    "  -h, --help        this help\n"
    "\n"
    "Example:\n"
    "  fp8ref golden --case 'convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11' --out cases/\n";

std::pair<int, int> parse_shard(const std::string& s) {
  const size_t slash = s.find('/');
  try {
    if (slash != std::string::npos) {
      const int i = std::stoi(s.substr(0, slash)), n = std::stoi(s.substr(slash + 1));
      if (n > 0 && i >= 0 && i < n) return {i, n};
    }
  } catch (...) {
  }
  throw UsageError("--shard takes I/N with 0 <= I < N, got '" + s + "'");
}

int run(int argc, char** argv) {
  Args args(argc, argv, {{"--suite"}, {"--case", Kind::repeat}, {"--out"}, {"--shard"}, {"--quiet", Kind::flag}});
  args.expect_positionals({});
  const std::string out = args.require("--out");
  std::vector<golden::Descriptor> cases;
  if (auto suite = args.get("--suite")) cases = golden::load_suite(*suite);
  for (const std::string& c : args.all("--case")) cases.push_back(golden::parse_descriptor(c));
  if (cases.empty()) throw UsageError("give --suite NAME or --case \"<descriptor>\"");
  auto [shard, shards] = args.get("--shard") ? parse_shard(*args.get("--shard")) : std::pair<int, int>{0, 1};
  if (mkdir(out.c_str(), 0777) != 0 && errno != EEXIST) throw InputError(out + ": cannot create directory");
  struct stat st;
  if (stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw InputError(out + ": not a directory");
  const bool tty = isatty(fileno(stderr)) && !args.has("--quiet");
  size_t written = 0, total = 0;
  for (size_t i = 0; i < cases.size(); ++i)
    if (static_cast<int>(i % shards) == shard) ++total;
  for (size_t i = 0; i < cases.size(); ++i) {
    if (static_cast<int>(i % shards) != shard) continue;
    const io::SafetensorsFile f = golden::make_golden(cases[i]);
    io::write_safetensors(out + "/" + golden::case_file_name(cases[i]), f.tensors, f.metadata);
    ++written;
    if (tty) {
      const int width = 40, done = static_cast<int>(width * written / total);
      std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu %s", done, "########################################", width - done,
                   "", written, total, cases[i].op.c_str());
      std::fflush(stderr);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  if (!args.has("--quiet")) std::printf("wrote %zu case file%s to %s\n", written, written == 1 ? "" : "s", out.c_str());
  return 0;
}

}  // namespace

const Command kCmd_golden = {"golden", "write golden case files for a suite or a descriptor", &run, kHelp};

}  // namespace fp8ref::cli

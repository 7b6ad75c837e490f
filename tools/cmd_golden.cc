// fp8ref golden — write golden case files (inputs, reference outputs, provenance) for a suite or one case.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "cli.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"

namespace fp8ref::cli {
namespace {

const char* kHelp =
    "Usage: fp8ref golden (--suite NAME|FILE.json | --case \"<descriptor>\" ...) --out DIR [--shard I/N] [--quiet]\n"
    "\n"
    "Writes one safetensors file per case into DIR: the inputs (input.*), the expected outputs of the reference\n"
    "backend (output.*, scales included), the exact pre-rounding values (exact.*) where the op has them, and\n"
    "metadata (fp8ref version, op, descriptor, convention, model, seed, sha256 per tensor). The schema is\n"
    "docs/golden-format.md. File names are <op>-<hash of the descriptor>.safetensors, so a case always lands in\n"
    "the same file; a case given twice is written once. All the case files or none: a case that cannot be made\n"
    "(a bad descriptor, a shape too large for memory) is named by its suite file and index, and nothing is written.\n"
    "A progress bar is drawn on a terminal; otherwise one summary line is printed.\n"
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
  std::vector<std::string> origin;  // where each case came from, for its errors
  if (auto suite = args.get("--suite")) {
    cases = golden::load_suite(*suite);
    for (size_t i = 0; i < cases.size(); ++i) origin.push_back("suite " + *suite + ", case " + std::to_string(i));
    if (cases.empty()) throw InputError("suite " + *suite + " has no cases");
  }
  for (const std::string& c : args.all("--case")) {
    cases.push_back(golden::parse_descriptor(c));
    origin.push_back("--case '" + c + "'");  // (as typed: no canonical form repeated after it)
  }
  if (cases.empty()) throw UsageError("give --suite NAME or --case \"<descriptor>\"");
  auto [shard, shards] = args.get("--shard") ? parse_shard(*args.get("--shard")) : std::pair<int, int>{0, 1};
  const bool created = mkdir(out.c_str(), 0777) == 0;
  if (!created && errno != EEXIST) throw InputError(out + ": cannot create directory: " + std::strerror(errno));
  struct stat st;
  if (stat(out.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) throw InputError(out + ": not a directory");
  const bool tty = isatty(fileno(stderr)) && !args.has("--quiet");
  // this shard's cases, each file once (a descriptor given twice is one case)
  std::vector<size_t> mine;
  std::set<std::string> names;
  for (size_t i = 0; i < cases.size(); ++i)
    if (static_cast<int>(i % shards) == shard && names.insert(golden::case_file_name(cases[i])).second) mine.push_back(i);
  const size_t total = mine.size();
  size_t written = 0;
  // All the case files or none: each is written to a temporary file beside its name as it is made, and all are
  // renamed into place once every case has been made; a case that fails names itself and leaves nothing behind.
  io::OutputFiles files;
  for (size_t i : mine) {
    try {
      const io::SafetensorsFile f = golden::make_golden(cases[i]);
      files.add(out + "/" + golden::case_file_name(cases[i]), io::encode_safetensors(f.tensors, f.metadata));
    } catch (const std::exception& e) {  // (InputError, and std::bad_alloc for a case too large for this machine)
      if (tty) std::fprintf(stderr, "\n");
      files.discard();
      if (created) rmdir(out.c_str());  // (only if still empty)
      const std::string why = dynamic_cast<const std::bad_alloc*>(&e) ? "out of memory" : e.what();
      const bool typed = origin[i].rfind("--case", 0) == 0;
      throw InputError(origin[i] + (typed ? "" : " ('" + golden::to_string(cases[i]) + "')") + ": " + why +
                       "; no case file written");
    }
    ++written;
    if (tty) {
      const int width = 40, done = static_cast<int>(width * written / total);
      std::fprintf(stderr, "\r[%.*s%*s] %zu/%zu %s", done, "########################################", width - done,
                   "", written, total, cases[i].op.c_str());
      std::fflush(stderr);
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  files.commit();
  if (!args.has("--quiet")) std::printf("wrote %zu case file%s to %s\n", written, written == 1 ? "" : "s", out.c_str());
  return 0;
}

}  // namespace

const Command kCmd_golden = {"golden", "write golden case files for a suite or a descriptor", &run, kHelp};

}  // namespace fp8ref::cli

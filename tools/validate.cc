// fp8ref validate — golden + run + diff over a suite in one process, one summary table.
#include "validate.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fp8ref/diff.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"

namespace fp8ref::cli {

namespace {

std::string make_temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/fp8ref-validate-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw InputError("cannot create a temporary directory under " + tmpl);
  return tmpl;
}

void remove_tree(const std::string& dir, const std::vector<std::string>& files) {
  for (const std::string& f : files) std::remove(f.c_str());
  rmdir(dir.c_str());
}

std::string class_counts(const diff::DiffReport& r) {
  uint64_t counts[diff::kNumMismatchClasses] = {};
  for (const auto& t : r.tensors)
    for (int c = 0; c < diff::kNumMismatchClasses; ++c) counts[c] += t.classes.counts[c];
  std::string s;
  for (int c = 0; c < diff::kNumMismatchClasses; ++c) {
    if (!counts[c]) continue;
    s += (s.empty() ? "" : " ") + std::string(diff::to_string(static_cast<diff::Mismatch>(c))) + ":" +
         std::to_string(counts[c]);
  }
  return s.empty() ? "-" : s;
}

}  // namespace

int validate_suite(const std::string& suite, const std::string& backend, const std::string& keep_dir, bool quiet) {
  const auto cases = golden::load_suite(suite);
  golden::find_kernel(cases.empty() ? "convert" : cases[0].op, backend);  // unknown backend: error before work
  const bool temp = keep_dir.empty();
  const std::string dir = temp ? make_temp_dir() : keep_dir;
  if (!temp && mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST) throw InputError(dir + ": cannot create directory");
  std::vector<std::string> written;
  int failed = 0, mistrusted = 0;
  std::vector<std::string> repros;
  const auto t0 = std::chrono::steady_clock::now();
  if (!quiet)
    std::printf("%-4s %-9s %-10s %9s %7s  %-34s %s\n", "#", "backend", "verdict", "bitwise", "maxULP", "classes",
                "case");
  try {
    for (size_t i = 0; i < cases.size(); ++i) {
      const golden::Descriptor& d = cases[i];
      const std::string case_path = dir + "/" + golden::case_file_name(d);
      const std::string result_path = case_path.substr(0, case_path.size() - 12) + "." + backend + ".safetensors";
      const io::SafetensorsFile g = golden::make_golden(d);
      io::write_safetensors(case_path, g.tensors, g.metadata);
      written.push_back(case_path);
      // The device flow: read the case file back, run, write the result, read both, diff.
      const io::SafetensorsFile c = io::read_safetensors(case_path);
      const io::SafetensorsFile r = golden::run_case(c, backend, case_path);
      io::write_safetensors(result_path, r.tensors, r.metadata);
      written.push_back(result_path);
      diff::DiffOptions opt;
      opt.expected_name = case_path;
      opt.actual_name = result_path;
      const diff::DiffReport rep = diff::diff_files(c, io::read_safetensors(result_path), opt);
      uint64_t numel = 0, equal = 0, max_ulp = 0;
      for (const auto& t : rep.tensors) {
        numel += t.metrics.numel;
        equal += t.metrics.bitwise_equal;
        if (t.metrics.max_ulp > max_ulp) max_ulp = t.metrics.max_ulp;
      }
      failed += rep.verdict == diff::Verdict::fail;
      mistrusted += rep.verdict == diff::Verdict::mistrusted;
      if (rep.verdict == diff::Verdict::fail) repros.push_back(golden::repro_command(d));
      if (!quiet) {
        std::printf("%-4zu %-9s %-10s %8.4f%% %7llu  %-34s %s\n", i, backend.c_str(), diff::to_string(rep.verdict),
                    numel ? 100.0 * static_cast<double>(equal) / static_cast<double>(numel) : 100.0,
                    static_cast<unsigned long long>(max_ulp), class_counts(rep).c_str(), golden::to_string(d).c_str());
        if (rep.verdict == diff::Verdict::fail) std::printf("     repro: %s\n", golden::repro_command(d).c_str());
      }
    }
  } catch (...) {
    if (temp) remove_tree(dir, written);
    throw;
  }
  if (temp) remove_tree(dir, written);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\n%zu cases: %zu passed, %d mistrusted, %d failed (backend %s, suite %s, %.2f s)%s\n", cases.size(),
              cases.size() - failed - mistrusted, mistrusted, failed, backend.c_str(), suite.c_str(), secs,
              temp ? "" : (", files in " + dir).c_str());
  if (quiet)
    for (const auto& r : repros) std::printf("repro: %s\n", r.c_str());
  return failed ? 1 : 0;
}

}  // namespace fp8ref::cli

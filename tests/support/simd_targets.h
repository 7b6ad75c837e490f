// The SIMD targets a test runs the cpu backend on (cpu::for_each_simd_target pins every backend's dispatch).
// Release builds: every target compiled in and supported here. Under AddressSanitizer (`make sanitize`), only the
// first (the best, what the dispatch picks anyway) and the last (the most portable) — the sanitizer run checks memory,
// not dispatch, the Release run covers every target, and all five under ASan cost ~5 minutes of `make test`'s 20.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "support/sanitizer.h"

namespace fp8ref::test {

// Runs fn on each test target (above) and returns the names of those it ran on.
inline std::vector<std::string> for_test_targets(const std::function<void()>& fn) {
  if (!FP8REF_TEST_ASAN) return cpu::for_each_simd_target(fn);
  const size_t n = cpu::for_each_simd_target([] {}).size();
  std::vector<std::string> ran;
  size_t i = 0;
  cpu::for_each_simd_target([&] {
    if (i == 0 || i + 1 == n) {
      ran.push_back(cpu::simd_target());
      fn();
    }
    ++i;
  });
  return ran;
}

}  // namespace fp8ref::test

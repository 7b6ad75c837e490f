// Random differential testing, cpu backend == reference (tests/support/backend_diff.h): random byte strings from
// fixed seeds, each one case (op, convention, overrides, formats, shape, SIMD target, data). FP8REF_DIFF_INPUTS=N
// runs N inputs instead of the default (a longer search: tens of thousands take minutes); FP8REF_DIFF_SEED=S
// changes the seed. A failure prints the input's bytes; FP8REF_DIFF_HEX=<those bytes> replays that one input.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "support/backend_diff.h"
#include "support/sanitizer.h"

namespace {

size_t env_or(const char* name, size_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<size_t>(std::strtoull(v, nullptr, 10)) : dflt;
}

std::string hex(const std::vector<uint8_t>& b) {
  std::string s;
  char t[4];
  for (uint8_t c : b) {
    std::snprintf(t, sizeof t, "%02x", c);
    s += t;
  }
  return s;
}

}  // namespace

TEST_CASE("backend diff: cpu == reference on random cases of every op (tests/support/backend_diff.h)") {
  if (const char* h = std::getenv("FP8REF_DIFF_HEX")) {  // replay one input (the bytes a failure printed)
    std::vector<uint8_t> bytes;
    for (const char* p = h; p[0] && p[1]; p += 2) bytes.push_back(static_cast<uint8_t>(std::stoul(std::string(p, 2), nullptr, 16)));
    const std::string d = fp8ref::test::diff_backends(bytes.data(), bytes.size());
    CHECK_MESSAGE(d.empty(), d);
    return;
  }
  const size_t inputs = env_or("FP8REF_DIFF_INPUTS", FP8REF_TEST_ASAN ? 250 : 1000);
  std::mt19937_64 rng(env_or("FP8REF_DIFF_SEED", 20261207));
  size_t failures = 0;
  for (size_t i = 0; i < inputs && failures < 5; ++i) {
    std::vector<uint8_t> bytes(64);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    const std::string d = fp8ref::test::diff_backends(bytes.data(), bytes.size());
    if (!d.empty()) {
      ++failures;
      FAIL_CHECK("input ", i, " (bytes ", hex(bytes), "): ", d);
    }
  }
  const auto& c = fp8ref::test::diff_counts();
  MESSAGE(inputs, " inputs: compared quantize ", c.compared[0], ", rmsnorm_quant ", c.compared[1], ", kv_cache_write ",
          c.compared[2], ", paged_attention ", c.compared[3], ", scaled_mm/bmm ", c.compared[4], ", golden files ", c.compared[5], "; refused by both ", c.refused);
  // not vacuous: every kind of case ran both backends and compared them, each about 1 in 6–15 inputs
  for (int k = 0; k < 6; ++k) CHECK_MESSAGE(c.compared[k] >= inputs / 100, "kind ", k, " compared only ", c.compared[k]);
}

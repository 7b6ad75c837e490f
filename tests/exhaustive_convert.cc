// Exhaustive sweeps (ctest label "exhaustive"): the CPU fast path against the reference on every input —
// all 2^32 f32 bit patterns, all 2^16 f16 and bf16 patterns — for every distinct spec that a convention
// resolves to, and for every rounding mode. Inputs are generated in registers (cpu::encode_f32_range); the
// reference is evaluated through its exact run table (see the f32 test case).
#include <doctest/doctest.h>
#include <omp.h>

#include <chrono>
#include <cstring>
#include <random>
#include <cstdio>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "support/rle.h"
#include "support/simd_targets.h"

using namespace fp8ref;

namespace {

struct Sweep {
  std::string label;
  ConversionSpec spec;
};

// Distinct specs for a source format: every convention, then each rounding mode on top of ocp-sat/ocp-nosat
// (fp8) or cuda-nosat (ue8m0). Specs that resolve identically for this source are swept once.
std::vector<Sweep> sweeps_for(Format from) {
  std::vector<Sweep> out;
  auto add = [&](const std::string& label, const ConversionSpec& s) {
    for (const Sweep& w : out) {
      ConversionSpec a = w.spec, b = s;
      if (from != Format::f64) a.f64_path = b.f64_path;  // irrelevant for this source
      if (a == b) return;
    }
    out.push_back({label, s});
  };
  for (Format to : all_formats()) {
    if (!is_fp8(to)) continue;
    for (const ConventionInfo& c : conventions()) {
      std::string err;
      auto s = resolve_convention(c.name, from, to, &err);
      if (s) add(std::string(c.name) + "->" + format_name(to), *s);
    }
    const char* bases[] = {"ocp-sat", "ocp-nosat", "torch-2.11", "cuda-nosat", "cuda-satfinite"};
    for (const char* b : bases) {
      std::string err;
      auto s = resolve_convention(b, from, to, &err);
      if (!s || s->ue8m0_method != Ue8m0Method::value) continue;
      for (Rounding r : {Rounding::rz, Rounding::ru, Rounding::rd, Rounding::rna, Rounding::stochastic}) {
        ConversionSpec t = *s;
        t.rounding = r;
        t.seed = 0x5EED;
        add(std::string(b) + "+" + to_string(r) + "->" + format_name(to), t);
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("exhaustive: all 2^32 f32 inputs, cpu == reference, every convention and rounding mode") {
  // The reference is evaluated through its run table (tests/support/rle.h: sampled every 2^12 patterns and
  // bisected to the exact boundaries, then spot-checked on 2^22 random patterns); the fast path is evaluated
  // on every one of the 2^32 patterns and compared with the expanded table.
  const std::vector<Sweep> sweeps = sweeps_for(Format::f32);
  constexpr uint64_t kChunk = uint64_t{1} << 24;
  std::vector<uint8_t> got(kChunk), want(kChunk);
  double total_s = 0;
  int swept = 0;
  for (const Sweep& w : sweeps) {
    const auto t0 = std::chrono::steady_clock::now();
    INFO(w.label, " ", w.spec.describe());
    if (w.spec.rounding == Rounding::stochastic) {
      // Not piecewise constant: every input of 64 windows of 2^20 patterns spread over the range, against the
      // reference element by element (random bits keyed by the pattern, as cpu::encode_f32_range does).
      uint64_t bad = 0;
      for (uint64_t k = 0; k < 64; ++k) {
        const uint64_t begin = (k * 0x04000000u + 0x01234000u * (k & 1)) & 0xFFF00000u;
        cpu::encode_f32_range(begin, begin + (1u << 20), w.spec, got.data());
#pragma omp parallel for reduction(+ : bad)
        for (long long i = 0; i < (1 << 20); ++i)
          bad += got[i] != ref::encode(Format::f32, begin + i, w.spec, begin + i);
      }
      CHECK(bad == 0);
      continue;
    }
    const auto runs = test::runs_of([&](uint64_t x) { return ref::encode(Format::f32, x, w.spec, x); }, 32);
    std::mt19937_64 rng(swept);
    uint64_t rle_bad = 0;
    for (int i = 0; i < (1 << 22); ++i) {
      const uint64_t x = rng() & 0xFFFFFFFFu;
      rle_bad += test::code_at(runs, x) != ref::encode(Format::f32, x, w.spec, x);
    }
    REQUIRE_MESSAGE(rle_bad == 0, "the run table of the reference is unsound for ", w.label);
    uint64_t mismatches = 0, first_bad = ~uint64_t{0};
    for (uint64_t begin = 0; begin < (uint64_t{1} << 32); begin += kChunk) {
      cpu::encode_f32_range(begin, begin + kChunk, w.spec, got.data());
      test::expand(runs, begin, kChunk, want.data());
      if (std::memcmp(got.data(), want.data(), kChunk) != 0) {
        for (uint64_t i = 0; i < kChunk; ++i) {
          if (got[i] != want[i]) {
            if (first_bad == ~uint64_t{0}) first_bad = begin + i;
            ++mismatches;
          }
        }
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    total_s += s;
    ++swept;
    std::printf("  f32 sweep %-42s %5zu runs %6.2f s  mismatches %llu\n", w.label.c_str(), runs.size(), s,
                static_cast<unsigned long long>(mismatches));
    INFO("first mismatch at f32 bits ", test::hex(first_bad), ": expected (reference) ",
         test::hex(first_bad == ~uint64_t{0} ? 0 : ref::encode(Format::f32, first_bad, w.spec, first_bad), 2));
    CHECK(mismatches == 0);
  }
  std::printf("  %d full f32 sweeps, %.1f s in all (%d threads, SIMD target %s)\n", swept, total_s,
              omp_get_max_threads(), cpu::simd_target());
}

TEST_CASE("exhaustive: all 2^16 f16 and bf16 inputs, cpu == reference, every SIMD target") {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (Format from : {Format::f16, Format::bf16}) {
    for (const Sweep& w : sweeps_for(from)) {
      std::vector<uint8_t> want(65536);
      for (uint32_t i = 0; i < 65536; ++i) want[i] = ref::encode(from, i, w.spec, i);
      INFO(format_name(from), " ", w.label, " ", w.spec.describe());
      const auto targets = fp8ref::test::for_test_targets([&] {
        std::vector<uint8_t> out(65536);
        cpu::encode_bits16(from, all.data(), out.data(), all.size(), w.spec);
        int bad = 0;
        for (uint32_t i = 0; i < 65536; ++i) bad += out[i] != want[i];
        INFO("SIMD target ", cpu::simd_target());
        CHECK(bad == 0);
      });
      CHECK(!targets.empty());
    }
  }
}

// Exhaustive (ctest label "exhaustive"): cpu::rsqrt_rn, the CPU backend's correctly rounded 1/sqrt(u) (an f64
// estimate, the reference's exact comparisons near f32 rounding boundaries), against ref::rsqrt_rn for every f32 u in
// [1, 4). That covers every positive u: u·4^k gives the estimate d·2^-k exactly (f64 neither overflows nor underflows
// here, subnormal u included), the same bits below d's f32 significand, and the exact result scaled alike.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "fp8ref/rmsnorm.h"

using namespace fp8ref;

namespace {
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
}  // namespace

TEST_CASE("cpu::rsqrt_rn equals ref::rsqrt_rn for every f32 in [1, 4), so for every positive f32") {
  uint64_t mismatches = 0, f32_estimate_off = 0;
  for (uint32_t b = bits(1.0f); b < bits(4.0f); ++b) {
    const float u = from_bits(b);
    const float want = ref::rsqrt_rn(u);
    mismatches += bits(cpu::rsqrt_rn(u)) != bits(want);
    f32_estimate_off += bits(1.0f / std::sqrt(u)) != bits(want);  // (a live comparison: f32 arithmetic is often off)
  }
  CHECK(mismatches == 0);
  CHECK(f32_estimate_off > 1000);
}

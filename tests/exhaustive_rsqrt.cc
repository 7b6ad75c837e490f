// Exhaustive (ctest label "exhaustive"): cpu::rsqrt_rn, the CPU backend's correctly rounded 1/sqrt(u) (an f64
// estimate, the reference's exact comparisons near f32 rounding boundaries), against ref::rsqrt_rn for every f32 u in
// [1, 4). That covers every positive u: u·4^k gives the estimate d·2^-k exactly (f64 neither overflows nor underflows
// here, subnormal u included), the same bits below d's f32 significand, and the exact result scaled alike.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>

#include "fp8ref/format.h"
#include "fp8ref/rmsnorm.h"

using namespace fp8ref;

TEST_CASE("cpu::rsqrt_rn equals ref::rsqrt_rn for every f32 in [1, 4), so for every positive f32") {
  uint64_t mismatches = 0, f32_estimate_off = 0;
  for (uint32_t b = bits_of_f32(1.0f); b < bits_of_f32(4.0f); ++b) {
    const float u = f32_from_bits(b);
    const float want = ref::rsqrt_rn(u);
    mismatches += bits_of_f32(cpu::rsqrt_rn(u)) != bits_of_f32(want);
    // (a live comparison: the f32 estimate is often off)
    f32_estimate_off += bits_of_f32(1.0f / std::sqrt(u)) != bits_of_f32(want);
  }
  CHECK(mismatches == 0);
  CHECK(f32_estimate_off > 1000);
}

// Exhaustive (ctest label "exhaustive"): the e4m3fn cast in lanes that the vector group quant and rmsnorm_quant
// kernels apply to clamped magnitudes (src/cpu/fp8_lanes-inl.h, CastE4m3Mag), on every f32 bit pattern from +0 to
// 448 (1.14·10^9), on each compiled SIMD target. Oracle: the codes walked up the sorted values by the RNE midpoints
// of ref::value_of (cpu::cast_e4m3_failures). The oracle with ties to odd is checked to disagree at exactly the 126
// midpoints, so the count is live.
#include <doctest/doctest.h>

#include <string>

#include "fp8ref/quant.h"
#include "support/simd_targets.h"

using namespace fp8ref;

TEST_CASE("the e4m3fn cast in lanes is RNE for every f32 magnitude in [+0, 448], on every SIMD target") {
  std::string names;
  for (const std::string& t : fp8ref::test::for_test_targets([] {
         CHECK(cpu::cast_e4m3_failures(0, 0x43E00001u) == 0);
       }))
    names += t + " ";
  MESSAGE("SIMD targets checked: ", names);
  // live: every midpoint between two codes below 448 is an f32 value; ties to odd move each of them
  CHECK(cpu::cast_e4m3_failures(0, 0x43E00001u, true) == 126);
}

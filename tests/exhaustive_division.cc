// Exhaustive (ctest label "exhaustive"): the premise of the one-correction division in the vector quantize kernels
// (src/cpu/fp8_lanes-inl.h, MarksteinDiv1). For y with 8 (bf16) or 11 (f16) significant bits, q1 = RN(q0 + RN(y −
// a·q0)·b), q0 = RN(y·b), b = RN(1/a), equals the IEEE quotient RN(y/a) for every y mantissa and every a mantissa
// (2^30 and 2^33 pairs): exponents only shift every step within the kernels' range ([2^-60, 2^60]). The oracle is
// the hardware's correctly rounded division. The zero-correction quotient is checked to fail on the same inputs, so
// the count is live.
#include <doctest/doctest.h>

#include "fp8ref/quant.h"

using namespace fp8ref;

TEST_CASE("one FMA correction divides bf16 and f16 values exactly, for every scale mantissa") {
  if (cpu::division_failures(8, 1, 0, 1) < 0) {
    MESSAGE("no FMA on this target: the kernels divide");
    return;
  }
  CHECK(cpu::division_failures(8, 0, 0, 1u << 16) > 0);  // RN(y·RN(1/a)) alone is often one ulp off
  CHECK(cpu::division_failures(8, 1, 0, 1u << 23) == 0);
  CHECK(cpu::division_failures(11, 1, 0, 1u << 23) == 0);
}

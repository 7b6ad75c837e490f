// Exhaustive (ctest label "exhaustive"): rmsnorm_quant's AVX2 bf16 roundings by Veltkamp's split
// (src/cpu/rmsnorm_quant_cpu.cc SplitBf16Avx2, of an f32 and of RN(a1·w)) equal the integer RNE (b + 0x7FFF + lsb) on
// every f32 of their range — ±0 and 2^-126 <= |a| < 2^111 — and on RN(a1·w) of every pair of finite bf16 values there;
// on subnormal inputs they keep the sign and a nonzero value in (0, 2^-126] (the premise of NormWeightBf16Fast's flush
// argument). Oracle: the integer rounding (RoundBf16NoNanAvx2, the AVX2 path's rounding before; tests/
// test_rmsnorm_quant.cc holds it to the reference). Live: the split with C = 2^15 + 1 (9 bits kept) fails on ~2·10^9
// of the values (C = 2^16 + 3 passes: it splits the same); session 37's product form g = RN(a1·(w·C)),
// g − RN(g − a1·w) fails on 173,889,962 pairs (a product below 2^-150 gave +0 for −0).
#include <doctest/doctest.h>

#include <string>

#include "fp8ref/rmsnorm.h"
#include "support/simd_targets.h"

using namespace fp8ref;

TEST_CASE("rmsnorm_quant's AVX2 bf16 rounding by Veltkamp's split is RNE on every f32 and bf16 product of its range") {
  int ran = 0;
  std::string names;
  for (const std::string& t : fp8ref::test::for_test_targets([&] {
         int64_t checked = 0;
         const int64_t bad = cpu::bf16_split_failures(0, uint64_t{1} << 32, false, &checked);
         if (bad < 0) return;  // not an AVX2 target
         ++ran;
         CHECK(bad == 0);
         // ±0 and every f32 with a biased exponent in [1, 237]: 2·(237·2^23 + 1)
         CHECK(checked == 2 * (int64_t{237} << 23) + 2 + 2 * ((int64_t{1} << 23) - 1));  // + the subnormals
         int64_t pc = 0;
         CHECK(cpu::bf16_split_failures(0, uint64_t{1} << 32, true, &pc) == 0);
         CHECK(pc == 3571530120);  // (counted by this sweep: the finite pairs whose RN(a1·w) is below 2^111)
       }))
    names += t + " ";
  MESSAGE("SIMD targets checked: ", names, "(AVX2 ran: ", ran, ")");
  // where this CPU runs the AVX2 target, the sweeps ran on it (not skipped as "not an AVX2 target")
  CHECK((ran == 1) == (names.find("AVX2") != std::string::npos));
}

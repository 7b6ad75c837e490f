// The mma-sync-sm90 simulator (include/fp8ref/mma.h, reference/mma_ref.cc) against H200 hardware tiles
// (tests/data/h200/mma_sm90/<fa>_<fb>/, made by tools/device/capture_mma.py on an H200: the oracle), bit for bit,
// plus hand-derived cases of the model's steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fp8ref/mma.h"

using namespace fp8ref;

namespace {

uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }
float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }

// The code of an exactly representable value (RNE encode of an exact value is the value's code).
uint8_t code_of(Format f, double v) {
  ConversionSpec s;
  s.to = f;
  return ref::encode_f64(v, s);
}

const char* kKinds[] = {"narrow", "wide", "cancel", "spread", "subnorm", "special", "cspecial", "zerosign"};

struct Capture {
  io::Tensor a, bt, c, d, kind;
};

Capture load(const std::string& dir) {
  const std::string base = std::string(FP8REF_TEST_DATA) + "/h200/mma_sm90/" + dir + "/";
  return {io::read_npy(base + "A.npy"), io::read_npy(base + "BT.npy"), io::read_npy(base + "C.npy"),
          io::read_npy(base + "D.npy"), io::read_npy(base + "kind.npy")};
}

}  // namespace

TEST_CASE("mma-sync-sm90 reproduces every H200 tile bit for bit") {
  struct Pair {
    const char* dir;
    Format fa, fb;
  };
  for (const Pair& pr : {Pair{"e4m3fn_e4m3fn", Format::e4m3fn, Format::e4m3fn}, Pair{"e5m2_e5m2", Format::e5m2, Format::e5m2},
                         Pair{"e4m3fn_e5m2", Format::e4m3fn, Format::e5m2}, Pair{"e5m2_e4m3fn", Format::e5m2, Format::e4m3fn}}) {
    const std::string dir = pr.dir;
    CAPTURE(dir);
    const Capture cap = load(pr.dir);
    REQUIRE(cap.a.shape.size() == 3);
    const size_t T = static_cast<size_t>(cap.a.shape[0]);
    REQUIRE(cap.a.shape == std::vector<int64_t>{int64_t(T), 16, 32});
    REQUIRE(cap.bt.shape == std::vector<int64_t>{int64_t(T), 8, 32});
    REQUIRE(cap.d.shape == std::vector<int64_t>{int64_t(T), 16, 8});
    std::vector<float> d(T * 128);
    ref::mma_m16n8k32(MmaModel::sm90_mma_sync, pr.fa, pr.fb, cap.a.data.data(), cap.bt.data.data(),
                      reinterpret_cast<const float*>(cap.c.data.data()), d.data(), T);
    size_t mismatches = 0, per_kind_n[8] = {}, per_kind_bad[8] = {};
    for (size_t i = 0; i < T * 128; ++i) {
      uint32_t hw;
      std::memcpy(&hw, &cap.d.data[4 * i], 4);
      const int kind = cap.kind.data[i / 128];
      ++per_kind_n[kind];
      if (bits_of(d[i]) != hw) {
        ++per_kind_bad[kind];
        if (++mismatches <= 5) {
          uint32_t cb;
          std::memcpy(&cb, &cap.c.data[4 * i], 4);
          char buf[160];
          std::snprintf(buf, sizeof buf, "%s tile %zu (%s) element %zu: model 0x%08x hardware 0x%08x c 0x%08x",
                        pr.dir, i / 128, kKinds[kind], i % 128, bits_of(d[i]), hw, cb);
          MESSAGE(std::string(buf));
        }
      }
    }
    std::string summary = dir + " matches per tile kind:";
    for (int k = 0; k < 8; ++k)
      if (per_kind_n[k])
        summary += " " + std::string(kKinds[k]) + " " + std::to_string(per_kind_n[k] - per_kind_bad[k]) + "/" +
                   std::to_string(per_kind_n[k]);
    CHECK_MESSAGE(mismatches == 0, summary);
  }
}

TEST_CASE("mma-sync-sm90 model steps, hand-derived") {
  const Format F = Format::e4m3fn;
  uint8_t a[32] = {}, b[32] = {};
  SUBCASE("exact sum, then one RNE add of C") {
    for (int k = 0; k < 32; ++k) {
      a[k] = code_of(F, 1.0);
      b[k] = code_of(F, k % 2 ? 0.5 : 2.0);
    }
    // 16·2 + 16·0.5 = 40 exactly; + 2^-20 rounds to nearest (40 + 2^-20 is not an f32: ulp(40) = 2^-18)
    CHECK(ref::mma_sm90_element(F, F, a, b, 0.0f) == 40.0f);
    CHECK(ref::mma_sm90_element(F, F, a, b, std::ldexp(1.0f, -20)) == 40.0f);
    CHECK(ref::mma_sm90_element(F, F, a, b, std::ldexp(3.0f, -20)) == 40.0f + std::ldexp(1.0f, -18));
  }
  SUBCASE("terms below the grid 2^(e-25) are truncated toward zero, in their own block") {
    // k = 0 (P1): 448·448 = 200704 = 1.53125·2^17, nominal exponent 8 + 8 = 16, grid 2^-9.
    a[0] = code_of(F, 448.0);
    b[0] = code_of(F, 448.0);
    // k = 1 (P1): 2^-9 · 2^-3 = 2^-12: below the grid, dropped.  k = 2 (P2): same value, but block 2's
    // exponent is H1's (17), grid 2^-8: dropped too.  k = 4 (P1): 2^-9 · 2^0 = 2^-9 = one grid step: kept.
    a[1] = code_of(F, std::ldexp(1.0, -9));
    b[1] = code_of(F, 0.125);
    a[2] = a[1];
    b[2] = b[1];
    CHECK(ref::mma_sm90_element(F, F, a, b, 0.0f) == 200704.0f);
    a[4] = code_of(F, std::ldexp(1.0, -9));
    b[4] = code_of(F, 1.0);
    // 200704 + 2^-9 needs 27 bits: block 1 is exact on its grid, then RZ to 24 bits -> 200704.
    CHECK(ref::mma_sm90_element(F, F, a, b, 0.0f) == 200704.0f);
    // A negative small term truncates toward zero on the magnitude, then the sum is cut to 24 bits (RZ):
    // 200704 - 2^-9 -> 200703.984375 (the f32 just below 200704 is 200703.984375 = 200704 - 2^-6).
    b[4] = code_of(F, -1.0);
    CHECK(ref::mma_sm90_element(F, F, a, b, 0.0f) == 200703.984375f);
  }
  SUBCASE("C is added by an IEEE f32 add, never aligned") {
    CHECK(ref::mma_sm90_element(F, F, a, b, std::ldexp(1.0f, -140)) == std::ldexp(1.0f, -140));  // subnormal kept
    CHECK(std::signbit(ref::mma_sm90_element(F, F, a, b, -0.0f)) == false);  // +0 (empty sum) + -0 = +0
    a[0] = code_of(F, 2.0);
    b[0] = code_of(F, 3.0);
    CHECK(ref::mma_sm90_element(F, F, a, b, -6.0f) == 0.0f);
  }
  SUBCASE("NaN and Inf") {
    a[3] = 0x7F;  // e4m3fn NaN
    b[3] = code_of(F, 1.0);
    CHECK(bits_of(ref::mma_sm90_element(F, F, a, b, 1.0f)) == 0x7FFFFFFFu);
    const Format E = Format::e5m2;
    uint8_t x[32] = {}, y[32] = {};
    x[0] = 0x7C;  // +Inf
    y[0] = code_of(E, 1.0);
    CHECK(ref::mma_sm90_element(E, E, x, y, 1.0f) == INFINITY);
    CHECK(bits_of(ref::mma_sm90_element(E, E, x, y, -INFINITY)) == 0x7FFFFFFFu);
    y[0] = 0x00;  // Inf · 0
    CHECK(bits_of(ref::mma_sm90_element(E, E, x, y, 1.0f)) == 0x7FFFFFFFu);
    const uint8_t z[32] = {};
    CHECK(bits_of(ref::mma_sm90_element(E, E, z, z, f32_of(0x7FA12345u))) == 0x7FFFFFFFu);  // C's payload is not kept
  }
}

TEST_CASE("mma-sync-sm90 rejects other formats") {
  std::vector<uint8_t> a(512), b(256);
  std::vector<float> c(128), d(128);
  CHECK_THROWS_AS(ref::mma_m16n8k32(MmaModel::sm90_mma_sync, Format::e4m3fnuz, Format::e4m3fn, a.data(), b.data(),
                                    c.data(), d.data(), 1),
                  InputError);
  MmaModel m;
  CHECK(parse_mma_model("mma-sync-sm90", &m));
  CHECK(!parse_mma_model("mma-sync-sm89", &m));
}

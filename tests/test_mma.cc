// The mma-sync-sm90 simulator (include/fp8ref/mma.h, reference/mma_ref.cc) against H200 hardware tiles
// (tests/data/h200/mma_sm90/<fa>_<fb>/, made by tools/device/capture_mma.py on an H200: the oracle), bit for bit,
// plus hand-derived cases of the model's steps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
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

// ---- hmma16: mma.sync m16n8k16 with bf16/f16 operands, as Triton's tl.dot builds it ----------------------------

namespace {

template <class T>
std::vector<T> npy_values(const std::string& path, std::vector<int64_t>* shape) {
  const io::Tensor t = io::read_npy(path);
  *shape = t.shape;
  std::vector<T> v(t.data.size() / sizeof(T));
  std::memcpy(v.data(), t.data.data(), v.size() * sizeof(T));
  return v;
}

float half_value(Format f, uint16_t b) { return ref::load_f32(f, &b, 0); }

}  // namespace

TEST_CASE("hmma16_dot reproduces Triton's tl.dot on an H100 (mma.sync m16n8k16 bf16 and f16), every output") {
  // tests/data/h200/triton_dot/ (tools/device/capture_triton_dot.py): D = tl.dot(A[16, K], B[K, 16], C) per tile.
  const std::string base = std::string(FP8REF_TEST_DATA) + "/h200/triton_dot/";
  int64_t total = 0;
  for (const char* name : {"rand", "acc", "spread", "cancel", "attn", "f16"}) {
    CAPTURE(name);
    const Format f = std::string(name) == "f16" ? Format::f16 : Format::bf16;
    std::vector<int64_t> sa, sb, sc, sd;
    const auto a = npy_values<uint16_t>(base + name + "_a.npy", &sa);
    const auto b = npy_values<uint16_t>(base + name + "_b.npy", &sb);
    const auto c = npy_values<float>(base + name + "_c.npy", &sc);
    const auto d = npy_values<uint32_t>(base + name + "_d.npy", &sd);
    REQUIRE(sa.size() == 3);
    const int64_t T = sa[0], K = sa[2];
    REQUIRE(sb == std::vector<int64_t>{T, K, 16});
    REQUIRE(sd == std::vector<int64_t>{T, 16, 16});
    int bad = 0, bad_k8 = 0, bad_fma = 0;
    std::vector<float> x(static_cast<size_t>(K)), y(static_cast<size_t>(K));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < 16; ++i)
        for (int64_t j = 0; j < 16; ++j) {
          for (int64_t k = 0; k < K; ++k) {
            x[static_cast<size_t>(k)] = half_value(f, a[static_cast<size_t>((t * 16 + i) * K + k)]);
            y[static_cast<size_t>(k)] = half_value(f, b[static_cast<size_t>((t * K + k) * 16 + j)]);
          }
          const size_t o = static_cast<size_t>((t * 16 + i) * 16 + j);
          const uint32_t want = d[o];
          if (bits_of(ref::hmma16_dot(f, x.data(), y.data(), K, c[o])) != want && bad++ < 5)
            MESSAGE("tile " << t << " (" << i << ", " << j << "): GPU " << f32_of(want));
          // controls: steps of 8 k instead of 16; f32 FMAs in order
          float h = c[o], r = c[o];
          for (int64_t k = 0; k < K; k += 8) h = ref::hmma16_step(f, &x[static_cast<size_t>(k)], &y[static_cast<size_t>(k)], 8, h);
          for (int64_t k = 0; k < K; ++k) r = std::fma(x[static_cast<size_t>(k)], y[static_cast<size_t>(k)], r);
          bad_k8 += bits_of(h) != want;
          bad_fma += bits_of(r) != want;
          ++total;
        }
    CHECK(bad == 0);
    CHECK(bad_k8 > T * 256 / 5);
    CHECK(bad_fma > T * 256 / 5);
  }
  CHECK(total == 6 * 16 * 256);
}

TEST_CASE("hmma16_step: the model's steps, hand-derived") {
  const Format bf = Format::bf16;
  // one term: exact (the grid 2^(e-25) is far below its 8 bits)
  float a[16] = {1.5f}, b[16] = {3.0f};
  CHECK(ref::hmma16_step(bf, a, b, 1, 0.0f) == 4.5f);
  // a small term against a large accumulator: truncated onto 2^(e-25) toward zero, then the sum to 24 bits
  a[0] = 1.0f;
  b[0] = 0x1p-30f;
  CHECK(ref::hmma16_step(bf, a, b, 1, 1.0f) == 1.0f);             // 2^-30 < the grid 2^-25: dropped
  b[0] = 0x1.8p-24f;                                                 // 3 grid units, kept by the sum ...
  CHECK(ref::hmma16_step(bf, a, b, 1, 1.0f) == 1.0f);             // ... 1 + 0.75 ulp truncated (RN: 1 + 2^-23)
  b[0] = -0x1.8p-24f;
  CHECK(ref::hmma16_step(bf, a, b, 1, 1.0f) == 1.0f - 0x1p-23f);  // 1 − 3·2^-25 toward zero (ulp 2^-24 there)
  // nominal exponents: 1.5·1.5 = 2.25 counts as 2^0, so the grid is 2^-25 and each of 15 terms 1.5·2^-25 keeps one
  // unit: 2.25 + 15·2^-25 -> 2.25 + 2^-22 (with the product's true exponent, 2^1, they would all be dropped)
  a[0] = 1.5f;
  b[0] = 1.5f;
  for (int k = 1; k < 16; ++k) {
    a[k] = 1.0f;
    b[k] = 0x1.8p-25f;
  }
  CHECK(ref::hmma16_step(bf, a, b, 16, 0.0f) == 2.25f + 0x1p-22f);
  // cancellation to zero gives +0; NaN and Inf
  a[0] = 2.0f;
  b[0] = 1.0f;
  a[1] = -2.0f;
  b[1] = 1.0f;
  const float z = ref::hmma16_step(bf, a, b, 2, 0.0f);
  CHECK((z == 0.0f && !std::signbit(z)));
  a[1] = INFINITY;
  CHECK(std::isinf(ref::hmma16_step(bf, a, b, 2, 0.0f)));
  b[1] = 0.0f;
  CHECK(std::isnan(ref::hmma16_step(bf, a, b, 2, 0.0f)));
}

TEST_CASE("hmma16_step's fast path equals the model's literal steps, bf16 and f16, over many magnitudes") {
  std::mt19937 rng(20261206);
  std::uniform_int_distribution<int> ex(-30, 30), kind(0, 19), len(1, 16);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int64_t checked = 0, bad = 0;
  for (Format f : {Format::bf16, Format::f16}) {
    const int lo = f == Format::f16 ? -14 : -130, hi = f == Format::f16 ? 15 : 120;
    std::uniform_int_distribution<int> wide(lo, hi);
    auto draw = [&](bool big) {
      const int k = kind(rng);
      float x = std::ldexp(nd(rng), big ? wide(rng) : ex(rng));
      if (k == 0) x = 0.0f;
      if (k == 1) x = -0.0f;
      if (k == 2) x = std::ldexp(1.0f, big ? wide(rng) : ex(rng));
      return ref::round_through(f, x);
    };
    for (int it = 0; it < 200000; ++it) {
      const bool big = it % 4 == 0;
      float a[16], b[16];
      const int n = len(rng);
      for (int k = 0; k < n; ++k) {
        a[k] = draw(big);
        b[k] = draw(big);
      }
      float c = it % 3 == 0 ? 0.0f : std::ldexp(nd(rng), big ? wide(rng) : ex(rng));
      if (it % 7 == 0) c = a[0] * b[0] * -1.0f;  // cancellations
      const uint32_t x = bits_of(ref::hmma16_step(f, a, b, n, c)), y = bits_of(ref::hmma16_step_literal(f, a, b, n, c));
      if (x != y && bad++ < 5) MESSAGE("n " << n << " c " << c << ": " << f32_of(x) << " vs " << f32_of(y));
      ++checked;
    }
  }
  CHECK(checked == 400000);
  CHECK(bad == 0);
}

TEST_CASE("hmma16_dot_kw4 reproduces Triton's tl.dot of fp8-converted operands on an H100 (vLLM's S = Q·K and P·V)") {
  // tests/data/h200/triton_dot_fp8/ (tools/device/capture_triton_dot_fp8.py): K and V converted from e4m3fn codes in
  // registers, S = RN32(scale·tl.dot(Q, K)) over the head dim 128, A = tl.dot(RN_dt(P), V) over a tile of 32 keys.
  const std::string base = std::string(FP8REF_TEST_DATA) + "/h200/triton_dot_fp8/";
  for (const char* name : {"f16", "bf16"}) {
    CAPTURE(name);
    const Format f = std::string(name) == "f16" ? Format::f16 : Format::bf16;
    std::vector<int64_t> sh;
    const auto q = npy_values<uint16_t>(base + name + "_q.npy", &sh);
    const int64_t R = sh[0], D = sh[2];
    const auto k8 = npy_values<uint8_t>(base + name + "_k.npy", &sh);
    const int64_t T = sh[2];
    const auto v8 = npy_values<uint8_t>(base + name + "_v.npy", &sh);
    const auto sc = npy_values<float>(base + name + "_scales.npy", &sh);
    const auto S = npy_values<uint32_t>(base + name + "_s.npy", &sh);
    const auto P = npy_values<float>(base + name + "_p.npy", &sh);
    const auto A = npy_values<uint32_t>(base + name + "_a.npy", &sh);
    REQUIRE(sc.size() == 3);
    auto deq = [&](uint8_t code, float s) { return ref::round_through(f, ref::decode_f32(Format::e4m3fn, code) * s); };
    int s_bad = 0, s_inorder = 0, a_bad = 0, a_inorder = 0;
    std::vector<float> x(static_cast<size_t>(D)), y(static_cast<size_t>(D));
    for (int64_t r = 0; r < R; ++r)
      for (int64_t i = 0; i < 16; ++i) {
        for (int64_t t = 0; t < T; ++t) {  // S[i][t] over the head dim
          for (int64_t d = 0; d < D; ++d) {
            x[static_cast<size_t>(d)] = half_value(f, q[static_cast<size_t>((r * 16 + i) * D + d)]);
            y[static_cast<size_t>(d)] = deq(k8[static_cast<size_t>((r * D + d) * T + t)], sc[0]);
          }
          const uint32_t want = S[static_cast<size_t>((r * 16 + i) * T + t)];
          s_bad += bits_of(sc[2] * ref::hmma16_dot_kw4(f, x.data(), y.data(), D, 0.0f)) != want;
          s_inorder += bits_of(sc[2] * ref::hmma16_dot(f, x.data(), y.data(), D, 0.0f)) != want;
        }
        for (int64_t d = 0; d < D; ++d) {  // A[i][d] over the tile's keys
          for (int64_t t = 0; t < T; ++t) {
            x[static_cast<size_t>(t)] = ref::round_through(f, P[static_cast<size_t>((r * 16 + i) * T + t)]);
            y[static_cast<size_t>(t)] = deq(v8[static_cast<size_t>((r * T + t) * D + d)], sc[1]);
          }
          const uint32_t want = A[static_cast<size_t>((r * 16 + i) * D + d)];
          a_bad += bits_of(ref::hmma16_dot_kw4(f, x.data(), y.data(), T, 0.0f)) != want;
          a_inorder += bits_of(ref::hmma16_dot(f, x.data(), y.data(), T, 0.0f)) != want;
        }
      }
    CHECK(R * 16 * T == 8192);
    CHECK(s_bad == 0);
    CHECK(a_bad == 0);
    CHECK(s_inorder > 8192 / 4);          // the control: in order, as 16-bit loads go
    CHECK(a_inorder > 16 * 16 * 128 / 100);
  }
}

TEST_CASE("hmma16_kw4_step: the order's steps") {
  int64_t base = -1;
  int kidx[16];
  CHECK(ref::hmma16_kw4_step(16, 0, &base, kidx) == 16);  // one step up to 16 k
  CHECK((base == 0 && kidx[15] == 15));
  CHECK(ref::hmma16_kw4_step(16, 1, &base, kidx) == -1);
  CHECK(ref::hmma16_kw4_step(80, 0, &base, kidx) == 16);  // k mod 4 in {0, 1}: 0, 1, 4, 5, ...
  CHECK((base == 0 && kidx[0] == 0 && kidx[1] == 1 && kidx[2] == 4 && kidx[15] == 29));
  CHECK(ref::hmma16_kw4_step(80, 1, &base, kidx) == 16);  // then 2, 3, 6, 7, ...
  CHECK((kidx[0] == 2 && kidx[15] == 31));
  CHECK(ref::hmma16_kw4_step(80, 4, &base, kidx) == 8);   // the last block: 64..79, zero past 80
  CHECK((base == 64 && kidx[7] == 13));
  CHECK(ref::hmma16_kw4_step(80, 6, &base, kidx) == -1);
}

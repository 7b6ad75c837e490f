// Conversions: named edge cases (the table of NUMERICS.md §2 / research fp8-formats §2.5), the rounding modes,
// UE8M0 conventions, decode, and the CPU backend against the reference on adversarial and random inputs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "support/simd_targets.h"

using namespace fp8ref;

namespace {

ConversionSpec conv(const char* name, Format to, Format from = Format::f32) {
  std::string err;
  auto s = resolve_convention(name, from, to, &err);
  REQUIRE_MESSAGE(s.has_value(), err);
  return *s;
}

uint32_t f2b(float f) { return fp8ref::bits_of_f32(f); }
float b2f(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint64_t d2b(double f) {
  uint64_t b;
  std::memcpy(&b, &f, 8);
  return b;
}

uint8_t enc(const char* c, Format to, float x) { return ref::encode_f32(x, conv(c, to)); }
uint8_t enc_bits(const char* c, Format to, uint32_t b) { return ref::encode(Format::f32, b, conv(c, to)); }

// The CPU backend on one value must equal the reference.
uint8_t cpu_one(const ConversionSpec& s, float x) {
  uint8_t out = 0;
  cpu::encode_f32(&x, &out, 1, s);
  return out;
}

}  // namespace

TEST_SUITE("convert") {
  TEST_CASE("round_through: bf16 by its integer RNE and f16 equal narrow's two roundings, every 4099th f32 and the edges") {
    int bad = 0;
    auto check = [&](uint32_t b) {
      const float x = f32_from_bits(b);
      for (Format f : {Format::bf16, Format::f16}) {  // (f32: x itself)
        const uint64_t want = ref::narrow(f, ref::narrow(Format::f32, b, f), Format::f32);
        if (bits_of_f32(ref::round_through(f, x)) != static_cast<uint32_t>(want) && bad++ < 5)
          MESSAGE("bits " << b << " to " << std::string(format_name(f)));
      }
    };
    for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 4099) check(static_cast<uint32_t>(b));
    for (uint32_t e : {0x00000000u, 0x00008000u, 0x00018000u, 0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0x7F800000u,
                       0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x3F808000u, 0x3F818000u, 0x007FFFFFu, 0x00808000u})
      for (uint32_t s : {0u, 0x80000000u}) check(e | s);
    CHECK(bad == 0);
  }

  TEST_CASE("format table") {
    CHECK(ref::value_of(Format::e4m3fn, 0x7E) == 448.0);
    CHECK(ref::value_of(Format::e5m2, 0x7B) == 57344.0);
    CHECK(ref::value_of(Format::e4m3fnuz, 0x7F) == 240.0);
    CHECK(ref::value_of(Format::e5m2fnuz, 0x7F) == 57344.0);
    CHECK(ref::value_of(Format::e4m3fn, 0x01) == std::ldexp(1.0, -9));
    CHECK(ref::value_of(Format::e5m2, 0x01) == std::ldexp(1.0, -16));
    CHECK(ref::value_of(Format::e4m3fnuz, 0x01) == std::ldexp(1.0, -10));
    CHECK(ref::value_of(Format::e5m2fnuz, 0x01) == std::ldexp(1.0, -17));
    CHECK(ref::value_of(Format::ue8m0, 0x00) == std::ldexp(1.0, -127));
    CHECK(ref::value_of(Format::ue8m0, 0xFE) == std::ldexp(1.0, 127));
    CHECK(classify_code(Format::e4m3fn, 0x7F) == CodeClass::nan);
    CHECK(classify_code(Format::e4m3fn, 0x80) == CodeClass::zero);
    CHECK(classify_code(Format::e5m2, 0x7C) == CodeClass::inf);
    CHECK(classify_code(Format::e5m2, 0xFD) == CodeClass::nan);
    CHECK(classify_code(Format::e4m3fnuz, 0x80) == CodeClass::nan);
    CHECK(classify_code(Format::ue8m0, 0xFF) == CodeClass::nan);
    Format f;
    CHECK(parse_format("float8_e4m3fn", &f));
    CHECK(f == Format::e4m3fn);
    CHECK_FALSE(parse_format("e3m4", &f));
  }

  TEST_CASE("every finite code round-trips through f32 under every convention") {
    for (Format to : fp8_element_formats()) {
      for (const ConventionInfo& c : conventions()) {
        std::string err;
        auto s = resolve_convention(c.name, Format::f32, to, &err);
        if (!s) continue;
        for (int code = 0; code < 256; ++code) {
          const CodeClass k = classify_code(to, static_cast<uint8_t>(code));
          if (k == CodeClass::nan || k == CodeClass::inf) continue;
          const float v = static_cast<float>(ref::value_of(to, static_cast<uint8_t>(code)));
          uint8_t expect = static_cast<uint8_t>(code);
          if (to == Format::e4m3fnuz || to == Format::e5m2fnuz) expect = code == 0x80 ? 0 : expect;
          INFO(c.name, " ", format_name(to), " code ", code);
          CHECK(ref::encode_f32(v, *s) == expect);
          CHECK(cpu_one(*s, v) == expect);
        }
      }
    }
  }

  TEST_CASE("e4m3fn overflow and specials per convention (research table 2.5)") {
    const Format F = Format::e4m3fn;
    // 464 is the tie between 448 and the would-be 480: even -> 448.
    for (const char* c : {"torch-2.11", "cuda-satfinite", "cuda-nosat", "ml_dtypes", "ocp-sat", "ocp-nosat"}) {
      INFO(c);
      CHECK(enc(c, F, 460.f) == 0x7E);
      CHECK(enc(c, F, 464.f) == 0x7E);
      CHECK(enc(c, F, -0.0f) == 0x80);
      CHECK(enc(c, F, std::ldexp(1.f, -10)) == 0x00);   // tie to 0
      CHECK(enc(c, F, -std::ldexp(1.f, -10)) == 0x80);
      CHECK(enc(c, F, std::ldexp(1.f, -10) * (1 + std::ldexp(1.f, -23))) == 0x01);
      CHECK(enc(c, F, 3.5f * std::ldexp(1.f, -9)) == 0x04);  // subnormal tie -> even
    }
    CHECK(enc("torch-2.11", F, 465.f) == 0x7F);
    CHECK(enc("ml_dtypes", F, 479.99f) == 0x7F);
    CHECK(enc("cuda-nosat", F, 465.f) == 0x7F);
    CHECK(enc("cuda-satfinite", F, 465.f) == 0x7E);
    CHECK(enc("ocp-sat", F, 1000.f) == 0x7E);
    CHECK(enc("torch-2.11", F, -1000.f) == 0xFF);
    CHECK(enc("cuda-satfinite", F, -1000.f) == 0xFE);
    CHECK(enc("torch-2.11", F, INFINITY) == 0x7F);
    CHECK(enc("torch-2.11", F, -INFINITY) == 0xFF);
    CHECK(enc("cuda-satfinite", F, INFINITY) == 0x7E);
    CHECK(enc("cuda-satfinite", F, -INFINITY) == 0xFE);
    CHECK(enc_bits("torch-2.11", F, 0xFFC00000u) == 0xFF);
    CHECK(enc_bits("ml_dtypes", F, 0xFFC00000u) == 0xFF);
    CHECK(enc_bits("cuda-nosat", F, 0xFFC00000u) == 0x7F);
    CHECK(enc_bits("cuda-satfinite", F, 0x7FC00000u) == 0x7F);
  }

  TEST_CASE("e5m2 overflow, Inf and NaN bytes") {
    const Format F = Format::e5m2;
    CHECK(enc("torch-2.11", F, 61439.f) == 0x7B);
    CHECK(enc("torch-2.11", F, 61440.f) == 0x7C);  // tie rounds up into Inf
    CHECK(enc("cuda-satfinite", F, 61440.f) == 0x7B);
    CHECK(enc("cuda-satfinite", F, INFINITY) == 0x7B);
    CHECK(enc("ml_dtypes", F, INFINITY) == 0x7C);
    CHECK(enc("cuda-nosat", F, -INFINITY) == 0xFC);
    CHECK(enc_bits("ml_dtypes", F, 0x7FC00000u) == 0x7E);
    CHECK(enc_bits("ml_dtypes", F, 0xFFC00000u) == 0xFE);
    CHECK(enc_bits("torch-2.11", F, 0xFFC00000u) == 0xFF);
    CHECK(enc_bits("cuda-nosat", F, 0xFFC00000u) == 0x7F);
    CHECK(enc("torch-2.11", F, std::ldexp(1.f, -17)) == 0x00);
    CHECK(enc("torch-2.11", F, -std::ldexp(1.f, -17)) == 0x80);
  }

  TEST_CASE("fnuz: no -0, 0x80 is NaN, overflow from 248") {
    CHECK(enc("torch-2.11", Format::e4m3fnuz, 247.f) == 0x7F);
    CHECK(enc("torch-2.11", Format::e4m3fnuz, 248.f) == 0x80);
    CHECK(enc("torch-2.11", Format::e4m3fnuz, -0.0f) == 0x00);
    CHECK(enc("torch-2.11", Format::e4m3fnuz, -std::ldexp(1.f, -12)) == 0x00);
    CHECK(enc("torch-2.11", Format::e4m3fnuz, -1.0f) == 0x80 + 0x40);
    CHECK(enc("torch-2.11", Format::e5m2fnuz, 61440.f) == 0x80);
    CHECK(enc_bits("torch-2.11", Format::e5m2fnuz, 0xFFC00000u) == 0x80);
  }

  TEST_CASE("f64 sources: one rounding vs the double rounding via f32") {
    const double x = 1.0625 + std::ldexp(1.0, -40);  // just above the tie between 1.0 and 1.125... via f32 a tie
    CHECK(ref::encode_f64(x, conv("torch-2.11", Format::e4m3fn, Format::f64)) == 0x38);
    CHECK(ref::encode_f64(x, conv("cuda-satfinite", Format::e4m3fn, Format::f64)) == 0x39);
    const double y = std::ldexp(1.0, -10) * (1 + std::ldexp(1.0, -52));
    CHECK(ref::encode_f64(y, conv("torch-2.11", Format::e4m3fn, Format::f64)) == 0x00);
    CHECK(ref::encode_f64(y, conv("cuda-nosat", Format::e4m3fn, Format::f64)) == 0x01);
    // ml_dtypes 0.7 arrays round once, 0.5/0.6 via f32 (f64 0x3ff1000000000001: 0x39 vs 0x38, read off both)
    const double z = 1.0625 + std::ldexp(1.0, -52);
    CHECK(ref::encode_f64(z, conv("ml_dtypes", Format::e4m3fn, Format::f64)) == 0x39);
    CHECK(ref::encode_f64(z, conv("ml_dtypes-0.6", Format::e4m3fn, Format::f64)) == 0x38);
    CHECK(ref::encode_f64(y, conv("ml_dtypes", Format::e4m3fn, Format::f64)) == 0x01);
    // CUDA's double path keeps the NaN sign and the e5m2 payload bits.
    double nneg;
    const uint64_t nb = 0xFFF8000000000000ull;
    std::memcpy(&nneg, &nb, 8);
    CHECK(ref::encode_f64(nneg, conv("cuda-nosat", Format::e5m2, Format::f64)) == 0xFE);
    CHECK(ref::encode_f64(nneg, conv("cuda-nosat", Format::e4m3fn, Format::f64)) == 0xFF);
  }

  TEST_CASE("rounding modes on e4m3fn") {
    ConversionSpec s = conv("ocp-nosat", Format::e4m3fn);
    const float between = 1.0f + 1.0f / 32;  // between 1.0 (0x38) and 1.125 (0x39), below the tie
    s.rounding = Rounding::rz;
    CHECK(ref::encode_f32(between, s) == 0x38);
    CHECK(ref::encode_f32(-between, s) == 0xB8);
    CHECK(ref::encode_f32(1000.f, s) == 0x7E);  // IEEE: rz overflow saturates
    s.rounding = Rounding::ru;
    CHECK(ref::encode_f32(between, s) == 0x39);
    CHECK(ref::encode_f32(-between, s) == 0xB8);
    CHECK(ref::encode_f32(-1000.f, s) == 0xFE);
    CHECK(ref::encode_f32(1000.f, s) == 0x7F);
    s.rounding = Rounding::rd;
    CHECK(ref::encode_f32(between, s) == 0x38);
    CHECK(ref::encode_f32(-between, s) == 0xB9);
    s.rounding = Rounding::rna;
    CHECK(ref::encode_f32(1.0625f, s) == 0x39);  // tie away
    s.rounding = Rounding::rne;
    CHECK(ref::encode_f32(1.0625f, s) == 0x38);  // tie to even
    CHECK(ref::encode_f32(1.1875f, s) == 0x3A);
  }

  TEST_CASE("stochastic rounding: probability follows the discarded fraction, reproducible by seed") {
    ConversionSpec s = conv("ocp-sat", Format::e4m3fn);
    s.rounding = Rounding::stochastic;
    s.seed = 1234;
    const int n = 200000;
    std::vector<float> xs(n, 1.0f + 0.125f * 0.25f);  // a quarter of the way from 1.0 to 1.125
    std::vector<uint8_t> a(n), b(n);
    cpu::encode_f32(xs.data(), a.data(), n, s);
    int ups = 0;
    for (int i = 0; i < n; ++i) {
      b[i] = ref::encode_f32(xs[i], s, static_cast<uint64_t>(i));
      ups += a[i] == 0x39;
    }
    CHECK(a == b);
    CHECK(std::abs(ups / double(n) - 0.25) < 0.005);
    s.seed = 99;
    cpu::encode_f32(xs.data(), b.data(), n, s);
    CHECK(a != b);
  }

  TEST_CASE("ue8m0 conventions") {
    auto e = [](const char* c, float x) { return ref::encode_f32(x, conv(c, Format::ue8m0)); };
    CHECK(e("cuda-satfinite", 1.0f) == 127);
    CHECK(e("cuda-satfinite", 1.99f) == 127);
    CHECK(e("mx", 3.0f) == 128);
    CHECK(e("pow2-ceil", 1.0f) == 127);
    CHECK(e("pow2-ceil", 1.0001f) == 128);
    CHECK(e("torch-2.11", 1.49f) == 127);
    CHECK(e("torch-2.11", 1.5f) == 128);  // mantissa 0x400000 rounds up
    CHECK(e("torch-2.11", 0.0f) == 0x00);
    CHECK(e("torch-2.11", -4.0f) == 129);  // sign ignored (H200)
    CHECK(e("torch-2.11", std::ldexp(1.0f, -127)) == 0x00);
    CHECK(e("torch-2.11", std::ldexp(1.0f, -127) * (1 + std::ldexp(1.0f, -22))) == 0x01);
    CHECK(e("ml_dtypes", 0.0f) == 0xFF);
    CHECK(e("ml_dtypes", -4.0f) == 0xFF);
    // ml_dtypes 0.7 rounds f32 subnormals by value, 0.6 by the bit trick (both outputs read off the releases)
    for (const char* c : {"ml_dtypes", "ml_dtypes-0.6"}) {
      INFO(c);
      CHECK(e(c, -0.0f) == 0xFF);
      CHECK(e(c, 1.5f) == 128);
      CHECK(e(c, 1.4999999f) == 127);
      CHECK(e(c, 1.5f * std::ldexp(1.0f, -127)) == 0x01);  // f32 0x00600000: tie, up
      CHECK(e(c, std::ldexp(1.0f, -128)) == 0x00);
    }
    CHECK(e("ml_dtypes", std::ldexp(1.0f, -127) * (1 + std::ldexp(1.0f, -22))) == 0x00);     // f32 0x00400001
    CHECK(e("ml_dtypes-0.6", std::ldexp(1.0f, -127) * (1 + std::ldexp(1.0f, -22))) == 0x01);
    CHECK(e("cuda-satfinite", -4.0f) == 129);
    CHECK(e("cuda-satfinite", INFINITY) == 0xFE);
    CHECK(e("cuda-nosat", INFINITY) == 0xFF);
    CHECK(e("cuda-nosat", NAN) == 0xFF);
    CHECK(e("cuda-satfinite", std::ldexp(1.0f, -130)) == 0x00);
    CHECK(e("pow2-ceil", std::ldexp(1.0f, -130)) == 0x01);  // the bit trick's subnormal case
    CHECK(e("pow2-ceil-clamp", 0.0f) == 0x01);
    CHECK(e("pow2-ceil-clamp", NAN) == 0xFE);
    CHECK(e("pow2-ceil-clamp", 3e38f) == 0xFE);
    CHECK(e("pow2-ceil", 3e38f) == 0xFF);
    ConversionSpec ru = conv("cuda-satfinite", Format::ue8m0);
    ru.rounding = Rounding::ru;
    CHECK(ref::encode_f32(1.0001f, ru) == 128);
    CHECK(ref::encode_f32(std::ldexp(1.0f, -127), ru) == 0x00);
    CHECK(ref::encode_f32(3e38f, ru) == 0xFE);
  }

  TEST_CASE("conventions that do not define a pair say so") {
    std::string err;
    CHECK_FALSE(resolve_convention("cuda-satfinite", Format::f32, Format::e4m3fnuz, &err));
    CHECK(err.find("e4m3fnuz") != std::string::npos);
    CHECK_FALSE(resolve_convention("ocp-sat", Format::f32, Format::ue8m0, &err));
    CHECK_FALSE(resolve_convention("mx", Format::f32, Format::e4m3fn, &err));
    CHECK_FALSE(resolve_convention("no-such", Format::f32, Format::e4m3fn, &err));
    CHECK(err.find("no-such") != std::string::npos);
  }

  TEST_CASE("decode: exact values, NaN patterns per convention") {
    std::string err;
    const DecodeSpec torch = *resolve_decode("torch-2.11", Format::e4m3fn, &err);
    CHECK(ref::decode_f32_bits(Format::e4m3fn, 0x7F, torch) == 0x7FF00000u);
    CHECK(ref::decode_f32_bits(Format::e4m3fn, 0xFF, torch) == 0xFFF00000u);
    const DecodeSpec ml = *resolve_decode("ml_dtypes", Format::e5m2, &err);
    CHECK(ref::decode_f32_bits(Format::e5m2, 0xFE, ml) == 0xFFC00000u);
    CHECK(ref::decode_f32(Format::e5m2, 0x7C, ml) == INFINITY);
    CHECK(ref::decode_f32_bits(Format::ue8m0, 0x00, ml) == 0x00400000u);  // 2^-127, an f32 subnormal
    CHECK(ref::decode_f64(Format::e4m3fn, 0xFE, ml) == -448.0);
    // cpu table decode == reference for every code, both containers
    for (Format f : all_formats()) {
      if (!is_fp8(f)) continue;
      std::vector<uint8_t> codes(256);
      for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
      std::vector<float> o32(256);
      std::vector<double> o64(256);
      cpu::decode_f32(f, codes.data(), o32.data(), 256, torch);
      cpu::decode_f64(f, codes.data(), o64.data(), 256, torch);
      for (int c = 0; c < 256; ++c) {
        CHECK(f2b(o32[c]) == ref::decode_f32_bits(f, static_cast<uint8_t>(c), torch));
        CHECK(d2b(o64[c]) == ref::decode_f64_bits(f, static_cast<uint8_t>(c), torch));
      }
    }
  }

  TEST_CASE("cpu == reference on random f32 inputs over all magnitudes, every spec and rounding, every SIMD target") {
    std::mt19937_64 rng(7);
    // a quarter of the inputs under AddressSanitizer (it checks memory, not values; the Release run has them all)
    std::vector<float> xs(FP8REF_TEST_ASAN ? 25013 : 100003);
    for (auto& x : xs) x = b2f(static_cast<uint32_t>(rng()));
    for (Format to : all_formats()) {
      if (!is_fp8(to)) continue;
      for (const ConventionInfo& c : conventions()) {
        std::string err;
        auto base_spec = resolve_convention(c.name, Format::f32, to, &err);
        if (!base_spec) continue;
        for (int r = 0; r < 6; ++r) {
          ConversionSpec s = *base_spec;
          if (!(to == Format::ue8m0 && s.ue8m0_method != Ue8m0Method::value)) s.rounding = static_cast<Rounding>(r);
          s.seed = 42;
          std::vector<uint8_t> want(xs.size());
          for (size_t i = 0; i < xs.size(); ++i) want[i] = ref::encode_f32(xs[i], s, 1000 + i);
          INFO(c.name, " -> ", format_name(to), " ", s.describe());
          // on every SIMD target this build dispatches to (a CPU without AVX-512 runs the others)
          const auto targets = fp8ref::test::for_test_targets([&] {
            std::vector<uint8_t> out(xs.size());
            cpu::encode_f32(xs.data(), out.data(), xs.size(), s, 1000);
            size_t bad = 0;
            for (size_t i = 0; i < xs.size(); ++i) bad += out[i] != want[i];
            INFO("SIMD target ", cpu::simd_target());
            CHECK(bad == 0);
          });
          CHECK(!targets.empty());
        }
      }
    }
  }

  // Arrays of >= 2^22 elements take the streaming loop's non-temporal stores, each stream a whole 64-byte line of
  // codes at a time from a line-aligned start (the head before it goes element by element): destinations at every
  // offset within a line, lengths that leave a tail, f32 / bf16 / f16 sources, on every SIMD target.
  TEST_CASE("cpu == reference through the streaming (non-temporal) loop at misaligned destinations") {
    const size_t n = (size_t{1} << 22) + 77;
    std::mt19937_64 rng(11);
    std::vector<float> xs(n);
    std::vector<uint16_t> hs(n);
    for (size_t i = 0; i < n; ++i) {
      // magnitudes 2^-12..2^10 (subnormal codes, normals, overflow), 1/4096 specials
      const uint32_t r = static_cast<uint32_t>(rng());
      const uint32_t e = 115u + (r >> 8) % 23u;
      uint32_t b = (r & 0x80000000u) | (e << 23) | (static_cast<uint32_t>(rng()) & 0x7FFFFFu);
      if ((r & 0xFFF) == 0) b = (r & 0x80000000u) | ((r & 0x1000) ? 0x7F800000u : 0x7FC00001u);
      xs[i] = b2f(b);
      hs[i] = static_cast<uint16_t>(rng());
    }
    struct Case {
      const char* conv;
      Format from, to;
    };
    const Case cases[] = {{"torch-2.11", Format::f32, Format::e4m3fn},
                          {"cuda-satfinite", Format::bf16, Format::e4m3fn},
                          {"cuda-satfinite", Format::f16, Format::e4m3fn},
                          {"cuda-satfinite", Format::bf16, Format::e5m2}};
    // Under ASan (4 Mi elements per call on every SIMD target, scalar ones included: minutes) the two source widths
    // (f32, bf16) at a start 1 past a line and 1 short of the next: the head and tail around the streamed lines.
    const size_t ncases = FP8REF_TEST_ASAN ? 2 : std::size(cases);
    const std::vector<size_t> offsets = FP8REF_TEST_ASAN ? std::vector<size_t>{1, 63}
                                                         : std::vector<size_t>{0, 1, 31, 32, 33, 63};
    for (const Case& c : std::vector<Case>(cases, cases + ncases)) {
      const ConversionSpec s = conv(c.conv, c.to, c.from);
      std::vector<uint8_t> want(n);
#pragma omp parallel for
      for (long long i = 0; i < static_cast<long long>(n); ++i)
        want[i] = c.from == Format::f32 ? ref::encode_f32(xs[i], s) : ref::encode(c.from, hs[i], s);
      std::vector<uint8_t> buf(n + 128);
      for (size_t off : offsets) {
        INFO(c.conv, " ", format_name(c.from), " -> ", format_name(c.to), " destination offset ", off);
        const auto targets = fp8ref::test::for_test_targets([&] {
          INFO("SIMD target ", cpu::simd_target());
          // the destination's line offset: off from a 64-byte boundary
          uint8_t* base = buf.data() + ((64 - (reinterpret_cast<uintptr_t>(buf.data()) & 63)) & 63);
          uint8_t* dst = base + off;
          REQUIRE(dst + n <= buf.data() + buf.size());
          if (c.from == Format::f32) cpu::encode_f32(xs.data(), dst, n, s);
          else cpu::encode_bits16(c.from, hs.data(), dst, n, s);
          size_t bad = 0;
          for (size_t i = 0; i < n; ++i) bad += dst[i] != want[i];
          CHECK(bad == 0);
        });
        CHECK(!targets.empty());
      }
    }
  }
}

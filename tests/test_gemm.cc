// scaled_mm: the cpu implementations of exact, f32-kblock and hopper-tc are bit-identical to the reference on random
// cases (every scaling, format pair, output type, bias mode, odd shapes and K tails, NaN/Inf codes, Inf and zero
// scales, split-K, fast accumulation, the cuBLAS scale_b stride); hand-computed cases of each model; the spec checks.
// The reference itself is checked against exact rational arithmetic in tests/python/test_scaled_mm_oracle.py and
// against the H200 in tests/python/test_scaled_mm_h200.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/gemm.h"
#include "fp8ref/golden.h"
#include "fp8ref/mma.h"
#include "support/simd_targets.h"

using namespace fp8ref;

namespace {

struct Problem {
  ScaledMmSpec s;
  GemmShape g;
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb, bias;
};

size_t numel(const std::vector<int64_t>& v) {
  size_t n = 1;
  for (int64_t d : v) n *= static_cast<size_t>(d);
  return n;
}

Problem make(std::mt19937_64& rng, const ScaledMmSpec& s, GemmShape g, bool specials) {
  Problem p{s, g, {}, {}, {}, {}, {}};
  auto codes = [&](Format f, size_t n) {
    std::vector<uint8_t> c(n);
    for (auto& x : c) {
      x = static_cast<uint8_t>(rng() & 0xFF);
      const bool special = f == Format::e4m3fn ? (x & 0x7F) == 0x7F : (x & 0x7C) == 0x7C;
      if (special && !(specials && rng() % 64 == 0)) x = static_cast<uint8_t>(x & 0x83);  // mostly finite
      if (rng() % 8 == 0) x = 0;
    }
    return c;
  };
  p.a = codes(s.fa, static_cast<size_t>(g.M * g.K));
  p.b = codes(s.fb, static_cast<size_t>(g.N * g.K));
  std::uniform_real_distribution<double> u(-4, 4);
  auto scales = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) {
      x = s.scaling == GemmScaling::mx ? std::ldexp(1.0f, static_cast<int>(rng() % 12) - 6)
                                       : static_cast<float>(std::exp2(u(rng)));
      if (specials && rng() % 50 == 0) x = 0.0f;
    }
    return v;
  };
  p.sa = scales(numel(gemm_sa_shape(s, g)));
  p.sb = scales(numel(gemm_sb_shape(s, g)));
  p.bias.resize(static_cast<size_t>(g.N));
  for (auto& x : p.bias) x = static_cast<float>(u(rng) * 30);
  return p;
}

std::vector<uint8_t> run(const Problem& p, bool cpu) {
  std::vector<uint8_t> out(static_cast<size_t>(p.g.M * p.g.N) * (p.s.out == Format::f32 ? 4 : 2));
  const float* bias = p.s.bias == BiasMode::none ? nullptr : p.bias.data();
  if (cpu) cpu::scaled_mm(p.s, p.g, p.a.data(), p.b.data(), p.sa.data(), p.sb.data(), bias, out.data());
  else ref::scaled_mm(p.s, p.g, p.a.data(), p.b.data(), p.sa.data(), p.sb.data(), bias, out.data());
  return out;
}

float f32_at(const std::vector<uint8_t>& v, size_t i) {
  float f;
  std::memcpy(&f, v.data() + 4 * i, 4);
  return f;
}

}  // namespace

TEST_CASE("scaled_mm: cpu is bit-identical to the reference for exact, f32-kblock and hopper-tc, every SIMD target") {
  std::mt19937_64 rng(12345);
  const Format outs[] = {Format::f32, Format::bf16, Format::f16};
  const std::pair<Format, Format> fmts[] = {{Format::e4m3fn, Format::e4m3fn}, {Format::e4m3fn, Format::e5m2},
                                            {Format::e5m2, Format::e4m3fn}, {Format::e5m2, Format::e5m2}};
  const GemmShape shapes[] = {{37, 70, 300}, {9, 130, 272}, {5, 3, 16}, {3, 4, 1}};
  int i = 0, checked = 0;
  for (GemmModel model : {GemmModel::exact, GemmModel::f32_kblock, GemmModel::hopper_tc})
    for (GemmScaling sc : {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                           GemmScaling::mx}) {
      if (model == GemmModel::hopper_tc && sc == GemmScaling::mx) continue;
      for (int rep = 0; rep < 4; ++rep, ++i) {
        ScaledMmSpec s;
        s.fa = fmts[i % 4].first, s.fb = fmts[i % 4].second;
        s.scaling = sc;
        s.model = model;
        s.out = outs[i % 3];
        s.bias = static_cast<BiasMode>(i % 3);
        if (model == GemmModel::f32_kblock) {
          s.promote_arith = i % 2 ? PromoteArith::fma : PromoteArith::mul_mul_add;
          if (rep == 3) s.kblock = sc == GemmScaling::mx ? 16 : 64;
        }
        if (model == GemmModel::hopper_tc) {
          const bool blocked = sc == GemmScaling::blockwise || sc == GemmScaling::group;
          s.promote_never = !blocked && rep % 2 == 1;
          s.split_k = 1 + rep % 3;
        }
        if (sc == GemmScaling::blockwise && rep == 2) s.cublas_sb_stride = true;
        const Problem p = make(rng, s, shapes[rep], rep == 1);
        CAPTURE(s.describe());
        CAPTURE(rep);
        const auto r = run(p, false);
        // on every SIMD target this build dispatches to (a CPU without AVX-512 runs the others)
        const auto targets = fp8ref::test::for_test_targets([&] {
          INFO("SIMD target " << fp8ref::cpu::simd_target());
          CHECK(r == run(p, true));
        });
        CHECK(!targets.empty());
        ++checked;
      }
    }
  CHECK(checked == 56);
}

TEST_CASE("scaled_mm: Inf scales and NaN / Inf codes follow IEEE rules in every model") {
  ScaledMmSpec s;
  s.fa = s.fb = Format::e5m2;
  s.out = Format::f32;
  const GemmShape g{1, 3, 4};
  // row 0 of A: 1, 1, 0, 0; BT rows: (1,1,0,0), (+Inf,0,0,0) [Inf·1], (NaN,...)
  std::vector<uint8_t> a = {0x3C, 0x3C, 0, 0};
  std::vector<uint8_t> b = {0x3C, 0x3C, 0, 0, 0x7C, 0, 0, 0, 0x7E, 0, 0, 0};
  std::vector<float> sa = {1.0f}, sb = {2.0f};
  for (GemmModel m : {GemmModel::exact, GemmModel::f32_kblock, GemmModel::hopper_tc}) {
    s.model = m;
    std::vector<uint8_t> out(12);
    for (bool cpu : {false, true}) {
      if (cpu) cpu::scaled_mm(s, g, a.data(), b.data(), sa.data(), sb.data(), nullptr, out.data());
      else ref::scaled_mm(s, g, a.data(), b.data(), sa.data(), sb.data(), nullptr, out.data());
      CHECK(f32_at(out, 0) == 4.0f);
      CHECK(f32_at(out, 1) == INFINITY);
      uint32_t nan_bits;
      std::memcpy(&nan_bits, out.data() + 8, 4);
      CHECK(nan_bits == 0x7FFFFFFFu);  // canonical NaN
    }
    // Inf scale times a zero sum: NaN; times a non-zero sum: Inf
    std::vector<float> sbi = {INFINITY};
    std::vector<uint8_t> b0 = {0x3C, 0x3C, 0, 0, 0, 0, 0, 0, 0x3C, 0, 0, 0};
    for (bool cpu : {false, true}) {
      if (cpu) cpu::scaled_mm(s, g, a.data(), b0.data(), sa.data(), sbi.data(), nullptr, out.data());
      else ref::scaled_mm(s, g, a.data(), b0.data(), sa.data(), sbi.data(), nullptr, out.data());
      CHECK(f32_at(out, 0) == INFINITY);
      CHECK(std::isnan(f32_at(out, 1)));
      CHECK(f32_at(out, 2) == INFINITY);
    }
  }
}

TEST_CASE("scaled_mm: hand-computed hopper-tc and f32-kblock cases") {
  ScaledMmSpec s;
  s.out = Format::f32;
  s.scaling = GemmScaling::tensor;
  // K = 32, one step: 448·1 (E = 8 + 0) and 31 products of 2^-6 · 1 = 2^-6 ... the grid is 2^(8-13) = 2^-5, so each
  // 2^-6 product is truncated to 0: hopper-tc gives 448 while the exact sum is 448 + 31·2^-6.
  GemmShape g{1, 1, 32};
  std::vector<uint8_t> a(32, 0x08), b(32, 0x38);  // a = 2^-6 (e4m3fn 0x08), b = 1
  a[0] = 0x7E;                                     // 448
  std::vector<float> one = {1.0f};
  std::vector<uint8_t> out(4);
  s.model = GemmModel::hopper_tc;
  ref::scaled_mm(s, g, a.data(), b.data(), one.data(), one.data(), nullptr, out.data());
  CHECK(f32_at(out, 0) == 448.0f);
  s.model = GemmModel::exact;
  ref::scaled_mm(s, g, a.data(), b.data(), one.data(), one.data(), nullptr, out.data());
  CHECK(f32_at(out, 0) == 448.0f + 31.0f / 64.0f);
  // promotion: with the 448 in the first 128-K tile and the small products in the second tile, promote=128 keeps them
  g.K = 256;
  a.assign(256, 0);
  b.assign(256, 0x38);
  a[0] = 0x7E;
  for (int k = 128; k < 160; ++k) a[k] = 0x08;
  s.model = GemmModel::hopper_tc;
  ref::scaled_mm(s, g, a.data(), b.data(), one.data(), one.data(), nullptr, out.data());
  CHECK(f32_at(out, 0) == 448.5f);
  s.promote_never = true;  // fast accumulation: the small products meet the 448 in the accumulator and vanish
  ref::scaled_mm(s, g, a.data(), b.data(), one.data(), one.data(), nullptr, out.data());
  CHECK(f32_at(out, 0) == 448.0f);
  // f32-kblock: mul-mul-add vs fma differ when RN(sa·sb) loses bits
  s = ScaledMmSpec{};
  s.out = Format::f32;
  s.model = GemmModel::f32_kblock;
  g = GemmShape{1, 1, 1};
  std::vector<uint8_t> a1 = {0x38}, b1 = {0x3B};  // 1 · 1.375
  const float x = 1.0f + std::ldexp(1.0f, -12), y = 1.0f + std::ldexp(1.0f, -12);
  std::vector<float> sa = {x}, sb = {y};
  ref::scaled_mm(s, g, a1.data(), b1.data(), sa.data(), sb.data(), nullptr, out.data());
  const float mma = (1.375f * x) * y;
  CHECK(f32_at(out, 0) == mma);
  s.promote_arith = PromoteArith::fma;
  ref::scaled_mm(s, g, a1.data(), b1.data(), sa.data(), sb.data(), nullptr, out.data());
  CHECK(f32_at(out, 0) == std::fma(x * y, 1.375f, 0.0f));
}

TEST_CASE("scaled_mm: mma-sync-sm90 chains the instruction model over K") {
  ScaledMmSpec s;
  s.model = GemmModel::mma_sync_sm90;
  s.out = Format::f32;
  std::mt19937_64 rng(5);
  const GemmShape g{2, 3, 64};
  const Problem p = make(rng, s, g, false);
  std::vector<uint8_t> out(static_cast<size_t>(g.M * g.N) * 4);
  cpu::scaled_mm(s, g, p.a.data(), p.b.data(), p.sa.data(), p.sb.data(), nullptr, out.data());
  for (int64_t m = 0; m < g.M; ++m)
    for (int64_t n = 0; n < g.N; ++n) {
      float d = ref::mma_sm90_element(s.fa, s.fb, p.a.data() + m * 64, p.b.data() + n * 64, 0.0f);
      d = ref::mma_sm90_element(s.fa, s.fb, p.a.data() + m * 64 + 32, p.b.data() + n * 64 + 32, d);
      CHECK(f32_at(out, static_cast<size_t>(m * g.N + n)) == d * (p.sa[0] * p.sb[0]));
    }
}

TEST_CASE("scaled_mm: spec checks and names") {
  ScaledMmSpec s;
  GemmShape g{4, 4, 256};
  CHECK_NOTHROW(check_scaled_mm(s, g));
  s.fa = Format::e4m3fnuz;
  CHECK_THROWS_AS(check_scaled_mm(s, g), InputError);
  s = ScaledMmSpec{};
  s.model = GemmModel::hopper_tc;
  s.scaling = GemmScaling::mx;
  CHECK_THROWS_AS(check_scaled_mm(s, g), InputError);
  s.scaling = GemmScaling::blockwise;
  s.promote_never = true;
  CHECK_THROWS_AS(check_scaled_mm(s, g), InputError);
  s = ScaledMmSpec{};
  s.model = GemmModel::f32_kblock;
  s.scaling = GemmScaling::group;
  s.kblock = 96;  // does not divide 128
  CHECK_THROWS_AS(check_scaled_mm(s, g), InputError);
  s.kblock = 0;
  s.split_k = 2;  // split-K is a hopper-tc parameter
  CHECK_THROWS_AS(check_scaled_mm(s, g), InputError);
  const float nan_scale[] = {1.0f, NAN};
  CHECK_THROWS_AS(check_gemm_scales(s, nan_scale, 2, "sa"), InputError);
  s.scaling = GemmScaling::mx;
  const float not_pow2[] = {0.75f};
  CHECK_THROWS_AS(check_gemm_scales(s, not_pow2, 1, "sa"), InputError);
  GemmModel m;
  int kb = 0;
  CHECK(parse_gemm_model("f32-kblock:64", &m, &kb));
  CHECK(m == GemmModel::f32_kblock);
  CHECK(kb == 64);
  CHECK_FALSE(parse_gemm_model("f32-kblock:x", &m, &kb));
  CHECK(parse_gemm_model("hopper-tc", &m, &kb));
  CHECK(m == GemmModel::hopper_tc);
  s = ScaledMmSpec{};
  s.scaling = GemmScaling::blockwise;
  s.cublas_sb_stride = true;
  CHECK(gemm_sb_shape(s, GemmShape{4, 384, 640}) == std::vector<int64_t>{2 * 8 + 5});
  s.cublas_sb_stride = false;
  CHECK(gemm_sb_shape(s, GemmShape{4, 384, 640}) == std::vector<int64_t>{3, 5});
  CHECK(gemm_sa_shape(s, GemmShape{4, 384, 650}) == std::vector<int64_t>{4, 6});
}

TEST_CASE("scaled_mm: every entry point refuses a NaN scale, a missing bias and null operands (no wrong value, no crash)") {
  const GemmShape g{2, 3, 64};
  std::vector<uint8_t> a(2 * 64, 0x38), bt(3 * 64, 0x38);
  std::vector<float> out(6), bias(3, 1.0f);
  const float one = 1.0f, nan = NAN;
  for (GemmModel m : {GemmModel::exact, GemmModel::f32_kblock, GemmModel::hopper_tc, GemmModel::fast}) {
    ScaledMmSpec s;
    s.model = m;
    s.out = Format::f32;
    CAPTURE(to_string(m));
    CHECK_THROWS_WITH_AS(cpu::scaled_mm(s, g, a.data(), bt.data(), &nan, &one, nullptr, out.data()),
                         doctest::Contains("sa: scale 0 is NaN"), InputError);
    CHECK_THROWS_WITH_AS(cpu::scaled_mm(s, g, a.data(), bt.data(), &one, &nan, nullptr, out.data()),
                         doctest::Contains("sb: scale 0 is NaN"), InputError);
    if (m != GemmModel::fast)
      CHECK_THROWS_WITH_AS(ref::scaled_mm(s, g, a.data(), bt.data(), &nan, &one, nullptr, out.data()),
                           doctest::Contains("is NaN"), InputError);
    CHECK_THROWS_AS(cpu::scaled_mm(s, g, a.data(), bt.data(), nullptr, &one, nullptr, out.data()), InputError);
    s.bias = BiasMode::f32;
    CHECK_THROWS_WITH_AS(cpu::scaled_mm(s, g, a.data(), bt.data(), &one, &one, nullptr, out.data()),
                         doctest::Contains("needs a bias"), InputError);
    CHECK_NOTHROW(cpu::scaled_mm(s, g, a.data(), bt.data(), &one, &one, bias.data(), out.data()));
    CHECK(out[0] == 65.0f);  // 64 · 1 · 1 + 1
  }
}

TEST_CASE("scaled_mm: exact on ties and near-ties (the cpu fast path's fallback) equals the reference") {
  // Small integers with unit scales: many sums are odd integers above 256, exact bf16 midpoints; a tiny subnormal
  // product on some k makes near-ties; K = 2^17 + 5 > 2^17 also takes the integer path.
  std::mt19937_64 rng(77);
  for (GemmScaling sc : {GemmScaling::tensor, GemmScaling::group}) {
    for (Format out : {Format::bf16, Format::f16, Format::f32}) {
      ScaledMmSpec s;
      s.scaling = sc;
      s.out = out;
      const GemmShape g{6, 40, 384};
      Problem p = make(rng, s, g, false);
      const uint8_t ints[] = {0x38, 0x40, 0x44, 0x48, 0x4A, 0x4C, 0x4E, 0x50, 0xB8, 0xC0, 0xC4, 0};  // ±1..8, 0
      for (auto& c : p.a) c = ints[rng() % 12];
      for (auto& c : p.b) c = ints[rng() % 12];
      for (size_t i = 0; i < p.b.size(); i += 97) p.b[i] = 0x01;  // 2^-9 (with a = ±1..8: tiny offsets)
      std::fill(p.sa.begin(), p.sa.end(), 1.0f);
      std::fill(p.sb.begin(), p.sb.end(), sc == GemmScaling::group ? 0.5f : 1.0f);
      CAPTURE(s.describe());
      CHECK(run(p, false) == run(p, true));
    }
  }
  ScaledMmSpec s;
  s.out = Format::bf16;
  const GemmShape g{2, 3, (int64_t{1} << 17) + 5};
  Problem p = make(rng, s, g, false);
  CHECK(run(p, false) == run(p, true));
}

TEST_CASE("scaled_mm: golden ops — every model in a descriptor, reference and cpu backends agree") {
  using namespace fp8ref::golden;
  for (const char* line :
       {"scaled_mm shape=8x130x300 scaling=blockwise model=hopper-tc split-k=2 seed=1",
        "scaled_mm shape=4x16x96 a=e5m2 scaling=mx model=f32-kblock:32 promote-arith=fma bias=f32 out=f16 seed=2",
        "scaled_mm shape=4x16x64 scaling=rowwise model=hopper-tc promote=never bias=out out=f32 seed=3",
        "scaled_mm shape=4x16x64 model=mma-sync-sm90 out=f32 seed=4",
        "scaled_mm shape=8x260x520 scaling=blockwise model=exact sb-stride=cublas seed=5",
        "scaled_bmm shape=3x4x16x256 scaling=group model=exact b-batched=false batch-scales=a seed=6",
        "scaled_bmm shape=2x4x16x64 model=hopper-tc batch-scales=ab out=f32 seed=7"}) {
    INFO(line);
    const Descriptor d = parse_descriptor(line);
    CHECK(parse_descriptor(to_string(d)) == d);
    const io::SafetensorsFile g = make_golden(d);
    REQUIRE(g.find("output.out") != nullptr);
    REQUIRE(g.find("exact.out") != nullptr);
    const io::SafetensorsFile r = run_case(g, "cpu", "golden");
    CHECK(r.find("output.out")->data == g.find("output.out")->data);
  }
  const io::SafetensorsFile g = make_golden(parse_descriptor("scaled_mm shape=4x16x256 scaling=group model=fast seed=8"));
  CHECK(g.find("bound.out") != nullptr);
  CHECK_THROWS_AS(make_golden(parse_descriptor("scaled_mm scaling=mx model=hopper-tc")), InputError);
  CHECK_THROWS_AS(make_golden(parse_descriptor("scaled_mm shape=4x4 model=exact")), InputError);
}

TEST_CASE("scaled_mm: exact with many K groups (the error-free fast path's bound) equals the reference") {
  std::mt19937_64 rng(99);
  for (GemmScaling sc : {GemmScaling::blockwise, GemmScaling::mx})
    for (Format out : {Format::bf16, Format::f16}) {
      ScaledMmSpec s;
      s.scaling = sc;
      s.out = out;
      s.bias = BiasMode::f32;
      const GemmShape g{4, 70, 4096};
      const Problem p = make(rng, s, g, false);
      CAPTURE(s.describe());
      CHECK(run(p, false) == run(p, true));
    }
}

// The e4m3fn × e4m3fn f64 path of cpu::scaled_mm (src/cpu/gemm_cpu.cc, run_e4m3_f64: 128×128 work units, 8×16
// micro-tiles, K blocks of 128 / kblock / 32): shapes across unit, panel and K-block edges and K tails; ±448
// products (the largest block sums, f16 overflow); exact cancellation within and across K blocks; NaN codes (routed
// to the reference's special handling); K > 2^17; and the e5m2 pairs that keep the integer path.
TEST_CASE("scaled_mm: e4m3 f64 fast path at tile and K-block edges, extremes, cancellation and NaN codes") {
  std::mt19937_64 rng(2026);
  struct Cfg {
    GemmModel model;
    GemmScaling sc;
    int kblock;
    PromoteArith pa;
  };
  const Cfg cfgs[] = {{GemmModel::exact, GemmScaling::tensor, 0, PromoteArith::mul_mul_add},
                      {GemmModel::exact, GemmScaling::rowwise, 0, PromoteArith::mul_mul_add},
                      {GemmModel::exact, GemmScaling::blockwise, 0, PromoteArith::mul_mul_add},
                      {GemmModel::exact, GemmScaling::group, 0, PromoteArith::mul_mul_add},
                      {GemmModel::exact, GemmScaling::mx, 0, PromoteArith::mul_mul_add},
                      {GemmModel::f32_kblock, GemmScaling::blockwise, 0, PromoteArith::mul_mul_add},
                      {GemmModel::f32_kblock, GemmScaling::group, 64, PromoteArith::fma},
                      {GemmModel::f32_kblock, GemmScaling::tensor, 0, PromoteArith::fma},
                      {GemmModel::f32_kblock, GemmScaling::mx, 16, PromoteArith::mul_mul_add}};
  const GemmShape shapes[] = {{130, 131, 129}, {8, 16, 128}, {17, 33, 383}, {1, 1, 1}, {3, 129, 257}};
  const Format outs[] = {Format::bf16, Format::f16, Format::f32};
  int i = 0;
  for (const Cfg& c : cfgs)
    for (int kind = 0; kind < 4; ++kind, ++i) {
      ScaledMmSpec s;
      s.model = c.model, s.scaling = c.sc, s.kblock = c.kblock, s.promote_arith = c.pa;
      s.out = outs[i % 3];
      s.bias = static_cast<BiasMode>(i % 3);
      const GemmShape g = kind == 0 ? shapes[i % 5 == 0 ? 0 : 1 + i % 4] : shapes[1 + (i + kind) % 4];
      Problem p = make(rng, s, g, false);
      if (kind == 1) {  // ±448 everywhere: block sums up to 128·448² (f16 overflows)
        for (auto& x : p.a) x = (rng() & 1) ? 0x7E : 0xFE;
        for (auto& x : p.b) x = 0x7E;
      } else if (kind == 2) {  // exact cancellation: b pairs ±448 against equal a; one 2^-18 product per row
        for (int64_t m = 0; m < g.M; ++m)
          for (int64_t k = 0; k < g.K; ++k) p.a[m * g.K + k] = (k == g.K - 1) ? 0x01 : 0x7E;
        for (int64_t n = 0; n < g.N; ++n)
          for (int64_t k = 0; k < g.K; ++k)
            p.b[n * g.K + k] = (k == g.K - 1) ? ((n & 1) ? 0x01 : 0) : ((k & 1) ? 0xFE : 0x7E);
        if (g.K % 2 == 0 && g.K > 1) p.b[g.K - 2] = 0x7E;  // an odd count of ±448 terms leaves one
        std::fill(p.sa.begin(), p.sa.end(), s.scaling == GemmScaling::mx ? 0.25f : 1.5f);
        std::fill(p.sb.begin(), p.sb.end(), s.scaling == GemmScaling::mx ? 4.0f : 0.75f);
      } else if (kind == 3) {  // NaN codes in a few rows of A and BT
        p.a[(g.M * g.K) / 2] = 0x7F;
        p.b[0] = 0xFF;
        if (g.N > 2) p.b[2 * g.K + g.K - 1] = 0x7F;
      }
      CAPTURE(s.describe());
      CAPTURE(kind);
      CAPTURE(g.M);
      CAPTURE(g.N);
      CAPTURE(g.K);
      CHECK(run(p, false) == run(p, true));
    }

  // Cancellation across K blocks (exact, blockwise, equal scales 2 and 4): block 0 = 127·448² + 2^-18, block 1 =
  // −127·448² + 2^-17; the exact total (2^-18 + 2^-17)·8 = 3·2^-15 is far below the error-free sum's magnitude
  // bound, so the exact accumulator decides it. Hand value: 1.5·2^-14 = bf16 0x38C0.
  {
    ScaledMmSpec s;
    s.scaling = GemmScaling::blockwise;
    s.out = Format::bf16;
    const GemmShape g{1, 1, 256};
    Problem p = make(rng, s, g, false);
    for (int k = 0; k < 256; ++k) {
      p.a[k] = 0x7E;
      p.b[k] = k < 128 ? 0x7E : 0xFE;
    }
    p.a[255] = 0x01, p.b[255] = 0x02;  // one −448² of block 1 becomes 2^-9·2^-8 = 2^-17
    p.a[0] = 0x01, p.b[0] = 0x01;      // one +448² of block 0 becomes 2^-18
    p.sa = {2.0f, 2.0f};
    p.sb = {4.0f, 4.0f};
    const auto r = run(p, false), c = run(p, true);
    CHECK(r == c);
    uint16_t bits;
    std::memcpy(&bits, c.data(), 2);
    CHECK(bits == 0x38C0);  // exponent field 127 − 14 = 113 (0x3880), fraction .5 (0x40)
  }
  // Hand-computed ties (tensor scales 1, bf16): 1 + 2^-8 is a bf16 midpoint → 1.0 (RNE, even); with a 2^-18 more
  // → 1 + 2^-7.
  for (GemmModel model : {GemmModel::exact, GemmModel::f32_kblock}) {
    ScaledMmSpec s;
    s.model = model;
    s.out = Format::bf16;
    const GemmShape g{1, 2, 3};
    Problem p = make(rng, s, g, false);
    p.a = {0x38, 0x18, 0x01};               // 1, 2^-4, 2^-9
    p.b = {0x38, 0x18, 0x00, 0x38, 0x18, 0x01};  // column 0: 1 + 2^-8; column 1: 1 + 2^-8 + 2^-18
    p.sa = {1.0f};
    p.sb = {1.0f};
    const auto c = run(p, true);
    CHECK(c == run(p, false));
    uint16_t b0, b1;
    std::memcpy(&b0, c.data(), 2);
    std::memcpy(&b1, c.data() + 2, 2);
    CHECK(b0 == 0x3F80);
    CHECK(b1 == 0x3F81);
  }
  // f32-kblock's two promotion arithmetics with f32 output (the output rounding would hide a wrong one).
  for (PromoteArith pa : {PromoteArith::mul_mul_add, PromoteArith::fma})
    for (GemmScaling sc : {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                           GemmScaling::mx}) {
      ScaledMmSpec s;
      s.model = GemmModel::f32_kblock, s.scaling = sc, s.promote_arith = pa, s.out = Format::f32;
      const Problem p = make(rng, s, GemmShape{9, 40, 300}, false);
      CAPTURE(s.describe());
      CHECK(run(p, false) == run(p, true));
    }
  // K > 2^17: f32-kblock and exact with K-blocked scales stay on the f64 path; e5m2 pairs with the largest
  // magnitudes keep the integer path (128-block sums of e5m2 products need up to 2^70.6 units of 2^-32).
  for (GemmModel model : {GemmModel::exact, GemmModel::f32_kblock}) {
    ScaledMmSpec s;
    s.model = model;
    s.scaling = GemmScaling::group;
    s.out = Format::f32;
    const Problem p = make(rng, s, GemmShape{2, 3, (int64_t{1} << 17) + 5}, false);
    CAPTURE(s.describe());
    CHECK(run(p, false) == run(p, true));
  }
  for (auto [fa, fb] : {std::pair{Format::e5m2, Format::e4m3fn}, std::pair{Format::e5m2, Format::e5m2}})
    for (GemmModel model : {GemmModel::exact, GemmModel::f32_kblock}) {
      ScaledMmSpec s;
      s.fa = fa, s.fb = fb, s.model = model, s.scaling = GemmScaling::blockwise, s.out = Format::f32;
      Problem p = make(rng, s, GemmShape{3, 20, 300}, false);
      for (auto& x : p.a) x = (rng() & 1) ? 0x7B : 0xFB;  // ±57344
      for (auto& x : p.b) x = fb == Format::e5m2 ? 0x7B : 0x7E;
      p.b[5] = 0x01;  // one tiny product: the sums need every bit
      CAPTURE(s.describe());
      CHECK(run(p, false) == run(p, true));
    }
}

// hopper-tc's f32 step kernel (terms trunc(a·b·2^(13−e)) in f32, src/cpu/gemm_cpu.cc tc_step_lanes) against the
// reference's integer model: extreme exponent spread inside one step (largest codes next to subnormals), exact
// cancellation with a tiny survivor, a large fast-accumulation T (e5m2 × e5m2, ±57344 of one sign), NaN/Inf codes,
// K tails (a half-empty last step, K = 1) and partial column tiles, for every format pair.
TEST_CASE("scaled_mm: hopper-tc f32 step kernel at extreme spreads, cancellation, large T, NaN codes and K tails") {
  std::mt19937_64 rng(777);
  const std::pair<Format, Format> fmts[] = {{Format::e4m3fn, Format::e4m3fn}, {Format::e4m3fn, Format::e5m2},
                                            {Format::e5m2, Format::e4m3fn}, {Format::e5m2, Format::e5m2}};
  const GemmShape shapes[] = {{9, 70, 300}, {3, 130, 48}, {1, 1, 1}, {2, 65, 144}};
  auto big = [](Format f) -> uint8_t { return f == Format::e4m3fn ? 0x7E : 0x7B; };  // 448 / 57344
  int i = 0;
  for (auto [fa, fb] : fmts)
    for (int kind = 0; kind < 4; ++kind)
      for (bool never : {false, true}) {
        ScaledMmSpec s;
        s.fa = fa, s.fb = fb, s.model = GemmModel::hopper_tc, s.out = Format::f32;
        s.scaling = kind == 3 ? GemmScaling::rowwise : GemmScaling::tensor;
        s.promote_never = never;
        const GemmShape g = shapes[i++ % 4];
        Problem p = make(rng, s, g, false);
        if (kind == 0) {  // spread: per k the largest code, the smallest subnormal or the smallest normal, random sign
          const uint8_t pick_a[] = {big(fa), 0x01, 0x08}, pick_b[] = {big(fb), 0x01, 0x08};
          for (auto& x : p.a) x = static_cast<uint8_t>(pick_a[rng() % 3] | ((rng() & 1) << 7));
          for (auto& x : p.b) x = static_cast<uint8_t>(pick_b[rng() % 3] | ((rng() & 1) << 7));
        } else if (kind == 1) {  // cancellation: ±big pairs, the last k a tiny product
          for (int64_t m = 0; m < g.M; ++m)
            for (int64_t k = 0; k < g.K; ++k) p.a[m * g.K + k] = k == g.K - 1 ? 0x01 : big(fa);
          for (int64_t n = 0; n < g.N; ++n)
            for (int64_t k = 0; k < g.K; ++k)
              p.b[n * g.K + k] = k == g.K - 1 ? 0x01 : static_cast<uint8_t>(big(fb) | ((k & 1) << 7));
        } else if (kind == 2) {  // one sign, largest codes: T grows to K·max²; a few small codes truncated away
          for (auto& x : p.a) x = rng() % 16 ? big(fa) : 0x02;
          for (auto& x : p.b) x = rng() % 16 ? big(fb) : 0x03;
        } else {  // NaN / Inf codes in some rows of A and BT
          p.a[0] = fa == Format::e4m3fn ? 0x7F : 0x7C;   // NaN / +Inf
          p.b[g.N * g.K - 1] = fb == Format::e4m3fn ? 0xFF : 0xFC;
        }
        CAPTURE(s.describe());
        CAPTURE(kind);
        CHECK(run(p, false) == run(p, true));
      }
}

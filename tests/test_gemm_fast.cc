// The `fast` scaled_mm model (src/cpu/gemm_fast.h): within its derived bound of the exact result on random cases
// (every scaling, format pair, output type and bias mode; M, N, K tails), against an oracle written here: exact
// integer group sums (__int128 on the 2^-32 grid every fp8 product lies on), then the scales in long double.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/attention_fast.h"
#include "cpu/gemm_fast.h"
#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/gemm.h"

using namespace fp8ref;

namespace {

size_t numel(const std::vector<int64_t>& s) {
  size_t n = 1;
  for (int64_t d : s) n *= static_cast<size_t>(d);
  return n;
}

uint8_t random_finite_code(Format f, std::mt19937_64& rng) {
  for (;;) {
    const uint8_t c = static_cast<uint8_t>(rng());
    if (std::isfinite(ref::value_of(f, c))) return c;
  }
}

struct Case {
  ScaledMmSpec spec;
  GemmShape g;
  std::vector<uint8_t> a, bt;
  std::vector<float> sa, sb, bias;
};

Case make_case(std::mt19937_64& rng, GemmScaling scaling, Format fa, Format fb, Format out, BiasMode bias, int64_t M,
               int64_t N, int64_t K) {
  Case c;
  c.spec.fa = fa;
  c.spec.fb = fb;
  c.spec.scaling = scaling;
  c.spec.out = out;
  c.spec.model = GemmModel::fast;
  c.spec.bias = bias;
  c.g = {M, N, K};
  c.a.resize(static_cast<size_t>(M * K));
  c.bt.resize(static_cast<size_t>(N * K));
  for (auto& x : c.a) x = random_finite_code(fa, rng);
  for (auto& x : c.bt) x = random_finite_code(fb, rng);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> ex(-6, 6);
  auto scale = [&]() -> float {
    if (scaling == GemmScaling::mx) return rng() % 16 == 0 ? 0.0f : std::ldexp(1.0f, ex(rng));
    return static_cast<float>(std::ldexp(mant(rng), ex(rng)));
  };
  c.sa.resize(numel(gemm_sa_shape(c.spec, c.g)));
  c.sb.resize(numel(gemm_sb_shape(c.spec, c.g)));
  for (auto& s : c.sa) s = scale();
  for (auto& s : c.sb) s = scale();
  if (bias != BiasMode::none) {
    c.bias.resize(static_cast<size_t>(N));
    for (auto& b : c.bias) b = static_cast<float>((mant(rng) - 1.5) * std::ldexp(1.0, ex(rng) + 8));
  }
  return c;
}

// The oracle: v(m,n) = Σ_kb sa·sb·P_kb (+ bias), P_kb exact (integer), then long double. Also returns the oracle's
// own error bound (relative 2^-62 per long double step on the magnitudes).
void oracle(const Case& c, std::vector<long double>* v, std::vector<long double>* err) {
  const int64_t M = c.g.M, N = c.g.N, K = c.g.K;
  const int64_t G = c.spec.scaling == GemmScaling::mx ? 32
                    : (c.spec.scaling == GemmScaling::tensor || c.spec.scaling == GemmScaling::rowwise) ? std::max<int64_t>(K, 1)
                                                                                                         : 128;
  const int64_t KB = K == 0 ? 0 : (K + G - 1) / G;
  v->assign(static_cast<size_t>(M * N), 0.0L);
  err->assign(static_cast<size_t>(M * N), 0.0L);
  auto sa_at = [&](int64_t m, int64_t kb) -> long double {
    if (c.spec.scaling == GemmScaling::tensor) return c.sa[0];
    if (c.spec.scaling == GemmScaling::rowwise) return c.sa[static_cast<size_t>(m)];
    return c.sa[static_cast<size_t>(m * KB + kb)];
  };
  auto sb_at = [&](int64_t n, int64_t kb) -> long double {
    if (c.spec.scaling == GemmScaling::tensor) return c.sb[0];
    if (c.spec.scaling == GemmScaling::rowwise) return c.sb[static_cast<size_t>(n)];
    if (c.spec.scaling == GemmScaling::blockwise) return c.sb[static_cast<size_t>((n / 128) * KB + kb)];
    return c.sb[static_cast<size_t>(n * KB + kb)];
  };
  double va[256], vb[256];
  for (int i = 0; i < 256; ++i) {
    va[i] = ref::value_of(c.spec.fa, static_cast<uint8_t>(i));
    vb[i] = ref::value_of(c.spec.fb, static_cast<uint8_t>(i));
  }
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      long double sum = 0, mag = 0;
      for (int64_t kb = 0; kb < KB; ++kb) {
        __int128 p = 0;
        for (int64_t k = kb * G; k < std::min(K, (kb + 1) * G); ++k) {
          const double prod = va[c.a[static_cast<size_t>(m * K + k)]] * vb[c.bt[static_cast<size_t>(n * K + k)]];  // exact
          p += static_cast<__int128>(std::ldexp(prod, 32));                                   // exact integer
        }
        const long double w = sa_at(m, kb) * sb_at(n, kb);  // exact: 48 bits
        const long double t = std::ldexp(static_cast<long double>(p), -32) * w;
        sum += t;
        mag += std::fabs(t);
      }
      if (!c.bias.empty()) {
        sum += c.bias[static_cast<size_t>(n)];
        mag += std::fabs(static_cast<long double>(c.bias[static_cast<size_t>(n)]));
      }
      (*v)[static_cast<size_t>(m * N + n)] = sum;
      (*err)[static_cast<size_t>(m * N + n)] = mag * (KB + 4) * std::ldexp(1.0L, -62);
    }
}

double out_value(const Case& c, const std::vector<uint8_t>& out, size_t i) {
  if (c.spec.out == Format::f32) {
    float f;
    std::memcpy(&f, &out[4 * i], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &out[2 * i], 2);
  const uint32_t b = static_cast<uint32_t>(ref::narrow(c.spec.out, h, Format::f32));
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// Runs fast (on B's codes, or on a packed B) and the bound; returns the largest |fast − v| / bound (CHECKs every
// element).
double check_case(const Case& c, const std::string& what, const cpu::FastGemmB* packed = nullptr) {
  const size_t MN = static_cast<size_t>(c.g.M * c.g.N);
  std::vector<uint8_t> out(MN * (c.spec.out == Format::f32 ? 4 : 2));
  const float* bias = c.bias.empty() ? nullptr : c.bias.data();
  if (packed) cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), *packed, c.sa.data(), c.sb.data(), bias, out.data());
  else cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), bias, out.data());
  std::vector<double> bound(MN);
  cpu::scaled_mm_fast_bound(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), bias, bound.data());
  std::vector<long double> v, oerr;
  oracle(c, &v, &oerr);
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < MN; ++i) {
    const long double diff = std::fabs(static_cast<long double>(out_value(c, out, i)) - v[i]);
    if (!(diff <= bound[i] + oerr[i])) {
      if (++bad <= 3) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s: element %zu: fast %.9g exact %.12Lg |diff| %.3Lg > bound %.3g", what.c_str(), i,
                      out_value(c, out, i), v[i], diff, bound[i]);
        MESSAGE(std::string(buf));
      }
    }
    if (bound[i] > 0 && std::isfinite(bound[i])) worst = std::max(worst, static_cast<double>(diff / bound[i]));
  }
  CHECK_MESSAGE(bad == 0, what);
  return worst;
}

}  // namespace

TEST_CASE("fast scaled_mm stays within its derived bound of the exact result") {
  std::mt19937_64 rng(20261201);
  const GemmScaling scalings[] = {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                                  GemmScaling::mx};
  const Format fmts[][2] = {{Format::e4m3fn, Format::e4m3fn}, {Format::e5m2, Format::e5m2}, {Format::e4m3fn, Format::e5m2},
                            {Format::e5m2, Format::e4m3fn}};
  const Format outs[] = {Format::f32, Format::bf16, Format::f16};
  const BiasMode biases[] = {BiasMode::none, BiasMode::f32, BiasMode::out};
  const int64_t Ms[] = {1, 5, 17, 40}, Ns[] = {1, 7, 130, 300}, Ks[] = {1, 31, 128, 200, 300, 520};
  double worst = 0;
  int cases = 0;
  for (GemmScaling s : scalings)
    for (int i = 0; i < 10; ++i) {
      const auto& f = fmts[rng() % 4];
      const Format out = f[0] == Format::e5m2 && f[1] == Format::e5m2 && rng() % 2 ? Format::f32 : outs[rng() % 3];
      const BiasMode bias = biases[rng() % 3];
      const int64_t M = Ms[rng() % 4], N = Ns[rng() % 4], K = Ks[rng() % 6];
      const Case c = make_case(rng, s, f[0], f[1], out, bias, M, N, K);
      const std::string what = "seed 20261201 case " + std::to_string(cases) + ": " + c.spec.describe() + " M=" +
                                std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K);
      worst = std::max(worst, check_case(c, what));
      ++cases;
    }
  // The bound is not vacuous: some output uses a good part of it (the output rounding alone is tight).
  CHECK(worst > 0.25);
}

TEST_CASE("fast scaled_mm: the bound is tight enough to catch a wrong scale") {
  std::mt19937_64 rng(7);
  Case c = make_case(rng, GemmScaling::blockwise, Format::e4m3fn, Format::e4m3fn, Format::bf16, BiasMode::none, 16, 256, 384);
  CHECK(check_case(c, "blockwise e4m3 bf16") <= 1.0);
  // One weight-scale block 3% off: the output of that block leaves the bound (it is ~2^-8 relative for bf16 output).
  std::vector<uint8_t> out(16 * 256 * 2);
  std::vector<float> sb = c.sb;
  sb[1 * 3 + 2] *= 1.03f;  // n-block 1, k-block 2
  cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), sb.data(), nullptr, out.data());
  std::vector<double> bound(16 * 256);
  cpu::scaled_mm_fast_bound(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), nullptr, bound.data());
  std::vector<long double> v, oerr;
  oracle(c, &v, &oerr);
  size_t outside_block1 = 0, outside_elsewhere = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    const bool outside = std::fabs(out_value(c, out, i) - v[i]) > bound[i] + oerr[i];
    ((i % 256) / 128 == 1 ? outside_block1 : outside_elsewhere) += outside;
  }
  CHECK(outside_elsewhere == 0);
  CHECK(outside_block1 > 16 * 128 / 4);
}

TEST_CASE("fast scaled_mm: packed B reuse, zero sizes and bad input") {
  std::mt19937_64 rng(11);
  // (M = 80: the tile path, where a packed B gives the same bits — or, on CPUs with AMX, the tiles' small-M kernel for
  // both B forms, the same bits too; for M <= 64 without AMX a packed B has its own kernel, tested below within the
  // bound)
  const Case c = make_case(rng, GemmScaling::group, Format::e4m3fn, Format::e4m3fn, Format::f32, BiasMode::none, 80, 40, 256);
  const cpu::FastGemmB packed(c.spec, c.g, c.bt.data());
  std::vector<float> o1(80 * 40), o2(80 * 40);
  cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), nullptr, o1.data());
  cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), packed, c.sa.data(), c.sb.data(), nullptr, o2.data());
  CHECK(std::memcmp(o1.data(), o2.data(), o1.size() * 4) == 0);
  // The same bits on 1 thread (oneDNN never splits a reduction across our threads), for both B paths.
  const int threads = omp_get_max_threads();
  for (const GemmShape& g : {GemmShape{300, 600, 1000}, GemmShape{40, 200, 3000}}) {
    ScaledMmSpec t = c.spec;
    t.scaling = GemmScaling::tensor;
    const float sa1 = 0.5f, sb1 = 0.25f;
    std::vector<uint8_t> a(static_cast<size_t>(g.M * g.K)), b(static_cast<size_t>(g.N * g.K));
    for (auto& x : a) x = random_finite_code(Format::e4m3fn, rng);
    for (auto& x : b) x = random_finite_code(Format::e4m3fn, rng);
    std::vector<float> r1(static_cast<size_t>(g.M * g.N)), r2(r1.size());
    omp_set_num_threads(1);
    cpu::scaled_mm_fast(t, g, a.data(), b.data(), &sa1, &sb1, nullptr, r1.data());
    omp_set_num_threads(std::max(threads, 2));
    cpu::scaled_mm_fast(t, g, a.data(), b.data(), &sa1, &sb1, nullptr, r2.data());
    omp_set_num_threads(threads);
    CHECK(std::memcmp(r1.data(), r2.data(), r1.size() * 4) == 0);
  }
  // K = 0: the empty sum (+0), plus the bias.
  ScaledMmSpec s = c.spec;
  s.scaling = GemmScaling::tensor;
  s.bias = BiasMode::f32;
  const float one = 1.0f, bias[3] = {1.5f, -2.0f, 0.0f};
  std::vector<float> o3(6, 7.0f);
  cpu::scaled_mm_fast(s, {2, 3, 0}, nullptr, nullptr, &one, &one, bias, o3.data());
  CHECK(o3 == std::vector<float>{1.5f, -2.0f, 0.0f, 1.5f, -2.0f, 0.0f});
  // A packed B of another shape or scaling, a missing bias, a bad format: InputError.
  ScaledMmSpec other = c.spec;
  other.scaling = GemmScaling::tensor;
  CHECK_THROWS_AS(cpu::scaled_mm_fast(other, c.g, c.a.data(), packed, &one, &one, nullptr, o2.data()), InputError);
  CHECK_THROWS_AS(cpu::scaled_mm_fast(s, {2, 3, 0}, nullptr, nullptr, &one, &one, nullptr, o3.data()), InputError);
  other.fa = Format::e4m3fnuz;
  CHECK_THROWS_AS(cpu::scaled_mm_fast(other, c.g, c.a.data(), c.bt.data(), &one, &one, nullptr, o2.data()), InputError);
}

TEST_CASE("fast scaled_mm: fp8 -> bf16 is exact for every code") {
  for (Format f : {Format::e4m3fn, Format::e5m2}) {
    std::vector<uint8_t> codes(256 + 37);  // 37 more: the vector tail path too
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 7 + 3 * (i >= 256));
    std::vector<uint16_t> out(codes.size());
    cpu::fp8_to_bf16(f, codes.data(), out.data(), codes.size());
    for (size_t i = 0; i < codes.size(); ++i) {
      const uint32_t want = ref::decode_f32_bits(f, codes[i], DecodeSpec{});
      CAPTURE(format_name(f));
      CAPTURE(static_cast<int>(codes[i]));
      const uint32_t got = static_cast<uint32_t>(out[i]) << 16;
      CHECK(got == want);
    }
  }
}

TEST_CASE("fast scaled_mm: tiny scale products (f32 subnormal) and the cuBLAS scale_b stride") {
  std::mt19937_64 rng(5);
  // Scale products near 2^-140: RN32(sa·sb) is subnormal; the bound's absolute underflow term must cover it.
  Case c = make_case(rng, GemmScaling::group, Format::e5m2, Format::e4m3fn, Format::f32, BiasMode::none, 7, 50, 300);
  for (auto& s : c.sa) s = std::ldexp(s, -66);
  for (auto& s : c.sb) s = std::ldexp(s, -70);
  CHECK(check_case(c, "group e5m2 x e4m3fn, scale products ~2^-136") <= 1.0);
  // Scale products ~2^-124 (normal) times partials of subnormal codes (one product k·2^-18 per block): each scaled
  // partial P·w ~2^-142 is an f32 subnormal, rounded absolutely, 16 blocks of it (the audit of session 31)
  Case u = make_case(rng, GemmScaling::blockwise, Format::e4m3fn, Format::e4m3fn, Format::f32, BiasMode::none, 8, 128,
                     2048);
  std::fill(u.a.begin(), u.a.end(), 0);
  std::fill(u.bt.begin(), u.bt.end(), 0);
  for (int64_t kb = 0; kb < 16; ++kb) {
    for (int64_t m = 0; m < 8; ++m) u.a[static_cast<size_t>(m * 2048 + kb * 128 + 5)] = static_cast<uint8_t>(1 + rng() % 3);
    for (int64_t n = 0; n < 128; ++n) u.bt[static_cast<size_t>(n * 2048 + kb * 128 + 5)] = static_cast<uint8_t>(1 + rng() % 3);
  }
  for (auto& s : u.sa) s = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024, -62);
  for (auto& s : u.sb) s = std::ldexp(1.0f + static_cast<float>(rng() % 1024) / 1024, -62);
  CHECK(check_case(u, "blockwise, subnormal scaled partials (codes 1-3, scale products ~2^-124)") <= 1.0);
  // Blockwise with cublas_sb_stride: block (nb, kb) read at nb·roundup(KB, 4) + kb. The same values laid out densely
  // must give bit-identical results.
  Case d = make_case(rng, GemmScaling::blockwise, Format::e4m3fn, Format::e4m3fn, Format::bf16, BiasMode::none, 9, 300, 640);
  const int64_t KB = 5, NB = 3, stride = 8;
  ScaledMmSpec strided = d.spec;
  strided.cublas_sb_stride = true;
  std::vector<float> buf(static_cast<size_t>((NB - 1) * stride + KB), 1e9f);
  for (int64_t nb = 0; nb < NB; ++nb)
    for (int64_t kb = 0; kb < KB; ++kb) buf[static_cast<size_t>(nb * stride + kb)] = d.sb[static_cast<size_t>(nb * KB + kb)];
  REQUIRE(numel(gemm_sb_shape(strided, d.g)) == buf.size());
  std::vector<uint16_t> o1(9 * 300), o2(9 * 300);
  cpu::scaled_mm_fast(d.spec, d.g, d.a.data(), d.bt.data(), d.sa.data(), d.sb.data(), nullptr, o1.data());
  cpu::scaled_mm_fast(strided, d.g, d.a.data(), d.bt.data(), d.sa.data(), buf.data(), nullptr, o2.data());
  CHECK(o1 == o2);
}

// NaN propagation: a NaN code in A (row m) or B (column n) makes exactly that output row / column NaN, as the exact
// model's IEEE arithmetic does; nothing else becomes NaN. A NaN scale is refused (InputError), as gemm.h says.
TEST_CASE("fast scaled_mm: a NaN code gives NaN in its output row / column and nowhere else; a NaN scale is refused") {
  std::mt19937_64 rng(11);
  const GemmScaling scalings[] = {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                                  GemmScaling::mx};
  for (GemmScaling s : scalings)
    for (Format f : {Format::e4m3fn, Format::e5m2})
      for (int where = 0; where < 3; ++where) {
        Case c = make_case(rng, s, f, f, Format::bf16, BiasMode::none, 9, 140, 300);
        for (auto& x : c.sa) x = x == 0.0f ? 1.0f : x;  // (mx: no zero scale here, 0·NaN is covered elsewhere)
        for (auto& x : c.sb) x = x == 0.0f ? 1.0f : x;
        const uint8_t nan = 0x7F;
        const size_t per_row = c.sa.size() / 9;  // A scales per row (0: one per tensor)
        if (where == 0) c.a[static_cast<size_t>(2 * 300 + 257)] = nan;  // A row 2, k 257 (the last K block)
        else if (where == 1) c.bt[static_cast<size_t>(131 * 300 + 3)] = nan;  // B column 131, k 3
        else c.sa[per_row ? 2 * per_row + per_row - 1 : 0] = std::numeric_limits<float>::quiet_NaN();  // row 2's last
        const cpu::FastGemmB packed(c.spec, c.g, c.bt.data());
        if (where == 2) {  // a NaN scale is refused (gemm.h), by both entry points
          std::vector<uint8_t> out(static_cast<size_t>(9 * 140 * 2));
          CHECK_THROWS_WITH_AS(cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), nullptr,
                                                   out.data()),
                               doctest::Contains("is NaN"), InputError);
          CHECK_THROWS_WITH_AS(cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), packed, c.sa.data(), c.sb.data(), nullptr, out.data()),
                               doctest::Contains("is NaN"), InputError);
          continue;
        }
        for (int variant = 0; variant < 4; ++variant) {  // B's codes, a packed B; both on vdpbf16ps (AMX CPUs)
          const bool use_packed = variant % 2 == 1;
          if (variant >= 2 && !attn::cpu::fast_attention_has_amx()) continue;
          std::vector<uint8_t> out(static_cast<size_t>(9 * 140 * 2));
          cpu::set_gemm16_amx_for_test(variant < 2);
          if (use_packed) cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), packed, c.sa.data(), c.sb.data(), nullptr, out.data());
          else cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), nullptr, out.data());
          cpu::set_gemm16_amx_for_test(true);
          int wrong = 0;
          for (size_t m = 0; m < 9; ++m)
            for (size_t n = 0; n < 140; ++n) {
              const bool want = where == 1 ? n == 131 : (m == 2 || (where == 2 && per_row == 0));
              if (std::isnan(out_value(c, out, m * 140 + n)) != want && wrong++ < 3)
                MESSAGE(c.spec.describe() << (use_packed ? " packed" : "") << (variant >= 2 ? " vdpbf16ps" : "") << ": element (" << m << ", " << n << ") "
                                          << out_value(c, out, m * 140 + n));
            }
          CHECK(wrong == 0);
        }
      }
}

// The small-M paths (CPUs with AVX-512 BF16 + VBMI): B's codes read row by row (M <= 16; K in chunks of <= 64 codes
// that never cross a scale group), and a packed B's column blocks of 16 (gemm16_fast; here up to M = 64 on every such
// CPU, whatever its default limit): each within the bound at every chunk and group edge, for each row-block shape and
// column tail, bit-identical across thread counts; the oneDNN tile path (the kernels switched off) within the same
// bound on the same cases.
TEST_CASE("fast scaled_mm: the small-M kernels (B's codes; a packed B's column blocks) at chunk and group edges, any thread count") {
  std::mt19937_64 rng(29);
  const GemmScaling scalings[] = {GemmScaling::tensor, GemmScaling::rowwise, GemmScaling::blockwise, GemmScaling::group,
                                  GemmScaling::mx};
  // (M > 16: a packed B's kernel, rows in blocks of 8 and a remainder; B's codes go the tile path there)
  // (on AMX CPUs a packed B's M >= 4 runs on the tiles: 1–4 row tiles of 16, the last one partial or whole)
  // (M = 100 on AMX CPUs: two slices of row tiles, 4 and 3, where the K groups are at most 128)
  const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 11, 16, 17, 29, 40, 64, 100}, Ns[] = {1, 3, 4, 6, 9, 130},
                Ks[] = {1, 31, 63, 64, 65, 127, 128, 129, 200, 520};
  const Format fmts[] = {Format::e4m3fn, Format::e5m2};
  const int threads = omp_get_max_threads();
  cpu::set_gemm16_max_m_for_test(64);  // (a packed B's kernel up to M = 64 on every CPU that has it, AMX or not)
  int cases = 0;
  for (GemmScaling s : scalings)
    for (int i = 0; i < 15; ++i, ++cases) {
      const Format fa = fmts[rng() % 2], fb = fmts[rng() % 2];
      const Format out = i % 3 == 0 ? Format::f32 : i % 3 == 1 ? Format::bf16 : Format::f16;
      const BiasMode bias = i % 4 == 3 ? BiasMode::f32 : BiasMode::none;
      const int64_t M = Ms[rng() % 14], N = Ns[rng() % 6], K = Ks[rng() % 10];
      const Case c = make_case(rng, s, fa, fb, out, bias, M, N, K);
      const std::string what = "case " + std::to_string(cases) + ": " + c.spec.describe() + " M=" + std::to_string(M) +
                               " N=" + std::to_string(N) + " K=" + std::to_string(K);
      check_case(c, what);
      const size_t bytes = static_cast<size_t>(M * N) * (out == Format::f32 ? 4 : 2);
      std::vector<uint8_t> o1(bytes), o2(bytes), o3(bytes), o4(bytes);
      const float* b = c.bias.empty() ? nullptr : c.bias.data();
      const cpu::FastGemmB packed(c.spec, c.g, c.bt.data());
      check_case(c, what + " (packed B)", &packed);
      if (attn::cpu::fast_attention_has_amx()) {  // (M >= 4 ran on the AMX tiles: the vdpbf16ps kernels as well)
        cpu::set_gemm16_amx_for_test(false);
        check_case(c, what + " (vdpbf16ps kernels)");
        check_case(c, what + " (packed B, vdpbf16ps kernel)", &packed);
        cpu::set_gemm16_amx_for_test(true);
      }
      omp_set_num_threads(1);
      cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), b, o1.data());
      cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), packed, c.sa.data(), c.sb.data(), b, o3.data());
      omp_set_num_threads(std::max(threads, 2));
      cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), c.bt.data(), c.sa.data(), c.sb.data(), b, o2.data());
      cpu::scaled_mm_fast(c.spec, c.g, c.a.data(), packed, c.sa.data(), c.sb.data(), b, o4.data());
      omp_set_num_threads(threads);
      CHECK_MESSAGE(o1 == o2, what);
      CHECK_MESSAGE(o3 == o4, what);
      cpu::set_avx512bf16_kernels_for_test(false);
      check_case(c, what + " (tile path)");
      check_case(c, what + " (tile path, packed B)", &packed);
      cpu::set_avx512bf16_kernels_for_test(true);
    }
  // A packed B goes on the AMX tiles up to M = 1024 where the K groups are at most 128 (elsewhere the tile path or
  // gemm16_fast): M = 200 is three slices of 64 rows and one of 8, K = 520 ends in a partial group, N = 130 in a
  // partial column block.
  for (GemmScaling s : {GemmScaling::blockwise, GemmScaling::group, GemmScaling::mx}) {
    const Case c = make_case(rng, s, Format::e4m3fn, Format::e5m2, Format::bf16, BiasMode::none, 200, 130, 520);
    const cpu::FastGemmB packed(c.spec, c.g, c.bt.data());
    check_case(c, "M=200 N=130 K=520 packed B " + c.spec.describe(), &packed);
  }
  // A decode-sized product: M = 1 over K = 7168 (56 blockwise groups of two chunks), N = 300 (a column tail of 0).
  const Case d = make_case(rng, GemmScaling::blockwise, Format::e4m3fn, Format::e4m3fn, Format::bf16, BiasMode::none, 1, 300, 7168);
  check_case(d, "decode M=1 K=7168 blockwise");
  const cpu::FastGemmB dp(d.spec, d.g, d.bt.data());
  check_case(d, "decode M=1 K=7168 blockwise, packed B", &dp);
  cpu::set_gemm16_max_m_for_test(-1);
}

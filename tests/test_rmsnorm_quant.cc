// rmsnorm_quant: the exact pieces of the reference against independent computations (mean of squares on rows
// whose exact answer is known, the correctly rounded rsqrt against a long-double estimate plus exact midpoint
// checks), the conventions' field values, bad input, and the CPU backend bit-identical to the reference over random
// rows of many magnitudes, zero rows, NaN/Inf, ±max, group tails, residual on/off, every convention and every field
// value. The numpy + ml_dtypes + fractions oracle is tests/python/test_rmsnorm_quant_oracle.py.
#include <doctest/doctest.h>
#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cpu/rmsnorm_quant_avx512.h"
#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/io.h"
#include "fp8ref/rmsnorm.h"
#include "support/simd_targets.h"

using namespace fp8ref;

namespace {

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }
// f32 -> bf16 RNE by integer arithmetic on the bits, as an f32 (finite inputs: the oracle of the passes' y)
float bf16_rne(float f) {
  const uint32_t b = bits_of(f);
  return f32_of(((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16) << 16);
}

RmsNormQuantSpec spec_for(const char* name, Format to, std::vector<std::pair<std::string, std::string>> ov = {}) {
  std::string err;
  auto s = resolve_rmsnorm_quant_convention(name, to, &err);
  REQUIRE_MESSAGE(s.has_value(), err);
  for (auto& [k, v] : ov) REQUIRE_MESSAGE(apply_rmsnorm_override(k, v, &*s, &err), err);
  finalize_rmsnorm_quant_spec(&*s);
  return *s;
}

// Source values as `from` bytes.
std::vector<uint8_t> encode_as(Format from, const std::vector<float>& v) {
  const size_t es = from == Format::f32 ? 4 : 2;
  std::vector<uint8_t> out(v.size() * es);
  for (size_t i = 0; i < v.size(); ++i) {
    if (from == Format::f32) {
      std::memcpy(&out[4 * i], &v[i], 4);
    } else {
      const uint16_t h = static_cast<uint16_t>(ref::narrow(Format::f32, bits_of(v[i]), from));
      std::memcpy(&out[2 * i], &h, 2);
    }
  }
  return out;
}

struct Outputs {
  std::vector<uint8_t> q, scales, res;
  std::vector<float> normed, rms;  // rms: each row's r = rsqrt(var + eps) (order-sensitive: the cub partial chains)
};

Outputs run(bool cpu, const RmsNormQuantSpec& spec, Format from, const std::vector<uint8_t>& x,
            const std::vector<uint8_t>& w, const std::vector<uint8_t>* res, std::vector<int64_t> shape, bool normed,
            cpu::RmsNormPath path = cpu::RmsNormPath::automatic) {
  RmsNormQuantArgs a;
  a.from = from;
  a.shape = shape;
  a.weight_shape = {shape.back()};
  const RmsNormLayout L = rmsnorm_layout(spec, from, shape, a.weight_shape, res ? &shape : nullptr);
  Outputs o;
  o.q.assign(static_cast<size_t>(L.quant.n_elems), 0xAA);
  o.scales.assign(static_cast<size_t>(L.quant.n_scales) * (format_info(scale_storage(spec.quant)).bits / 8), 0xAA);
  a.x = x.data();
  a.weight = w.data();
  a.q = o.q.data();
  a.scales = o.scales.data();
  if (res) {
    a.residual = res->data();
    o.res.assign(res->size(), 0xAA);
    a.residual_out = o.res.data();
  }
  if (normed) {
    o.normed.assign(static_cast<size_t>(L.quant.n_elems), -1.0f);
    a.normed = o.normed.data();
  }
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  o.rms.assign(static_cast<size_t>(rows), -1.0f);
  a.rms = o.rms.data();
  if (cpu) cpu::rmsnorm_quant(spec, a, path);
  else ref::rmsnorm_quant(spec, a);
  return o;
}

// Rows of many magnitudes: row m has scale 2^e with e spread over [-60, 60], normal-ish values; some rows zero;
// NaN / ±Inf / ±max sprinkled when `special`.
std::vector<float> make_rows(std::mt19937_64& rng, int64_t M, int64_t K, Format from, bool special) {
  std::vector<float> v(static_cast<size_t>(M * K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const float big = from == Format::f16 ? 65504.0f : from == Format::bf16 ? f32_of(0x7F7F0000u) : f32_of(0x7F7FFFFFu);
  for (int64_t m = 0; m < M; ++m) {
    const int kind = static_cast<int>(rng() % 8);
    const int e = static_cast<int>(rng() % 121) - 60;
    for (int64_t k = 0; k < K; ++k) {
      float x = std::ldexp(nd(rng), from == Format::f16 ? e / 5 : e);
      if (kind == 0) x = 0.0f;
      if (kind == 1 && k % 3 == 0) x = (rng() & 1) ? big : -big;       // ±max: squares overflow f32
      if (kind == 2 && k % 7 == 0) x = 0.0f;                              // a few zeros
      if (special && kind == 3 && rng() % 50 == 0) x = std::nanf("");
      if (special && kind == 4 && rng() % 60 == 0) x = (rng() & 1) ? HUGE_VALF : -HUGE_VALF;
      if (kind == 5) x = std::ldexp(nd(rng), -140);                       // tiny: squares far below f32
      v[static_cast<size_t>(m * K + k)] = x;
    }
  }
  return v;
}

}  // namespace

TEST_CASE("rmsnorm_quant: exact mean of squares on rows with known answers") {
  auto ms = [](std::vector<float> z) { return ref::mean_square_exact(z.data(), static_cast<int64_t>(z.size())); };
  CHECK(ms({1, 2}) == 2.5f);
  CHECK(ms({3, 3, 3}) == 9.0f);
  CHECK(ms({0, 0, -0.0f}) == 0.0f);
  // (1 + 2^-60) / 2 = 0.5 + 2^-61: far below half an ulp of 0.5
  CHECK(ms({1, std::ldexp(1.0f, -30)}) == 0.5f);
  // {2^12, 1, 2^-13, 0}: Σ/4 = 2^22 + 2^-2 + 2^-28, just above the midpoint 2^22 + 2^-2 (f32 ulp 0.5 there) -> up;
  // an f32 running sum would lose the 1 (2^24 + 1 ties to 2^24) and give 2^22.
  CHECK(ms({4096, 1, std::ldexp(1.0f, -13), 0}) == 4194304.5f);
  // huge: (2^100)² / 2 = 2^199 overflows f32 -> +Inf; tiny: (2^-149)² = 2^-298 -> +0
  CHECK(std::isinf(ms({std::ldexp(1.0f, 100), 0})));
  CHECK(ms({std::ldexp(1.0f, -149)}) == 0.0f);
  // f32 subnormal result: z = 2^-70 -> 2^-140 (subnormal, exact)
  CHECK(ms({std::ldexp(1.0f, -70)}) == std::ldexp(1.0f, -140));
  CHECK(std::isnan(ms({1, std::nanf("")})));
  CHECK(std::isinf(ms({1, -HUGE_VALF})));
  // integers: Σ exact in f64 below 2^53, RN32(Σ/n) from a long-double quotient (64-bit: rounds like the exact
  // quotient unless within 2^-64 of an f32 midpoint, which n = 7 cannot produce: midpoints have denominators 2^k)
  std::mt19937_64 rng(7);
  for (int t = 0; t < 2000; ++t) {
    std::vector<float> z(7);
    long double s = 0;
    for (float& v : z) {
      v = static_cast<float>(static_cast<int>(rng() % 20001) - 10000);
      s += static_cast<long double>(v) * v;
    }
    CHECK(ms(z) == static_cast<float>(s / 7));
  }
}

TEST_CASE("rmsnorm_quant: correctly rounded rsqrt") {
  CHECK(ref::rsqrt_rn(4.0f) == 0.5f);
  CHECK(ref::rsqrt_rn(0.25f) == 2.0f);
  CHECK(ref::rsqrt_rn(1.0f) == 1.0f);
  CHECK(std::isinf(ref::rsqrt_rn(0.0f)));
  CHECK(ref::rsqrt_rn(HUGE_VALF) == 0.0f);
  CHECK(std::isnan(ref::rsqrt_rn(std::nanf(""))));
  // Against a long-double estimate (correct unless 1/sqrt(u) is within ~2^-63 relative of an f32 midpoint) over
  // random f32 u of every exponent, subnormals included; and 1/sqrtf (two roundings) differs for some.
  std::mt19937_64 rng(11);
  int differ_ieee = 0;
  for (int t = 0; t < 200000; ++t) {
    const uint32_t b = static_cast<uint32_t>(rng() % 0x7F800000u);
    const float u = f32_of(b);
    if (u == 0) continue;
    const float want = static_cast<float>(1.0L / std::sqrt(static_cast<long double>(u)));
    const float got = ref::rsqrt_rn(u);
    if (got != want) FAIL("u bits " << b << " got " << got << " want " << want);
    differ_ieee += (1.0f / std::sqrt(u)) != got;
  }
  CHECK(differ_ieee > 0);
}

TEST_CASE("rmsnorm_quant: conventions and overrides") {
  const RmsNormQuantSpec v = spec_for("vllm-rmsnorm-quant", Format::e4m3fn);
  CHECK(v.variance == Variance::cub);
  CHECK(v.weight == NormWeight::dtype_twice);
  CHECK(v.quant.formula == QuantFormula::div);
  CHECK(v.quant.clamp == Clamp::nan_to_max);
  CHECK(v.quant.min_scale.has_value());
  CHECK(to_string(v.quant.granularity) == "group:128");
  CHECK(spec_for("vllm-rmsnorm-quant", Format::e4m3fnuz).quant.fp8_max == 224.0f);
  const RmsNormQuantSpec a = spec_for("aiter-rmsnorm-quant", Format::e4m3fnuz);
  CHECK(a.quant.fp8_max == 240.0f);
  CHECK(a.quant.formula == QuantFormula::mul_rcp);
  CHECK(a.weight == NormWeight::f32);
  CHECK(spec_for("deepseek-rmsnorm", Format::e4m3fn).weight == NormWeight::dtype_once);
  CHECK(spec_for("exact", Format::e5m2, {{"group", "64"}, {"variance", "cub:128"}}).describe().find("variance=cub:128") !=
        std::string::npos);
  std::string err;
  CHECK_FALSE(resolve_rmsnorm_quant_convention("nope", Format::e4m3fn, &err).has_value());
  CHECK(err.find("aiter-rmsnorm-quant") != std::string::npos);
  CHECK_FALSE(resolve_rmsnorm_quant_convention("vllm-rmsnorm-quant", Format::e5m2, &err).has_value());
  RmsNormQuantSpec s = spec_for("exact", Format::e4m3fn);
  CHECK_FALSE(apply_rmsnorm_override("variance", "cub:0", &s, &err));
  CHECK_FALSE(apply_rmsnorm_override("eps", "-1", &s, &err));
  CHECK_FALSE(apply_rmsnorm_override("weight", "bf16", &s, &err));
  CHECK_FALSE(apply_rmsnorm_override("frobnicate", "1", &s, &err));
  CHECK(apply_rmsnorm_override("granularity", "block:128x128", &s, &err));
  CHECK_THROWS_AS(finalize_rmsnorm_quant_spec(&s), InputError);
}

TEST_CASE("rmsnorm_quant: bad shapes") {
  const RmsNormQuantSpec s = spec_for("vllm-rmsnorm-quant", Format::e4m3fn);
  const std::vector<int64_t> res = {4, 256}, bad_res = {4, 128};
  CHECK_THROWS_AS(rmsnorm_layout(s, Format::bf16, {4, 256}, {255}, nullptr), InputError);
  CHECK_THROWS_AS(rmsnorm_layout(s, Format::bf16, {4, 256}, {256}, &bad_res), InputError);
  CHECK_THROWS_AS(rmsnorm_layout(s, Format::bf16, {4, 200}, {200}, nullptr), InputError);  // 200 % 128 != 0
  CHECK_THROWS_AS(rmsnorm_layout(s, Format::e4m3fn, {4, 256}, {256}, nullptr), InputError);
  CHECK_THROWS_AS(rmsnorm_layout(s, Format::bf16, {}, {}, nullptr), InputError);
  const RmsNormQuantSpec t = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"tail", "partial"}});
  CHECK_THROWS_AS(rmsnorm_layout(t, Format::bf16, {4, 130}, {130}, nullptr), InputError);  // cub: K % 4
  CHECK(rmsnorm_layout(t, Format::bf16, {300, 132}, {132}, nullptr).cub_threads == 132);
  CHECK(rmsnorm_layout(t, Format::bf16, {4, 256}, {256}, &res).cub_threads == 256);
  CHECK(rmsnorm_layout(t, Format::bf16, {300, 1024}, {1024}, nullptr).cub_threads == 256);
  CHECK(rmsnorm_layout(t, Format::bf16, {256, 1024}, {1024}, nullptr).cub_threads == 512);
}

TEST_CASE("rmsnorm_quant: the vLLM cub order differs from a sequential sum and is what the reference uses") {
  // A row where the order matters: 1 followed by many tiny values — a sequential f32 sum drops each tiny square,
  // the per-thread chains keep them together.
  const int64_t K = 1024;
  std::vector<float> z(K, std::ldexp(1.0f, -13));
  z[0] = 1.0f;
  const RmsNormQuantSpec seq = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"variance", "f32-seq"}});
  const RmsNormQuantSpec cub = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"variance", "cub:256"}});
  const std::vector<uint8_t> x = encode_as(Format::f32, z), w = encode_as(Format::f32, std::vector<float>(K, 1.0f));
  const Outputs a = run(false, seq, Format::f32, x, w, nullptr, {1, K}, true);
  const Outputs b = run(false, cub, Format::f32, x, w, nullptr, {1, K}, true);
  // Σ = 1 + 1023·2^-26: sequential adds 2^-26 to ~1 (half an ulp of 1 is 2^-24): every one lost -> v = 1/1024.
  // cub: thread 0 holds 1 + 3·2^-26, the others 4·2^-26 each, summed in trees: the tiny terms survive.
  CHECK(a.normed[1] != b.normed[1]);
}

TEST_CASE("rmsnorm_quant: cpu cub partials keep each thread's element order (bf16 rows, every SIMD target)") {
  // Each vec4 is a permutation of (1, 2^-12, 1.25·2^-12, 0): a chain 0 + 1 + 2^-24 + 1.5625·2^-24 gives 1 + 2^-23
  // (the tie 1 + 2^-24 goes to 1), the order 1, 1.5625·2^-24, 2^-24 gives 1 + 2^-22 (the tie goes up to even) — so
  // the sum depends on the order within a thread's vec4. Row m uses the m-th of the 24 permutations in every vec4;
  // the rows' r (rsqrt of the variance) are compared bit for bit: any lane reordering of the vectorised chains shows.
  const int64_t K = 512, M = 24;
  const float vals[4] = {1.0f, std::ldexp(1.0f, -12), 1.25f * std::ldexp(1.0f, -12), 0.0f};
  int perm[4] = {0, 1, 2, 3};
  std::vector<float> xv(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xv[static_cast<size_t>(m * K + k)] = vals[perm[k % 4]];
    std::next_permutation(perm, perm + 4);
  }
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, std::vector<float>(K, 1.0f));
  for (const char* variance : {"cub:1024", "cub:32", "cub:20"}) {
    const RmsNormQuantSpec spec = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"variance", variance}});
    const Outputs a = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    CHECK(std::set<float>(a.rms.begin(), a.rms.end()).size() > 1);  // the data is order-sensitive
    fp8ref::test::for_test_targets([&] {
      const Outputs b = run(true, spec, Format::bf16, x, w, nullptr, {M, K}, false);
      INFO(variance << " SIMD target " << fp8ref::cpu::simd_target());
      CHECK(std::memcmp(a.rms.data(), b.rms.data(), a.rms.size() * 4) == 0);
      CHECK(a.q == b.q);
    });
  }
}

// Quant specs off the fused path with row-local scales: the cpu backend quantizes each row right after normalising
// it (cpu::quantize on [1, K]); the rows' scales land at their rows whatever their element size. The CLI offers f32
// scales only; the C++ API takes any quant spec.
TEST_CASE("rmsnorm_quant: cpu row-by-row group quant off the fused path (ue8m0 and bf16 scales, a row with an Inf)") {
  struct Q {
    ScaleDtype dtype;
    std::vector<std::pair<std::string, std::string>> ov;
  };
  const std::vector<Q> quant_ov = {
      {ScaleDtype::ue8m0, {{"scale-round", "pow2-ceil"}}},
      {ScaleDtype::bf16, {{"granularity", "group:64"}}},
  };
  std::mt19937_64 rng(37);
  for (const char* conv : {"vllm-rmsnorm-quant", "deepseek-rmsnorm"}) {
    for (const Q& qo : quant_ov) {
      RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn);
      std::string err;
      spec.quant.scale_dtype = qo.dtype;
      for (const auto& [k, v] : qo.ov) REQUIRE_MESSAGE(apply_quant_override(k, v, &spec.quant, &err), err);
      finalize_rmsnorm_quant_spec(&spec);
      const int64_t M = 9, K = 256;
      std::vector<float> xv = make_rows(rng, M, K, Format::bf16, true);
      xv[static_cast<size_t>(4 * K + 7)] = INFINITY;  // a row of NaN y
      std::vector<float> wv(static_cast<size_t>(K));
      std::normal_distribution<float> nd(1.0f, 0.5f);
      for (float& w : wv) w = nd(rng);
      const std::vector<float> rv = make_rows(rng, M, K, Format::bf16, true);
      const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
      for (bool with_res : {false, true}) {
        INFO(conv << " " << spec.describe() << " residual " << with_res);
        const Outputs a = run(false, spec, Format::bf16, x, w, with_res ? &r : nullptr, {M, K}, false);
        const Outputs b = run(true, spec, Format::bf16, x, w, with_res ? &r : nullptr, {M, K}, false);
        CHECK(a.q == b.q);
        CHECK(a.scales == b.scales);
        CHECK(a.res == b.res);
      }
    }
  }
}

TEST_CASE("rmsnorm_quant: cpu backend bit-identical to the reference, every SIMD target") {
  struct Case {
    const char* convention;
    Format to;
    std::vector<std::pair<std::string, std::string>> ov;
  };
  const std::vector<Case> cases = {
      {"exact", Format::e4m3fn, {}},
      {"exact", Format::e5m2, {{"group", "64"}}},
      {"exact", Format::e4m3fnuz, {{"rsqrt", "ieee"}, {"weight", "dtype-twice"}}},
      {"aiter-rmsnorm-quant", Format::e4m3fn, {}},
      {"aiter-rmsnorm-quant", Format::e4m3fnuz, {{"variance", "f32-seq"}}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"group", "64"}, {"variance", "cub:100"}}},
      {"vllm-rmsnorm-quant", Format::e4m3fnuz, {{"residual-sum", "dtype"}, {"variance", "cub:37"}}},
      {"deepseek-rmsnorm", Format::e4m3fn, {}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"weight", "dtype-once"}}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"granularity", "row"}, {"eps", "0"}}},
      {"aiter-rmsnorm-quant", Format::e4m3fn, {{"tail", "partial"}, {"amax-nan", "propagate"}, {"clamp", "nan-kept"}}},
      {"exact", Format::e4m3fn, {{"tail", "partial"}, {"variance", "f32-seq"}, {"weight", "dtype-once"}}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"guard", "none"}, {"formula", "x*(1/s)"}, {"scale-formula", "amax*(1/max)"}}},
      // fp8-max 200, an e4m3 midpoint (192 | 208): a group's largest quotient RN(amax/s) above 200 takes the clamp
      // to code 192 where the cast alone gives 208 — the AVX2 loop's clamp-free form must not be chosen there
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"fp8-max", "200"}}},
      {"vllm-rmsnorm-quant", Format::e4m3fn, {{"fp8-max", "200"}, {"formula", "x*(1/s)"}}},
  };
  std::mt19937_64 rng(2026);
  int compared = 0;
  for (const Case& c : cases) {
    const RmsNormQuantSpec spec = spec_for(c.convention, c.to, c.ov);
    for (Format from : {Format::bf16, Format::f32, Format::f16}) {
      for (bool with_res : {false, true}) {
        const bool tail = spec.quant.tail == TailPolicy::partial;
        const bool cub = spec.variance == Variance::cub;
        const int64_t K = tail ? (cub ? 300 : 301) : 512, M = 24;
        const std::vector<int64_t> shape = {2, M / 2, K};
        const std::vector<float> xv = make_rows(rng, M, K, from, true);
        std::vector<float> wv(static_cast<size_t>(K));
        std::normal_distribution<float> nd(1.0f, 0.5f);
        for (float& w : wv) w = nd(rng);
        wv[3] = 0.0f;
        const std::vector<float> rv = make_rows(rng, M, K, from, true);
        const auto x = encode_as(from, xv), w = encode_as(from, wv), r = encode_as(from, rv);
        const std::vector<uint8_t>* rp = with_res ? &r : nullptr;
        for (bool normed : {false, true}) {
          const Outputs a = run(false, spec, from, x, w, rp, shape, normed);
          INFO("convention " << c.convention << " " << spec.describe() << " from " << format_name(from)
                             << " residual " << with_res << " normed " << normed);
          // on every SIMD target this build dispatches to (a CPU without AVX-512 runs the others)
          const auto targets = fp8ref::test::for_test_targets([&] {
            const Outputs b = run(true, spec, from, x, w, rp, shape, normed);
            INFO("SIMD target " << fp8ref::cpu::simd_target());
            CHECK(a.q == b.q);
            CHECK(a.scales == b.scales);
            CHECK(a.res == b.res);
            CHECK(std::memcmp(a.rms.data(), b.rms.data(), a.rms.size() * 4) == 0);
            if (normed) CHECK(std::memcmp(a.normed.data(), b.normed.data(), a.normed.size() * 4) == 0);
          });
          CHECK(!targets.empty());
          ++compared;
        }
      }
    }
  }
  CHECK(compared == static_cast<int>(cases.size()) * 3 * 2 * 2);
}

TEST_CASE("rmsnorm_quant: cpu == reference on bf16 rows under weights of every magnitude (2^-40 .. 2^40), group 128") {
  // The AVX2 and AVX-512 paths of bf16 rows (the split, the ordered loop, the row quantizer, the fused passes) at the
  // production group size, under weights spread over 80 binades (products that underflow, that reach the split's
  // range edges, ±0 weights) and rows of mixed magnitudes down to bf16 subnormals — session 37's split lost the sign of
  // an underflowed product here, unseen by the N(1, 0.5) weights of the cases above; and on the targets without FMA
  // (SSE4, SSSE3, scalar) the fast x/s by MarksteinDiv1 with an unfused MulAdd coded a quotient at an e4m3 tie one
  // code low (fp8_lanes::FastDiv divides there now). Every convention, weight mode and residual-sum, scale dtypes where
  // the preset has them; every SIMD target.
  struct Case {
    const char* convention;
    std::optional<ScaleDtype> dt;
    std::vector<std::pair<std::string, std::string>> ov;
  };
  const std::vector<Case> cases = {
      {"vllm-rmsnorm-quant", std::nullopt, {}},
      {"vllm-rmsnorm-quant", std::nullopt, {{"weight", "dtype-once"}}},
      {"vllm-rmsnorm-quant", std::nullopt, {{"residual-sum", "dtype"}}},
      {"aiter-rmsnorm-quant", std::nullopt, {}},
      {"deepseek-rmsnorm", std::nullopt, {}},
      {"deepseek-rmsnorm", ScaleDtype::ue8m0, {{"weight", "dtype-twice"}}},
      {"exact", ScaleDtype::bf16, {{"weight", "dtype-twice"}, {"guard", "amax-floor:1e-20"}}},
      {"exact", std::nullopt, {{"weight", "dtype-once"}, {"guard", "min-scale:1e-30"}}},
  };
  std::mt19937_64 rng(38);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t M = 16, K = 512;
  int compared = 0;
  for (const Case& c : cases) {
    std::string err;
    auto spec = resolve_rmsnorm_quant_convention(c.convention, Format::e4m3fn, &err, c.dt);
    REQUIRE_MESSAGE(spec.has_value(), err);
    for (auto& [k, v] : c.ov) REQUIRE_MESSAGE(apply_rmsnorm_override(k, v, &*spec, &err), err);
    finalize_rmsnorm_quant_spec(&*spec);
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<float> xv(static_cast<size_t>(M * K)), rv(xv.size()), wv(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) {
        const int e = static_cast<int>(rng() % 81) - 40;
        wv[static_cast<size_t>(k)] = rng() % 23 == 0 ? ((rng() & 1) ? -0.0f : 0.0f) : std::ldexp(nd(rng), e);
      }
      for (int64_t m = 0; m < M; ++m) {
        const int kind = static_cast<int>(rng() % 4);
        const int e = kind == 0 ? -128 - static_cast<int>(rng() % 6) : static_cast<int>(rng() % 61) - 50;
        for (int64_t k = 0; k < K; ++k) {
          // kind 1: one large value among tiny ones (z·r of the rest subnormal); kind 2: magnitudes mixed per element
          float x = std::ldexp(nd(rng), kind == 2 ? e - static_cast<int>(rng() % 90) : e);
          if (kind == 1) x = k == static_cast<int64_t>(rng() % K) ? std::ldexp(nd(rng), 10) : std::ldexp(nd(rng), -128);
          xv[static_cast<size_t>(m * K + k)] = x;
          rv[static_cast<size_t>(m * K + k)] = std::ldexp(nd(rng), e - 3);
        }
      }
      const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
      for (bool with_res : {false, true}) {
        const std::vector<uint8_t>* rp = with_res ? &r : nullptr;
        const Outputs want = run(false, *spec, Format::bf16, x, w, rp, {M, K}, false);
        INFO(spec->describe() << " residual " << with_res << " rep " << rep);
        const auto targets = fp8ref::test::for_test_targets([&] {
          for (auto path : {cpu::RmsNormPath::automatic, cpu::RmsNormPath::highway}) {
            const Outputs got = run(true, *spec, Format::bf16, x, w, rp, {M, K}, false, path);
            INFO("SIMD target " << std::string(fp8ref::cpu::simd_target()) << " automatic " << (path == cpu::RmsNormPath::automatic));
            CHECK(got.q == want.q);
            CHECK(got.scales == want.scales);
            CHECK(got.res == want.res);
          }
        });
        CHECK(!targets.empty());
        ++compared;
      }
    }
  }
  CHECK(compared == static_cast<int>(cases.size()) * 3 * 2);
}

TEST_CASE("rmsnorm_quant: cpu AVX-512 BF16 passes next to the f32 subnormal range (their row guard), every z kind") {
  // vcvtne2ps2bf16 flushes subnormal inputs to ±0, so the passes decline a row where a nonzero z·r (or a product)
  // falls below 2^-126. Rows of 4 groups of 64: group 0 normal values (r ~ 1), group 1 alternately ±2^-128·(1 + j/8)
  // (z·r subnormal) and ±2^-118·(1 + j/8) under weights 2^100 — y ~ 2^-28 and 2^-18, so a flushed bf16(z·r) changes
  // visible codes (vLLM's dtype-twice) —, group 2 the same magnitudes at the 2^-126 boundary (2^-126·(1 ± 2^-7)),
  // group 3 with z = x + residual cancelling to 2^-128 (x = 2^-120, residual = −(2^-120 − 2^-128)). Compared with
  // the reference on the automatic path (the passes where the CPU has them) and on the Highway path.
  const int64_t K = 256, M = 6;
  std::vector<float> xv(static_cast<size_t>(M * K)), rv(static_cast<size_t>(M * K), 0.0f), wv(static_cast<size_t>(K));
  std::mt19937_64 rng(77);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(m * K + k);
      const float sg = (k / 2) % 2 ? -1.0f : 1.0f, f = 1.0f + static_cast<float>((k + m) % 8) / 8.0f;
      if (k < 64) xv[i] = nd(rng);
      else if (k < 128) xv[i] = sg * f * (k % 2 ? 0x1p-118f : 0x1p-128f);
      else if (k < 192) xv[i] = sg * (k % 2 ? 0x1p-118f : 0x1p-126f * (m % 2 ? 1.0f + 0x1p-7f : 1.0f - 0x1p-7f));
      else if (m >= 3 && k % 2 == 0) xv[i] = 0x1p-120f, rv[i] = -(0x1p-120f - 0x1p-128f);
      else xv[i] = nd(rng);
    }
  for (int64_t k = 0; k < K; ++k) wv[static_cast<size_t>(k)] = k >= 64 && k < 192 ? 0x1p100f : 1.0f + 0.25f * nd(rng);
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
  struct Case {
    const char* convention;
    std::vector<std::pair<std::string, std::string>> ov;
  };
  const std::vector<Case> cases = {{"vllm-rmsnorm-quant", {}},
                                   {"vllm-rmsnorm-quant", {{"residual-sum", "dtype"}}},
                                   {"vllm-rmsnorm-quant", {{"group", "64"}, {"weight", "dtype-once"}}},
                                   {"vllm-rmsnorm-quant", {{"weight", "dtype-once"}, {"residual-sum", "dtype"}}},
                                   {"vllm-rmsnorm-quant", {{"group", "64"}, {"formula", "x*(1/s)"}}}};
  int visible = 0;
  for (const Case& c : cases)
    for (bool with_res : {false, true}) {
      const RmsNormQuantSpec spec = spec_for(c.convention, Format::e4m3fn, c.ov);
      INFO(spec.describe() << " residual " << with_res);
      const std::vector<uint8_t>* rp = with_res ? &r : nullptr;
      const Outputs want = run(false, spec, Format::bf16, x, w, rp, {M, K}, false);
      for (auto path : {cpu::RmsNormPath::automatic, cpu::RmsNormPath::highway}) {
        const Outputs got = run(true, spec, Format::bf16, x, w, rp, {M, K}, false, path);
        CHECK(got.q == want.q);
        CHECK(got.scales == want.scales);
        CHECK(got.res == want.res);
      }
      // the tiny z's codes are not all zero: a flushed bf16(z·r) would show
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 64; k < 128; k += 2) visible += (want.q[static_cast<size_t>(m * K + k)] & 0x7F) != 0;
    }
  CHECK(visible > 100);
  // A product below 2^-126 with z·r normal: weights 2^-119 on group 0 (G = 64) of rows alternating ~1 and ~2^-8, so
  // y = bf16(bf16(z·r)·w) is normal and subnormal in turn; without the guard on the scale (s ~ 2^-128) and with
  // x·(1/s) that group is still fast and the subnormal y give codes near 1.75.
  const int64_t K2 = 128, M2 = 4;
  std::vector<float> x2(static_cast<size_t>(M2 * K2)), w2(static_cast<size_t>(K2));
  for (int64_t m = 0; m < M2; ++m)
    for (int64_t k = 0; k < K2; ++k)
      x2[static_cast<size_t>(m * K2 + k)] = k < 64 ? (k % 2 ? 0x1p-8f : 1.0f) * (1.0f + static_cast<float>((k + m) % 8) / 8.0f)
                                              : nd(rng);
  for (int64_t k = 0; k < K2; ++k) w2[static_cast<size_t>(k)] = k < 64 ? 0x1p-119f : 1.0f;
  const RmsNormQuantSpec spec2 =
      spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"group", "64"}, {"guard", "none"}, {"formula", "x*(1/s)"}});
  const auto xb2 = encode_as(Format::bf16, x2), wb2 = encode_as(Format::bf16, w2);
  const Outputs want2 = run(false, spec2, Format::bf16, xb2, wb2, nullptr, {M2, K2}, false);
  for (auto path : {cpu::RmsNormPath::automatic, cpu::RmsNormPath::highway}) {
    const Outputs got = run(true, spec2, Format::bf16, xb2, wb2, nullptr, {M2, K2}, false, path);
    CHECK(got.q == want2.q);
    CHECK(got.scales == want2.scales);
  }
  int visible2 = 0;
  for (int64_t m = 0; m < M2; ++m)
    for (int64_t k = 1; k < 64; k += 2) visible2 += (want2.q[static_cast<size_t>(m * K2 + k)] & 0x7F) != 0;
  CHECK(visible2 == M2 * 32);
}

TEST_CASE("rmsnorm_quant: the AVX-512 BF16 plan's weights (lane order, smallest nonzero |w|) over zeros, Inf, NaN") {
  // make_plan permutes the weights into the passes' lane order and takes the smallest nonzero finite |w| for the
  // row guard (+Inf when there is none), both in lanes. Checked per mode and z kind on weight sets with ±0, ±Inf,
  // NaN, subnormals and the extremes anywhere in a chunk: the minimum against a scalar scan, the order by the norm
  // pass, whose y (put back in element order by the plan's byte index) must be bf16(bf16(x·r)·w) (dtype-twice) or
  // bf16(x·r·w) (dtype-once) of each element's own weight.
  if (!cpu::cpu_has_avx512bf16()) {
    MESSAGE("this CPU has no AVX-512 BF16: nothing to check");
    return;
  }
  const size_t K = 256;
  std::mt19937_64 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto bf = [](float f) { return f32_of(bits_of(f) & 0xFFFF0000u); };
  for (int set = 0; set < 6; ++set) {
    auto wf = hwy::AllocateAligned<float>(K), wperm = hwy::AllocateAligned<float>(K);
    for (size_t k = 0; k < K; ++k) wf[k] = bf(1.0f + 0.25f * nd(rng));
    const size_t at = static_cast<size_t>(rng() % K);
    switch (set) {
      case 0: break;
      case 1: wf[at] = bf(0x1p-130f); wf[(at + 7) % K] = -0.0f; break;                 // a subnormal, a −0
      case 2: wf[at] = -0x1p-3f; wf[(at + 1) % K] = INFINITY; wf[(at + 2) % K] = NAN; break;
      case 3: for (size_t k = 0; k < K; ++k) wf[k] = k % 3 ? 0.0f : -0.0f; break;        // no nonzero weight
      case 4: for (size_t k = 0; k < K; ++k) wf[k] = k % 2 ? NAN : -INFINITY; break;     // none finite
      case 5: wf[at] = 0x1.fep127f; wf[(at + 33) % K] = f32_of(1); break;               // the largest, the smallest
    }
    float want = INFINITY;
    for (size_t k = 0; k < K; ++k)
      if (std::fabs(wf[k]) > 0.0f && std::fabs(wf[k]) < want) want = std::fabs(wf[k]);
    for (int mode : {1, 2})
      for (auto zk : {cpu::rq512::ZKind::bf16, cpu::rq512::ZKind::f32}) {
        INFO("set " << set << " mode " << mode << " zkind " << static_cast<int>(zk));
        cpu::rq512::Plan plan;
        cpu::rq512::make_plan(mode, zk, wf.get(), K, wperm.get(), &plan);
        CHECK(bits_of(plan.wmin) == bits_of(want));
        uint32_t want_max = 0;
        for (size_t k = 0; k < K; ++k) want_max = std::max(want_max, bits_of(wf[k]) & 0x7FFFFFFFu);
        CHECK(plan.wmax_bits == want_max);
        if (set != 0 && set != 2) continue;  // (the norm pass declines rows with subnormal products or NaN/Inf groups)
        std::vector<uint16_t> x(K);
        auto zf = hwy::AllocateAligned<float>(K);
        for (size_t k = 0; k < K; ++k) {
          x[k] = static_cast<uint16_t>(bits_of(nd(rng)) >> 16);
          zf[k] = f32_of(static_cast<uint32_t>(x[k]) << 16);
        }
        if (set == 2) wf[(at + 1) % K] = wf[(at + 2) % K] = 1.0f;  // (finite for the y check, after the minimum)
        if (set == 2) cpu::rq512::make_plan(mode, zk, wf.get(), K, wperm.get(), &plan);
        auto y = hwy::AllocateAligned<uint16_t>(K);
        float gmax[2];
        const float r = 0.8125f;
        REQUIRE(cpu::rq512::norm_pass(plan, x.data(), nullptr, zf.get(), K, 128, r, y.get(), gmax));
        int bad = 0;
        for (size_t c = 0; c < K; c += 32)
          for (size_t e = 0; e < 32; ++e) {
            const uint16_t got = y[c + plan.idxb[e] / 2];  // (idxb[e]: byte 2j of the chunk's words)
            const float a = zf[c + e] * r;
            const float want_y = mode == 1 ? bf16_rne(bf16_rne(a) * wf[c + e]) : bf16_rne(a * wf[c + e]);
            bad += got != static_cast<uint16_t>(bits_of(want_y) >> 16);
          }
        CHECK(bad == 0);
        if (set == 2) wf[(at + 1) % K] = INFINITY, wf[(at + 2) % K] = NAN;
      }
  }
}

TEST_CASE("rmsnorm_quant: the AVX-512 passes' group maxima (f32 max |y|) for 1 to 57 groups, a NaN or Inf in any group") {
  // norm_pass (from bf16 |y| words) and amax_pass (f32 |y|) write each group's max |y| as an f32 straight into the
  // caller's group maxima (no conversion loop after the pass): each must be the scalar max |y| of its own group, and
  // nothing past the last group written; a NaN or an Inf in any one group — the first, the 16th, the middle, the last —
  // declines the row.
  if (!cpu::cpu_has_avx512bf16()) {
    MESSAGE("this CPU has no AVX-512 BF16: nothing to check");
    return;
  }
  std::mt19937_64 rng(57);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t G : {32, 64, 128})
    for (size_t ng : {1, 2, 15, 16, 17, 31, 32, 33, 56, 57}) {
      if (G == 32 && ng > 33) continue;
      const size_t K = G * ng;
      INFO("G " << G << " groups " << ng);
      auto wf = hwy::AllocateAligned<float>(K), wperm = hwy::AllocateAligned<float>(K);
      std::vector<uint16_t> x(K);
      for (size_t k = 0; k < K; ++k) {
        wf[k] = f32_of(bits_of(1.0f + 0.25f * nd(rng)) & 0xFFFF0000u);
        // magnitudes 2^-20 .. 2^20 that differ from group to group
        x[k] = static_cast<uint16_t>(bits_of(nd(rng) * std::ldexp(1.0f, static_cast<int>((k / G * 7) % 41) - 20)) >> 16);
      }
      const float r = 0.8125f;
      for (int mode : {1, 0}) {
        if (mode == 0 && G % 64) continue;  // (amax_pass: G % 64 == 0)
        cpu::rq512::Plan plan;
        std::vector<uint8_t> wsign(K);
        cpu::rq512::make_plan(mode, cpu::rq512::ZKind::bf16, wf.get(), K, wperm.get(), &plan, wsign.data());
        plan.flush_ok = true;
        std::vector<float> want(ng, 0.0f), got(ng + 1, -1.0f);
        for (size_t k = 0; k < K; ++k) {
          const float z = f32_of(static_cast<uint32_t>(x[k]) << 16), a = z * r;
          const float y = mode == 1 ? bf16_rne(bf16_rne(a) * wf[k]) : a * wf[k];
          want[k / G] = std::max(want[k / G], std::fabs(y));
        }
        auto y = hwy::AllocateAligned<uint16_t>(K);
        const bool ok = mode == 1 ? cpu::rq512::norm_pass(plan, x.data(), nullptr, nullptr, K, G, r, y.get(), got.data())
                                  : cpu::rq512::amax_pass(plan, x.data(), K, G, r, got.data());
        REQUIRE(ok);
        int bad = 0;
        for (size_t g = 0; g < ng; ++g) bad += bits_of(got[g]) != bits_of(want[g]);
        CHECK(bad == 0);
        CHECK(got[ng] == -1.0f);  // nothing written past the last group
        for (size_t g : {size_t{0}, size_t{15}, ng / 2, ng - 1}) {
          if (g >= ng) continue;
          for (uint16_t bad_x : {uint16_t{0x7FC0}, uint16_t{0xFF80}}) {
            std::vector<uint16_t> xb = x;
            xb[g * G + (g * 5) % G] = bad_x;
            INFO("mode " << mode << " group " << g << " x " << bad_x);
            const bool taken = mode == 1
                                   ? cpu::rq512::norm_pass(plan, xb.data(), nullptr, nullptr, K, G, r, y.get(), got.data())
                                   : cpu::rq512::amax_pass(plan, xb.data(), K, G, r, got.data());
            CHECK_FALSE(taken);
          }
        }
      }
    }
}

TEST_CASE("rmsnorm_quant: the AVX-512 BF16 quant pass streams codes to any alignment (lines non-temporal, ends masked)") {
  // quant_pass with stream = true writes whole cache lines by non-temporal stores and the partial lines at both ends
  // by masked stores; the same row at every offset d within a line must give the bytes of the plain stores and leave
  // the bytes around it alone (they belong to the neighbouring rows).
  if (!cpu::cpu_has_avx512bf16()) {
    MESSAGE("this CPU has no AVX-512 BF16: nothing to check");
    return;
  }
  const size_t K = 256, G = 128;
  std::mt19937_64 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(K);
  for (uint16_t& v : x) v = static_cast<uint16_t>(bits_of(nd(rng)) >> 16);
  auto wf = hwy::AllocateAligned<float>(K), wperm = hwy::AllocateAligned<float>(K);
  for (size_t k = 0; k < K; ++k) wf[k] = f32_of(bits_of(1.0f + 0.25f * nd(rng)) & 0xFFFF0000u);
  cpu::rq512::Plan plan;
  cpu::rq512::make_plan(1, cpu::rq512::ZKind::bf16, wf.get(), K, wperm.get(), &plan);
  auto y = hwy::AllocateAligned<uint16_t>(K);
  float gmax[2];
  REQUIRE(cpu::rq512::norm_pass(plan, x.data(), nullptr, nullptr, K, G, 0.75f, y.get(), gmax));
  float gsv[2], grb[2];
  for (int g = 0; g < 2; ++g) {
    gsv[g] = gmax[g] / 448.0f;
    grb[g] = 1.0f / gsv[g];
  }
  for (size_t d : {0, 1, 15, 16, 33, 63}) {
    INFO("offset " << d);
    auto a = hwy::AllocateAligned<uint8_t>(K + 192), b = hwy::AllocateAligned<uint8_t>(K + 192);
    std::memset(a.get(), 0x5A, K + 192);
    std::memset(b.get(), 0x5A, K + 192);
    cpu::rq512::quant_pass(plan, y.get(), K, G, gsv, grb, true, 448.0f, a.get() + 64 + d, true);
    cpu::rq512::fence();
    cpu::rq512::quant_pass(plan, y.get(), K, G, gsv, grb, true, 448.0f, b.get() + 64 + d, false);
    CHECK(std::memcmp(a.get(), b.get(), K + 192) == 0);
    size_t untouched = 0, codes = 0;
    for (size_t i = 0; i < K + 192; ++i) {
      const bool inside = i >= 64 + d && i < 64 + d + K;
      if (!inside) untouched += a[i] == 0x5A;
      else codes += a[i] != 0x5A;
    }
    CHECK(untouched == 192);
    CHECK(codes > K / 2);
  }
}

TEST_CASE("rmsnorm_quant: cpu exact variance next to f32 midpoints (the verified f64 sum and its fallback)") {
  // z = {2^12, 1, 2^-k, 0}: Σ/4 = 2^22 + 2^-2 + 2^-2k/4, just above the midpoint 2^22 + 2^-2, so the exact mean
  // rounds up to 2^22 + 2^-1. For k >= 15 the f64 sum loses 2^-2k and lands on the midpoint itself: the CPU backend
  // must notice (its interval straddles the midpoint) and take the exact path. y = z·r·1 shows r, hence v.
  const RmsNormQuantSpec spec = spec_for("exact", Format::e4m3fn, {{"group", "4"}, {"eps", "0"}});
  for (int k = 13; k <= 100; ++k) {
    const std::vector<float> z = {4096.0f, 1.0f, std::ldexp(1.0f, -k), 0.0f};
    CHECK(ref::mean_square_exact(z.data(), 4) == 4194304.5f);
    const auto x = encode_as(Format::f32, z), w = encode_as(Format::f32, {1, 1, 1, 1});
    const Outputs a = run(false, spec, Format::f32, x, w, nullptr, {1, 4}, true);
    const Outputs b = run(true, spec, Format::f32, x, w, nullptr, {1, 4}, true);
    INFO("k = " << k);
    CHECK(a.normed == b.normed);
    CHECK(a.normed[1] == ref::rsqrt_rn(4194304.5f));
  }
}

TEST_CASE("rmsnorm_quant: rsqrt=cuda-rsqrtf reproduces rsqrtf captured on the H200") {
  // tests/data/h200/rsqrtf_pairs.npy: (u bits, rsqrtf(u) bits) from tools/device/capture_rsqrtf.py — random u of
  // every class (subnormals and zeros of both signs, [1, 2), all exponents, ±Inf, NaN, negatives).
  const io::Tensor t = io::read_npy(std::string(FP8REF_TEST_DATA) + "/h200/rsqrtf_pairs.npy");
  REQUIRE(t.shape.size() == 2);
  REQUIRE(t.shape[1] == 2);
  const size_t n = static_cast<size_t>(t.shape[0]);
  REQUIRE(n > 20000);
  size_t differ_rn = 0, bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t ub, rb;
    std::memcpy(&ub, &t.data[8 * i], 4);
    std::memcpy(&rb, &t.data[8 * i + 4], 4);
    const float got = ref::rsqrt_cuda(f32_of(ub));
    if (bits_of(got) != rb) {
      if (++bad <= 5) FAIL_CHECK("u " << ub << " device " << rb << " model " << bits_of(got));
    }
    const float u = f32_of(ub);
    if (!std::isnan(u) && u > 0 && !std::isinf(u)) differ_rn += bits_of(ref::rsqrt_rn(u)) != rb;
  }
  CHECK(bad == 0);
  CHECK(differ_rn > n / 20);  // rsqrtf is not the correctly rounded rsqrt: the two models must differ
  CHECK(bits_of(ref::rsqrt_cuda(-0.0f)) == 0xFF800000u);
  CHECK(ref::rsqrt_cuda(4.0f) == 0.5f);
}

TEST_CASE("rmsnorm_quant: cpu e4m3fn cast in lanes at every code, midpoint and NaN/Inf weight (fast path)") {
  // x = ±1 (bf16) on every element: the mean of squares is exactly 1 and bf16(x·r) = ±1 (vLLM, eps 1e-6) or r = 1
  // (aiter, eps 0), so y = ±w: the weights pick the values the group quant sees. Each group starts with 448, so
  // amax = 448 and s = 1 (checked), and q = RNE_e4m3fn(clamp(±w)). Weights: every positive e4m3fn value, every
  // midpoint between neighbours (ties), each midpoint ± one bf16 ulp, values at and below the smallest
  // subnormal, alternately negated; the codes are checked against a brute-force nearest-value search (ties to the
  // even code) and against the reference. The last two groups hold a NaN weight (x86 NaN propagation, the group
  // amax rescan) and an Inf weight (s = Inf), checked against the reference only.
  const int64_t G = 128, K = 8 * G;
  std::vector<float> vals;
  auto bf16_step = [](float v, int d) { return f32_of(((bits_of(v) >> 16) + static_cast<uint32_t>(d)) << 16); };
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = static_cast<float>(ref::value_of(Format::e4m3fn, static_cast<uint8_t>(c)));
    const float hi = static_cast<float>(ref::value_of(Format::e4m3fn, static_cast<uint8_t>(c + 1)));
    const float mid = (lo + hi) / 2;  // exact: 4 significant bits
    vals.insert(vals.end(), {hi, mid, bf16_step(mid, 1), bf16_step(mid, -1)});
  }
  vals.insert(vals.end(), {0x1p-10f, 0x1p-11f, bf16_step(0x1p-11f, 1), 0x1p-12f, 1e-30f});
  REQUIRE(vals.size() <= static_cast<size_t>(6 * (G - 1)));
  std::vector<uint16_t> w(static_cast<size_t>(K), 0);
  for (size_t i = 0; i < vals.size(); ++i) {
    const size_t g = i / (G - 1), j = i % (G - 1);
    w[g * G + 1 + j] = static_cast<uint16_t>(bits_of(i % 2 ? -vals[i] : vals[i]) >> 16);
  }
  for (int64_t g = 0; g < 8; ++g) w[static_cast<size_t>(g * G)] = static_cast<uint16_t>(bits_of(448.0f) >> 16);
  w[6 * G + 5] = 0xFF81;  // a negative signalling NaN
  w[6 * G + 9] = 0x7FC0;
  w[7 * G + 7] = 0x7F80;  // +Inf
  for (int64_t j = 6 * G + 10; j < 7 * G; ++j) w[static_cast<size_t>(j)] = w[static_cast<size_t>(j - 5 * G)];
  std::vector<uint16_t> x(static_cast<size_t>(2 * K), 0x3F80);
  for (int64_t k = 0; k < K; ++k) x[static_cast<size_t>(K + k)] = 0xBF80;  // row 1: -1
  std::vector<uint8_t> xb(x.size() * 2), wb(w.size() * 2);
  std::memcpy(xb.data(), x.data(), xb.size());
  std::memcpy(wb.data(), w.data(), wb.size());
  auto expect = [](float y) {  // the nearest e4m3fn value to clamp(y), ties to the even code; sign kept
    const double a = std::fmin(std::fabs(static_cast<double>(y)), 448.0);
    int best = 0;
    for (int c = 1; c <= 0x7E; ++c) {
      const double d = std::fabs(ref::value_of(Format::e4m3fn, static_cast<uint8_t>(c)) - a);
      const double db = std::fabs(ref::value_of(Format::e4m3fn, static_cast<uint8_t>(best)) - a);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>(best | (std::signbit(y) ? 0x80 : 0));
  };
  const std::vector<RmsNormQuantSpec> specs = {spec_for("vllm-rmsnorm-quant", Format::e4m3fn),
                                               spec_for("aiter-rmsnorm-quant", Format::e4m3fn, {{"eps", "0"}})};
  for (const RmsNormQuantSpec& spec : specs) {
    INFO(spec.describe());
    const Outputs a = run(true, spec, Format::bf16, xb, wb, nullptr, {2, K}, false);
    const Outputs b = run(false, spec, Format::bf16, xb, wb, nullptr, {2, K}, false);
    CHECK(a.q == b.q);
    CHECK(a.scales == b.scales);
    int checked = 0;
    for (int64_t m = 0; m < 2; ++m)
      for (int64_t g = 0; g < 6; ++g) {
        float s;
        std::memcpy(&s, &a.scales[static_cast<size_t>(4 * (m * 8 + g))], 4);
        REQUIRE(s == 1.0f);
        for (int64_t j = 0; j < G; ++j) {
          const float wv = f32_of(static_cast<uint32_t>(w[static_cast<size_t>(g * G + j)]) << 16);
          const float y = m == 0 ? wv : -wv;
          CHECK_MESSAGE(a.q[static_cast<size_t>(m * K + g * G + j)] == expect(y), "y = " << y);
          ++checked;
        }
      }
    CHECK(checked == 2 * 6 * G);
  }
}

TEST_CASE("rmsnorm_quant: cpu fast group quant (fused x*(1/s), Markstein x/s) at scales near 2^±60, tiny y, NaN/Inf groups") {
  // src/cpu/rmsnorm_quant_cpu.cc quantizes bf16 rows per group without per-element range tests when the group is
  // finite and its scale allows it (x/s: s in [2^-60, 2^60], amax <= s·2^60, MarksteinDiv — one correction when y is
  // bf16-valued; x*(1/s): RN(1/s) finite), fused with normalize + weight (G a multiple of the vector, <= 8 vectors,
  // K % G == 0), else per group as before. Weights scale each group by 2^e, e chosen so that s falls just inside and outside 2^-60 and
  // 2^60 (and overflows to Inf); groups hold tiny weights (y down to bf16 / f32 subnormals: quotients under 2^-11
  // whose remainders underflow), zeros and ±0, and NaN / Inf weights. G = 128, 64, 32 (fused, compile-time and
  // run-time vector counts), 48 (not a multiple of 16: separate passes); 8, 3 and 1 groups per row (the fused loop
  // is pipelined by one group: odd counts end it on an unpaired group). Oracle: ref::rmsnorm_quant.
  std::mt19937_64 rng(77);
  const int exps[] = {-133, -126, -90, -70, -54, -53, -52, 0, 20, 66, 67, 68, 69, 120};
  const std::vector<std::pair<const char*, std::vector<std::pair<std::string, std::string>>>> variants = {
      {"vllm-rmsnorm-quant", {}},
      {"aiter-rmsnorm-quant", {}},
      {"vllm-rmsnorm-quant", {{"formula", "x*(1/s)"}}},
      {"aiter-rmsnorm-quant", {{"formula", "x/s"}, {"weight", "dtype-once"}}},
      {"vllm-rmsnorm-quant", {{"guard", "none"}, {"weight", "f32"}}},
      {"aiter-rmsnorm-quant", {{"clamp", "nan-to-min"}, {"guard", "none"}, {"weight", "dtype-twice"}}},
  };
  int compared = 0;
  for (const auto& variant : variants) {
    const auto& conv = variant.first;
    const auto& ov0 = variant.second;
    for (int64_t G : {int64_t{128}, int64_t{64}, int64_t{32}, int64_t{48}})
    for (int64_t ng : {int64_t{8}, int64_t{3}, int64_t{1}}) {
      auto ov = ov0;
      ov.push_back({"group", std::to_string(G)});
      const RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn, ov);
      const int64_t K = ng * G, M = 12;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> xv(static_cast<size_t>(M * K)), wv(static_cast<size_t>(K)), rv(xv.size());
      for (float& v : xv) v = nd(rng);
      for (float& v : rv) v = nd(rng);
      for (int64_t g = 0; g < ng; ++g) {
        const int e = exps[rng() % 14];
        for (int64_t j = 0; j < G; ++j) {
          float v = std::ldexp(nd(rng), e);
          const uint64_t t = rng() % 16;
          if (t == 0) v = (rng() & 1) ? -0.0f : 0.0f;
          if (t == 1) v = std::ldexp(1.0f + (rng() % 8) / 8.0f, -126 - static_cast<int>(rng() % 8));  // tiny
          if (t == 2) v = std::ldexp(v, -40);
          wv[static_cast<size_t>(g * G + j)] = v;
        }
      }
      if (rng() % 2) wv[static_cast<size_t>(rng() % K)] = std::nanf("");
      if (rng() % 2) wv[static_cast<size_t>(rng() % K)] = (rng() & 1) ? HUGE_VALF : -HUGE_VALF;
      xv[5] = std::nanf("");  // row 0: the NaN row (not on the fast path)
      const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
      for (bool with_res : {false, true}) {
        const std::vector<uint8_t>* rp = with_res ? &r : nullptr;
        const Outputs a = run(false, spec, Format::bf16, x, w, rp, {M, K}, false);
        const Outputs b = run(true, spec, Format::bf16, x, w, rp, {M, K}, false);
        INFO(spec.describe() << " groups " << ng << " residual " << with_res);
        CHECK(a.q == b.q);
        CHECK(a.scales == b.scales);
        CHECK(a.res == b.res);
        CHECK(std::memcmp(a.rms.data(), b.rms.data(), a.rms.size() * 4) == 0);
        ++compared;
      }
    }
  }
  CHECK(compared == 6 * 4 * 3 * 2);
}

TEST_CASE("rmsnorm_quant: cpu exact variance read from bf16 rows (no f32 row) next to f32 midpoints, NaN/Inf rows") {
  // bf16 rows without a residual on the fast quant are read in registers from x (no f32 row); the verified f64 sum
  // must still fall back to ref::mean_square_exact on the f32 row when its interval straddles a midpoint (rows as in
  // the f32 test above: z = {2^12, 1, 2^-k, 0}, all bf16 values) and for NaN/Inf rows. Oracle: the reference.
  // K = 64 (zeros after the four values): SumSquaresF64's 32-value AVX-512 loop for bf16 rows, where the target has it
  for (int64_t K : {int64_t{4}, int64_t{64}}) {
    const RmsNormQuantSpec spec =
        spec_for("aiter-rmsnorm-quant", Format::e4m3fn, {{"group", std::to_string(K)}, {"eps", "0"}});
    for (int k = 13; k <= 100; ++k) {
      std::vector<float> z(static_cast<size_t>(2 * K), 0.0f);
      for (int64_t m = 0; m < 2; ++m) {
        z[static_cast<size_t>(m * K)] = m ? -4096.0f : 4096.0f;
        z[static_cast<size_t>(m * K + 1)] = 1.0f;
        z[static_cast<size_t>(m * K + 2)] = std::ldexp(1.0f, -k);
      }
      if (k % 3 == 0) z[static_cast<size_t>(K + 1)] = std::nanf("");
      if (k % 3 == 1) z[static_cast<size_t>(K + 2)] = HUGE_VALF;
      const auto x = encode_as(Format::bf16, z), w = encode_as(Format::bf16, std::vector<float>(static_cast<size_t>(K), 1.0f));
      const Outputs a = run(false, spec, Format::bf16, x, w, nullptr, {2, K}, false);
      const Outputs b = run(true, spec, Format::bf16, x, w, nullptr, {2, K}, false);
      INFO("K = " << K << ", k = " << k);
      CHECK(a.q == b.q);
      CHECK(a.scales == b.scales);
      CHECK(std::memcmp(a.rms.data(), b.rms.data(), a.rms.size() * 4) == 0);
    }
  }
}

TEST_CASE("rmsnorm_quant: cpu residual rows (z = x + residual recomputed, no f32 row) next to f32 midpoints, NaN/Inf") {
  // bf16 rows with a residual whose sum stays f32 are not stored as an f32 row on the fast paths: the passes
  // recompute z = x + residual (ZSum), and for variance=exact the residual pass sums z² itself. Its verified f64 sum
  // must fall back like the others (z as in the test above, split between x and the residual so every sum is exact),
  // and a NaN sum (a NaN input, Inf + -Inf) leaves the fast path. Rows of 64: two 32-element steps of the AVX-512
  // residual pass. Oracle: the reference.
  for (const char* conv : {"aiter-rmsnorm-quant", "vllm-rmsnorm-quant"}) {
    const RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn, {{"group", "32"}, {"eps", "0"}});
    for (int k = 13; k <= 100; ++k) {
      const float pat[8] = {4096.0f, 1.0f, std::ldexp(1.0f, -k), 0.0f, -4096.0f, 1.0f, std::ldexp(1.0f, -k), 0.0f};
      std::vector<float> xv(128), rv(128), wv(64, 1.0f);
      for (size_t j = 0; j < 128; ++j) {
        const float z = pat[j % 8];
        xv[j] = j % 3 == 0 ? z : 0.0f;
        rv[j] = j % 3 == 0 ? 0.0f : z;
      }
      if (k % 3 == 0) xv[70] = std::nanf("");
      if (k % 3 == 1) rv[75] = HUGE_VALF;
      if (k % 3 == 2) {
        xv[100] = HUGE_VALF;
        rv[100] = -HUGE_VALF;
      }
      const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
      const Outputs a = run(false, spec, Format::bf16, x, w, &r, {2, 64}, false);
      fp8ref::test::for_test_targets([&] {
        const Outputs b = run(true, spec, Format::bf16, x, w, &r, {2, 64}, false);
        INFO(conv << " k = " << k << " SIMD target " << fp8ref::cpu::simd_target());
        CHECK(a.q == b.q);
        CHECK(a.scales == b.scales);
        CHECK(a.res == b.res);
        CHECK(std::memcmp(a.rms.data(), b.rms.data(), a.rms.size() * 4) == 0);
      });
    }
  }
}

// The arguments of a bf16 [M, K] call with a residual (weights [K]).
static RmsNormQuantArgs bf16_residual_args(int64_t M, int64_t K, const void* x, const void* w, const void* r,
                                           void* r_out, uint8_t* q, void* scales) {
  RmsNormQuantArgs a;
  a.from = Format::bf16;
  a.shape = {M, K};
  a.weight_shape = {K};
  a.x = x;
  a.weight = w;
  a.residual = r;
  a.residual_out = r_out;
  a.q = q;
  a.scales = scales;
  return a;
}

TEST_CASE("rmsnorm_quant: residual_out may be the residual or x itself (in place, as vLLM's fused_add_rms_norm)") {
  std::mt19937_64 rng(11);
  const int64_t M = 8, K = 256;
  for (const char* conv : {"aiter-rmsnorm-quant", "vllm-rmsnorm-quant", "deepseek-rmsnorm", "exact"}) {
    const RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn);
    const std::vector<float> xv = make_rows(rng, M, K, Format::bf16, false), rv = make_rows(rng, M, K, Format::bf16, false);
    std::vector<float> wv(static_cast<size_t>(K));
    std::normal_distribution<float> nd(1.0f, 0.5f);
    for (float& v : wv) v = nd(rng);
    const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
    const Outputs want = run(false, spec, Format::bf16, x, w, &r, {M, K}, false);
    for (bool cpu : {false, true})
      for (bool into_x : {false, true}) {
        std::vector<uint8_t> xb = x, rb = r;
        std::vector<uint8_t> q(static_cast<size_t>(M * K)), s(want.scales.size());
        const RmsNormQuantArgs a =
            bf16_residual_args(M, K, xb.data(), w.data(), rb.data(), into_x ? xb.data() : rb.data(), q.data(), s.data());
        if (cpu) cpu::rmsnorm_quant(spec, a);
        else ref::rmsnorm_quant(spec, a);
        INFO(conv << (cpu ? " cpu" : " reference") << (into_x ? " into x" : " into the residual"));
        CHECK(q == want.q);
        CHECK(s == want.scales);
        CHECK((into_x ? xb : rb) == want.res);
      }
  }
}

TEST_CASE("rmsnorm_quant: a lone tiny z anywhere in a vLLM row reaches the AVX-512 BF16 passes' guard") {
  // On AVX-512 the cub partials pass of a bf16 row without a residual also takes the row's smallest nonzero |x| for
  // the passes' guard (norm_pass's zmin1): in its vector steps (64 values from two 64-byte loads, either half) and in
  // its scalar threads (variance=cub:40: threads 32..39 of 40, elements 128..159 of a 256-row, go the scalar way).
  // Rows of two groups: group 0 ~ N(0, 1) under weights ~1, group 1 ±2^-118·(1 + j/8) under weights 2^100 (y ~
  // 2^-18, every row fast) but for one z = ±1.5·2^-128 per row (z·r subnormal) at a different place in each row: a
  // flushed bf16(z·r) would turn its visible code to zero, so the passes must decline exactly these rows.
  const int64_t K = 256;
  const std::vector<int64_t> at = {130, 150, 170, 200, 230, 255};
  const int64_t M = static_cast<int64_t>(at.size());
  std::vector<float> xv(static_cast<size_t>(M * K)), wv(static_cast<size_t>(K));
  std::mt19937_64 rng(31);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float sg = (k + m) % 3 ? 1.0f : -1.0f, f = 1.0f + static_cast<float>((k + m) % 8) / 8.0f;
      xv[static_cast<size_t>(m * K + k)] = k < 128 ? nd(rng) : k == at[static_cast<size_t>(m)] ? sg * 1.5f * 0x1p-128f
                                                                                                 : sg * f * 0x1p-118f;
    }
  for (int64_t k = 0; k < K; ++k) wv[static_cast<size_t>(k)] = k < 128 ? 1.0f + 0.25f * nd(rng) : 0x1p100f;
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv);
  for (const char* variance : {"cub:auto", "cub:40"}) {
    const RmsNormQuantSpec spec = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"variance", variance}});
    INFO(spec.describe());
    const Outputs want = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    const Outputs got = run(true, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    for (int64_t m = 0; m < M; ++m) {
      const size_t i = static_cast<size_t>(m * K + at[static_cast<size_t>(m)]);
      INFO("row " << m << ", the tiny z at " << at[static_cast<size_t>(m)]);
      CHECK((want.q[i] & 0x7F) != 0);  // visible
      CHECK(got.q[i] == want.q[i]);
    }
    CHECK(got.q == want.q);
    CHECK(got.scales == want.scales);
  }
}

TEST_CASE("rmsnorm_quant: under a scale guard the AVX-512 BF16 passes take rows with subnormal z·r (flush harmless)") {
  // vLLM's min-scale 1/(448·512) keeps every scale above 2^-19, so a y the pass's vcvtne2ps2bf16 flushes (|y| <=
  // 2^-125·max|w|) has a code of ±0 either way: the passes take such rows without their row guard (Plan::flush_ok).
  // Rows of four groups of 64: group 0 ~ N(0, 1) (r ~ 2); group 1 ±2^-128·(1 + j/32) (z·r subnormal, some just
  // under 2^-126 that bf16 RNE rounds up to it); group 2 the same magnitudes under weights up to 2^40 (flushed
  // products that exact would make up to ~2^-85) and down to 2^-40 (subnormal products of normal z·r); group 3
  // tiny values alone in a row-half with bf16 subnormal x (x = ±2^-133 .. 2^-127). Signs alternate: −tiny codes 0x80.
  const int64_t K = 256, M = 8;
  std::vector<float> xv(static_cast<size_t>(M * K)), wv(static_cast<size_t>(K));
  std::mt19937_64 rng(2028);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float sg = (k + m) % 2 ? -1.0f : 1.0f, f = 1.0f + static_cast<float>((k * 5 + m) % 32) / 32.0f;
      float x;
      if (k < 64) x = nd(rng);
      else if (k < 192) x = sg * f * 0x1p-128f;
      else x = sg * std::ldexp(1.0f, -133 + static_cast<int>((k + m) % 7));
      xv[static_cast<size_t>(m * K + k)] = x;
    }
  for (int64_t k = 0; k < K; ++k)
    wv[static_cast<size_t>(k)] = k >= 128 && k < 192 ? std::ldexp(1.0f, (k % 2 ? 1 : -1) * static_cast<int>(k % 41))
                                                     : 1.0f + 0.25f * nd(rng);
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv);
  for (const char* weight : {"dtype-twice", "dtype-once"}) {
    const RmsNormQuantSpec spec = spec_for("vllm-rmsnorm-quant", Format::e4m3fn, {{"group", "64"}, {"weight", weight}});
    INFO(spec.describe());
    const Outputs want = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    const Outputs got = run(true, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    CHECK(got.q == want.q);
    CHECK(got.scales == want.scales);
    CHECK(got.rms == want.rms);
    int neg0 = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 64; k < K; ++k) neg0 += want.q[static_cast<size_t>(m * K + k)] == 0x80;
    CHECK(neg0 > 300);  // the −tiny values' codes keep their sign
  }
  // Group 128 on AVX2: the norm pass by Veltkamp's split, then RowQuantFast (session 37's product form of the split
  // lost the sign of products below 2^-150 here: group 2's w = 2^-25 lanes coded 0x00 for 0x80). The quant specs
  // off the fused path (row by row, y in element order) under an amax floor: the split there too for e4m3fn (every
  // scale >= 2^-60 leaves a subnormal y a code ±0), not for e5m2, whose subnormals reach 2^-16 (|y/s| up to 2^-15
  // would differ); f16 scales neither. deepseek-rmsnorm: Triton's division, f32 / ue8m0 scales.
  struct RowSpec {
    const char* conv;
    Format to;
    std::optional<ScaleDtype> dt;
    std::vector<std::pair<std::string, std::string>> ov;
  };
  const RowSpec row_specs[] = {
      {"vllm-rmsnorm-quant", Format::e4m3fn, std::nullopt, {{"group", "128"}}},
      {"deepseek-rmsnorm", Format::e4m3fn, std::nullopt, {{"group", "64"}}},
      {"deepseek-rmsnorm", Format::e4m3fn, ScaleDtype::ue8m0, {{"group", "64"}, {"weight", "dtype-twice"}}},
      {"exact", Format::e5m2, std::nullopt, {{"group", "64"}, {"guard", "amax-floor:1e-12"}, {"weight", "dtype-once"}}},
      {"exact", Format::e4m3fn, ScaleDtype::f16, {{"group", "64"}, {"guard", "amax-floor:1e-12"}, {"weight", "dtype-twice"}}},
  };
  for (const RowSpec& rs : row_specs) {
    std::string err;
    auto spec = resolve_rmsnorm_quant_convention(rs.conv, rs.to, &err, rs.dt);
    REQUIRE_MESSAGE(spec.has_value(), err);
    for (auto& [k, v] : rs.ov) REQUIRE_MESSAGE(apply_rmsnorm_override(k, v, &*spec, &err), err);
    finalize_rmsnorm_quant_spec(&*spec);
    INFO(spec->describe());
    const Outputs want = run(false, *spec, Format::bf16, x, w, nullptr, {M, K}, false);
    const Outputs got = run(true, *spec, Format::bf16, x, w, nullptr, {M, K}, false);
    CHECK(got.q == want.q);
    CHECK(got.scales == want.scales);
  }
  if (!cpu::cpu_has_avx512bf16()) {
    MESSAGE("this CPU has no AVX-512 BF16: the passes' own check skipped");
    return;
  }
  // The pass itself: such a row declined under the row guard, taken with flush_ok; flush_ok only where the bound holds.
  auto wf = hwy::AllocateAligned<float>(K), wperm = hwy::AllocateAligned<float>(K);
  for (int64_t k = 0; k < K; ++k) wf[static_cast<size_t>(k)] = wv[static_cast<size_t>(k)];
  cpu::rq512::Plan plan;
  cpu::rq512::make_plan(1, cpu::rq512::ZKind::bf16, wf.get(), K, wperm.get(), &plan);
  CHECK(plan.wmax_bits == bits_of(0x1p40f));
  CHECK(cpu::rq512::flush_subnormal_harmless(plan, 1.0 / (448.0 * 512.0) / 2));
  CHECK_FALSE(cpu::rq512::flush_subnormal_harmless(plan, 0x1p-61));
  std::vector<uint16_t> row(static_cast<size_t>(K));
  std::memcpy(row.data(), x.data(), 2 * static_cast<size_t>(K));
  auto y = hwy::AllocateAligned<uint16_t>(K);
  float gmax[4];
  CHECK_FALSE(cpu::rq512::norm_pass(plan, row.data(), nullptr, nullptr, K, 64, 2.0f, y.get(), gmax));
  plan.flush_ok = true;
  CHECK(cpu::rq512::norm_pass(plan, row.data(), nullptr, nullptr, K, 64, 2.0f, y.get(), gmax));
  wf[7] = 0x1p51f;
  cpu::rq512::make_plan(1, cpu::rq512::ZKind::bf16, wf.get(), K, wperm.get(), &plan);
  CHECK_FALSE(cpu::rq512::flush_subnormal_harmless(plan, 1.0));
  wf[7] = NAN;
  cpu::rq512::make_plan(1, cpu::rq512::ZKind::bf16, wf.get(), K, wperm.get(), &plan);
  CHECK_FALSE(cpu::rq512::flush_subnormal_harmless(plan, 1.0));
}

TEST_CASE("rmsnorm_quant: the AVX-512 passes' group scales at the guards' floors and outside the fast division's range") {
  // RowGroupScales computes the scales of the rows the AVX-512 norm pass took, and whether every group is fast.
  // Rows of 8 groups of 64, bf16, weights ~1: groups ~N(0, 1), groups scaled by 2^-10 (amax under the floors below),
  // all-zero groups (±0; rows 0 and 4), and groups of ±2^-125·(1 + j/8) (odd rows) — with no guard their scale
  // amax/448 is an f32 subnormal, outside the Markstein x/s range [2^-60, 2^60] and with an infinite RN(1/s): those
  // groups are not fast, and the row must take the per-group path. Each guard kind, x/s and x*(1/s), both scale formulas; oracle: the reference.
  const int64_t K = 512, M = 8, G = 64;
  std::vector<float> xv(static_cast<size_t>(M * K));
  std::vector<float> wv(static_cast<size_t>(K));
  std::mt19937_64 rng(4242);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / G;
      const int kind = static_cast<int>((g + m) % 4);
      const float sg = (k + m) % 3 ? 1.0f : -1.0f;
      float x = nd(rng);
      if (kind == 1) x = std::ldexp(x, -10);
      if (kind == 2 && m % 4 == 0) x = sg * 0.0f;  // (a row with a zero group goes the per-group way without a floor)
      if (kind == 3 && m % 2 == 1) x = sg * 0x1p-125f * (1.0f + static_cast<float>(k % 8) / 8.0f);
      xv[static_cast<size_t>(m * K + k)] = x;
    }
  for (auto& w : wv) w = 1.0f + 0.125f * nd(rng);
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv);
  int slow_rows = 0;
  for (const char* guard : {"amax-floor:0.25", "min-scale:0.001", "amax-floor:0.25,min-scale:0.001", "none"})
    for (const char* formula : {"x/s", "x*(1/s)"})
      for (const char* sf : {"amax/max", "amax*(1/max)"}) {
        const RmsNormQuantSpec spec = spec_for("vllm-rmsnorm-quant", Format::e4m3fn,
                                               {{"group", "64"}, {"guard", guard}, {"formula", formula}, {"scale-formula", sf}});
        INFO(spec.describe());
        const Outputs want = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
        const Outputs got = run(true, spec, Format::bf16, x, w, nullptr, {M, K}, false);
        CHECK(got.q == want.q);
        CHECK(got.scales == want.scales);
        if (std::string(guard) == "none") {
          // the tiny groups' scales are f32 subnormals (odd rows): not fast
          const auto* sc = reinterpret_cast<const float*>(want.scales.data());
          for (int64_t m = 1; m < M; m += 2)
            for (int64_t g = 0; g < K / G; ++g)
              if ((g + m) % 4 == 3) slow_rows += std::fpclassify(sc[m * (K / G) + g]) == FP_SUBNORMAL;
        } else {
          // the floors show: the 2^-10 and zero groups' scales are the guard's
          const auto* sc = reinterpret_cast<const float*>(want.scales.data());
          const float fl = std::string(guard).rfind("min", 0) == 0 ? 0.001f : 0.25f / 448.0f;
          for (int64_t g = 0; g < K / G; ++g)
            if (g % 4 == 2) CHECK(sc[g] >= fl * (1.0f - 0x1p-20f));  // row 0's zero groups
          for (int64_t g = 0; g < K / G; ++g)
            if ((g + 2) % 4 == 1) CHECK(sc[2 * (K / G) + g] >= fl * (1.0f - 0x1p-20f));  // row 2's 2^-10 groups
        }
      }
  CHECK(slow_rows > 0);
}

TEST_CASE("rmsnorm_quant: zeros of either sign keep y's sign (−0 codes 0x80) on every path") {
  // y = bf16(bf16(z·r)·w) is −0 for z = −0 under w > 0 and for z = +0 under w < 0: e4m3fn code 0x80 (any form of y
  // that adds a zero — e.g. vdpbf16ps with a zero partner, tried in session 20 — turns such a −0 into +0). Rows:
  // normal values, weights of both signs, ±0 sprinkled (and a row with none); then the same under weights with ±0.
  const int64_t K = 256, M = 4;
  std::vector<float> xv(static_cast<size_t>(M * K)), wv(static_cast<size_t>(K));
  std::mt19937_64 rng(41);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : xv) v = nd(rng);
  for (int64_t k = 0; k < K; ++k)
    wv[static_cast<size_t>(k)] = (k % 5 == 2 ? -1.0f : 1.0f) * (1.0f + 0.25f * std::fabs(nd(rng)));
  for (int64_t m = 1; m < M; ++m)
    for (int64_t k = m; k < K; k += 9) xv[static_cast<size_t>(m * K + k)] = (k / 9) % 2 ? -0.0f : 0.0f;
  const auto x = encode_as(Format::bf16, xv);
  for (bool zero_w : {false, true}) {
    if (zero_w)
      for (int64_t k = 3; k < K; k += 17) wv[static_cast<size_t>(k)] = k % 2 ? -0.0f : 0.0f;
    const auto w = encode_as(Format::bf16, wv);
    const RmsNormQuantSpec spec = spec_for("vllm-rmsnorm-quant", Format::e4m3fn);
    const Outputs want = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    INFO("zero weights " << zero_w);
    int negzero = 0;
    for (uint8_t c : want.q) negzero += c == 0x80;
    CHECK(negzero > (zero_w ? 40 : 20));
    for (auto path : {cpu::RmsNormPath::automatic, cpu::RmsNormPath::highway}) {
      const Outputs got = run(true, spec, Format::bf16, x, w, nullptr, {M, K}, false, path);
      CHECK(got.q == want.q);
      CHECK(got.scales == want.scales);
    }
  }
}

TEST_CASE("rmsnorm_quant: codes of 16 Mi elements (non-temporal stores on AVX-512) bit-identical to the reference") {
  // From 16 Mi elements the AVX-512 BF16 passes stream the codes past the caches (whole lines non-temporal, a row's
  // partial end lines masked), fenced once per thread after its last row. Rows 0..3 declined by the passes (a NaN)
  // and rows 2100..2103 too (between streamed rows of the second thread's share), q 64-byte aligned and 5 bytes past
  // a line: every code and scale as the reference's, the bytes around q untouched. vLLM's passes and aiter's
  // (weight=f32: amax_pass, wquant_pass).
  if (FP8REF_TEST_ASAN && !cpu::cpu_has_avx512bf16()) {  // (a minute under ASan for passes this CPU does not run)
    MESSAGE("ASan build on a CPU without AVX-512 BF16: the streaming passes are not run here; skipped");
    return;
  }
  const int64_t M = 2048 + 64, K = 8192;
  const size_t n = static_cast<size_t>(M * K);
  std::mt19937_64 rng(21);
  std::vector<float> xv(n), wv(static_cast<size_t>(K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : xv) v = nd(rng);
  for (float& v : wv) v = 1.0f + 0.25f * nd(rng);
  for (int64_t m : {0, 1, 2, 3, 2100, 2101, 2102, 2103}) xv[static_cast<size_t>(m * K + 77 * m % K)] = std::nanf("");
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv);
  for (const char* conv : {"vllm-rmsnorm-quant", "aiter-rmsnorm-quant"}) {
    const RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn);
    const Outputs want = run(false, spec, Format::bf16, x, w, nullptr, {M, K}, false);
    INFO(conv);
    for (size_t off : {0, 5}) {
      auto buf = hwy::AllocateAligned<uint8_t>(n + 128);
      std::memset(buf.get(), 0x5A, n + 128);
      uint8_t* q = buf.get() + off;
      std::vector<uint8_t> s(want.scales.size());
      RmsNormQuantArgs a;
      a.from = Format::bf16;
      a.shape = {M, K};
      a.weight_shape = {K};
      a.x = x.data();
      a.weight = w.data();
      a.q = q;
      a.scales = s.data();
      cpu::rmsnorm_quant(spec, a);
      INFO("q at +" << off << " bytes");
      CHECK(std::memcmp(q, want.q.data(), n) == 0);
      CHECK(s == want.scales);
      CHECK(std::count(buf.get(), q, uint8_t{0x5A}) == static_cast<std::ptrdiff_t>(off));
      CHECK(std::count(q + n, buf.get() + n + 128, uint8_t{0x5A}) == static_cast<std::ptrdiff_t>(128 - off));
    }
  }
}

TEST_CASE("rmsnorm_quant: a residual_out of 16 MiB (non-temporal stores on AVX-512) bit-identical to the reference") {
  // The cpu backend streams residual_out past the caches from 16 MiB on (at any alignment: whole lines non-temporal,
  // the partial lines at a row's ends masked); row 5 holds a NaN at element 1000, where the streaming loop stops and
  // the generic one takes over.
  const int64_t M = 1024, K = 8192;
  const size_t n = static_cast<size_t>(M * K);
  std::mt19937_64 rng(5);
  std::vector<float> xv(n), rv(n), wv(static_cast<size_t>(K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : xv) v = nd(rng);
  for (float& v : rv) v = nd(rng);
  for (float& v : wv) v = 1.0f + 0.25f * nd(rng);
  xv[5 * K + 1000] = std::nanf("");
  const auto x = encode_as(Format::bf16, xv), w = encode_as(Format::bf16, wv), r = encode_as(Format::bf16, rv);
  for (const char* conv : {"aiter-rmsnorm-quant", "vllm-rmsnorm-quant"}) {
    const RmsNormQuantSpec spec = spec_for(conv, Format::e4m3fn);
    const Outputs want = run(false, spec, Format::bf16, x, w, &r, {M, K}, false);
    for (size_t off : {0, 3}) {  // residual_out 64-byte aligned, then 6 bytes past a line
      auto buf = hwy::AllocateAligned<uint16_t>(n + 64);
      std::fill(buf.get(), buf.get() + n + 64, uint16_t{0x5A5A});
      uint16_t* out = buf.get() + off;
      std::vector<uint8_t> q(n), s(want.scales.size());
      const RmsNormQuantArgs a = bf16_residual_args(M, K, x.data(), w.data(), r.data(), out, q.data(), s.data());
      cpu::rmsnorm_quant(spec, a);
      INFO(conv << " residual_out at +" << 2 * off << " bytes");
      CHECK(q == want.q);
      CHECK(s == want.scales);
      CHECK(std::memcmp(out, want.res.data(), 2 * n) == 0);
      CHECK(std::count(buf.get(), out, uint16_t{0x5A5A}) == static_cast<std::ptrdiff_t>(off));
      CHECK(std::count(out + n, buf.get() + n + 64, uint16_t{0x5A5A}) == static_cast<std::ptrdiff_t>(64 - off));
    }
  }
}

TEST_CASE("rmsnorm_quant: cpu::rsqrt_rn equals ref::rsqrt_rn on special values and samples of every binade") {
  // (tests/exhaustive_rsqrt.cc checks every f32 in [1, 4), which covers every positive f32)
  std::vector<float> us = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, std::nanf(""), 0x1p-149f, 0x1p-126f,
                           0x1.fffffep127f, 1.0f, 2.0f, 4.0f, 0.25f, 3.0f};
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) us.push_back(f32_of(rng() & 0x7FFFFFFFu));
  int mismatches = 0;
  for (float u : us) mismatches += bits_of(cpu::rsqrt_rn(u)) != bits_of(ref::rsqrt_rn(u));
  CHECK(mismatches == 0);
}

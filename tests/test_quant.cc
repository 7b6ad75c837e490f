// Quantization: the spec parsers, the shape rules, the exact contract checked against an independent f64/integer
// computation (every granularity, tails, every scale dtype and target), each named convention on hand-computed
// cases (guards, NaN/Inf inside a group, zeros, ±max), static scales, dequantization, and the registry ops.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fp8ref/quant.h"
#include "fp8ref/triton_div.h"

using namespace fp8ref;

namespace {

QuantSpec spec_for(const char* convention, Format to, std::optional<ScaleDtype> dt = std::nullopt,
                   std::vector<std::pair<const char*, const char*>> overrides = {}, bool dynamic = true) {
  std::string err;
  auto s = resolve_quant_convention(convention, to, dt, &err);
  REQUIRE_MESSAGE(s.has_value(), err);
  for (auto& [k, v] : overrides) REQUIRE_MESSAGE(apply_quant_override(k, v, &*s, &err), err);
  finalize_quant_spec(&*s, dynamic);
  return *s;
}

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

struct Result {
  std::vector<uint8_t> q;
  std::vector<uint8_t> scales;  // storage bytes
  std::vector<double> exact;
  QuantLayout layout;
};

Result run(const QuantSpec& spec, const std::vector<float>& x, const std::vector<int64_t>& shape) {
  Result r;
  r.layout = quant_layout(spec, shape);
  r.q.assign(x.size(), 0xAA);
  r.scales.assign(static_cast<size_t>(r.layout.n_scales) * (format_info(scale_storage(spec)).bits / 8), 0xAA);
  r.exact.assign(x.size(), -1);
  ref::quantize(spec, Format::f32, x.data(), shape, r.q.data(), r.scales.data(), r.exact.data());
  return r;
}

float scale_at(const QuantSpec& spec, const Result& r, size_t g) { return ref::scale_value(spec, r.scales.data(), g); }

// The group of element (b, m, k) — derived here from the granularity table in quant.h, not from the reference.
int64_t group_index(const Granularity& g, const std::vector<int64_t>& shape, int64_t flat) {
  const size_t rank = shape.size();
  const int64_t K = shape[rank - 1], M = rank >= 2 ? shape[rank - 2] : 1;
  const int64_t k = flat % K, m = (flat / K) % M, b = flat / (K * M);
  auto cdiv = [](int64_t a, int64_t c) { return (a + c - 1) / c; };
  switch (g.kind) {
    case GranularityKind::tensor: return 0;
    case GranularityKind::row: return flat / K;
    case GranularityKind::col: return k;
    case GranularityKind::group:
    case GranularityKind::mx: return (flat / K) * cdiv(K, g.bk) + k / g.bk;
    case GranularityKind::block: return (b * cdiv(M, g.bm) + m / g.bm) * cdiv(K, g.bk) + k / g.bk;
  }
  return -1;
}

// The non-negative finite values of an FP8 format with their codes, ascending.
std::vector<std::pair<double, uint8_t>> positive_grid(Format f) {
  std::vector<std::pair<double, uint8_t>> v;
  for (int c = 0; c < 256; ++c) {
    const CodeClass k = classify_code(f, static_cast<uint8_t>(c));
    if (k == CodeClass::nan || k == CodeClass::inf) continue;
    const double x = ref::value_of(f, static_cast<uint8_t>(c));
    if (x > 0 || (x == 0 && !std::signbit(x))) v.push_back({x, static_cast<uint8_t>(c)});
  }
  std::sort(v.begin(), v.end());
  return v;
}

// Is `code` the round-to-nearest-even of |y|/s (y, s > 0 exact doubles), with no overflow? Every product below is a
// value with <= 5 significant bits times an f32: exact in f64.
bool is_rne(Format f, const std::vector<std::pair<double, uint8_t>>& grid, double y, double s, uint8_t code) {
  const bool neg = std::signbit(y);
  const double a = std::fabs(y);
  const bool fnuz = f == Format::e4m3fnuz || f == Format::e5m2fnuz;
  const uint8_t m = code & 0x7F;  // every format here: sign bit 0x80, magnitude in the low bits (fnuz: no -0)
  if (a == 0) return fnuz ? code == 0 : code == (neg ? 0x80 : 0x00);
  if (m == 0 ? code != (fnuz ? 0x00 : (neg ? 0x80 : 0x00)) : (code & 0x80) != (neg ? 0x80 : 0)) return false;
  size_t j = grid.size();
  for (size_t i = 0; i < grid.size(); ++i)
    if (grid[i].second == m) j = i;
  if (j == grid.size()) return false;
  const bool even = (m & 1) == 0;
  if (j > 0) {
    const double lo = (grid[j - 1].first + grid[j].first) / 2 * s;
    if (a < lo || (a == lo && !even)) return false;
  }
  const double next = j + 1 < grid.size() ? grid[j + 1].first
                                          : grid[j].first + (grid[j].first - grid[j - 1].first);  // first overflow step
  const double hi = (grid[j].first + next) / 2 * s;
  if (a > hi || (a == hi && !even)) return false;
  return true;
}

// The neighbours of a positive scale in its dtype, as doubles (the storage grid).
std::pair<double, double> scale_neighbours(ScaleDtype dt, float s) {
  if (dt == ScaleDtype::f32)
    return {std::nextafter(s, 0.0f), std::nextafter(s, std::numeric_limits<float>::infinity())};
  const Format f = dt == ScaleDtype::bf16 ? Format::bf16 : Format::f16;
  const uint64_t b = ref::narrow(Format::f32, bits_of(s), f);
  auto widen = [&](uint64_t h) { return static_cast<double>(f32_of(static_cast<uint32_t>(ref::narrow(f, h, Format::f32)))); };
  return {widen(b - 1), widen(b + 1)};
}

}  // namespace

TEST_SUITE("quant") {
  TEST_CASE("granularity and field parsers: round trips and clear errors") {
    for (const char* g : {"tensor", "row", "col", "group:16", "group:128", "group:256", "group:7", "block:128x128",
                          "block:1x128", "block:128x1", "mx:32"}) {
      Granularity out;
      std::string err;
      REQUIRE_MESSAGE(parse_granularity(g, &out, &err), err);
      CHECK(to_string(out) == g);
    }
    for (const char* bad : {"", "group", "group:", "group:0", "group:-4", "group:1e3", "block:128", "block:0x5",
                            "mx:16", "per-token", "Row"}) {
      Granularity out;
      std::string err;
      CHECK_FALSE(parse_granularity(bad, &out, &err));
      CHECK(err.find("granularity") != std::string::npos);
    }
    QuantSpec s = spec_for("exact", Format::e4m3fn);
    std::string err;
    CHECK(apply_quant_override("guard", "amax-floor:1e-10,min-scale:2e-6", &s, &err));
    CHECK(s.amax_floor == 1e-10f);
    CHECK(s.min_scale == 2e-6f);
    CHECK(apply_quant_override("guard", "none", &s, &err));
    CHECK_FALSE(s.amax_floor.has_value());
    CHECK_FALSE(apply_quant_override("guard", "floor:1", &s, &err));
    CHECK_FALSE(apply_quant_override("guard", "amax-floor:-1", &s, &err));
    CHECK_FALSE(apply_quant_override("fp8-max", "448.1", &s, &err));  // not an f32
    CHECK(err.find("f32") != std::string::npos);
    CHECK(apply_quant_override("fp8-max", "224", &s, &err));
    CHECK(s.fp8_max == 224.0f);
    CHECK(apply_quant_override("formula", "x*(max*rcp(amax))", &s, &err));
    CHECK(s.formula == QuantFormula::max_mul_rcp_amax);
    CHECK_FALSE(apply_quant_override("formula", "x/y", &s, &err));
    CHECK_FALSE(apply_quant_override("cast", "nonsense", &s, &err));
    CHECK_FALSE(apply_quant_override("colour", "red", &s, &err));
    CHECK(err.find("unknown quantize field") != std::string::npos);
  }

  TEST_CASE("conventions: every name resolves for its targets; unknown names and targets are refused") {
    for (const QuantConventionInfo& c : quant_conventions()) {
      for (Format to : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
        std::string err;
        const bool defined = std::string(" ") .append(c.targets).append(" ").find(std::string(" ") + format_name(to) + " ") !=
                             std::string::npos;
        auto s = resolve_quant_convention(c.name, to, std::nullopt, &err);
        CHECK_MESSAGE(s.has_value() == defined, c.name, " ", format_name(to), " ", err);
        if (!s) continue;
        CHECK_NOTHROW(finalize_quant_spec(&*s, true));
        CHECK(to_string(s->granularity) == c.default_granularity);
        CHECK(s->describe().find(std::string("convention=") + c.name) != std::string::npos);
      }
    }
    std::string err;
    CHECK_FALSE(resolve_quant_convention("vllm", Format::e4m3fn, std::nullopt, &err));
    CHECK(err.find("unknown quant convention 'vllm'") != std::string::npos);
    CHECK_FALSE(resolve_quant_convention("deepgemm", Format::e5m2, std::nullopt, &err));
    CHECK(err.find("e4m3fn") != std::string::npos);
    CHECK_FALSE(resolve_quant_convention("mx", Format::e4m3fn, ScaleDtype::f32, &err));
    CHECK_FALSE(resolve_quant_convention("vllm-per-token", Format::e4m3fn, ScaleDtype::ue8m0, &err));
    // vLLM and sglang use 224 for e4m3fnuz, aiter/torch 240
    CHECK(spec_for("vllm-group", Format::e4m3fnuz).fp8_max == 224.0f);
    CHECK(spec_for("exact", Format::e4m3fnuz).fp8_max == 240.0f);
    // inconsistent fields are refused by finalize
    QuantSpec s = *resolve_quant_convention("exact", Format::e4m3fn, std::nullopt, &err);
    apply_quant_override("scale-round", "pow2-ceil", &s, &err);
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("scale-round"), InputError);
    s = *resolve_quant_convention("exact", Format::e4m3fn, ScaleDtype::ue8m0, &err);
    apply_quant_override("formula", "x*(max/amax)", &s, &err);
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("f32 scales"), InputError);
    s = *resolve_quant_convention("exact", Format::e4m3fn, std::nullopt, &err);
    apply_quant_override("formula", "x*(max/amax)", &s, &err);
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, false), doctest::Contains("static"), InputError);
    s = *resolve_quant_convention("exact", Format::e4m3fn, std::nullopt, &err);
    apply_quant_override("granularity", "mx:32", &s, &err);
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("mx-floor"), InputError);
    s = *resolve_quant_convention("exact", Format::e4m3fnuz, std::nullopt, &err);
    s.cast_convention = "cuda-satfinite";
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("cuda-satfinite"), InputError);
  }

  TEST_CASE("shapes: scale shapes and blocks of every granularity, tails, empty tensors, bad shapes") {
    auto layout = [](const char* g, std::vector<int64_t> shape, bool partial = false) {
      QuantSpec s = spec_for("exact", Format::e4m3fn, std::nullopt, {{"granularity", g}});
      if (partial) s.tail = TailPolicy::partial;
      return quant_layout(s, shape);
    };
    using V = std::vector<int64_t>;
    CHECK(layout("tensor", {4, 8}).scale_shape == V{1, 1});
    CHECK(layout("tensor", {4, 8}).block == V{4, 8});
    CHECK(layout("row", {2, 3, 8}).scale_shape == V{2, 3, 1});
    CHECK(layout("row", {2, 3, 8}).block == V{1, 1, 8});
    CHECK(layout("col", {2, 3, 8}).scale_shape == V{1, 1, 8});
    CHECK(layout("col", {2, 3, 8}).block == V{2, 3, 1});
    CHECK(layout("group:128", {5, 512}).scale_shape == V{5, 4});
    CHECK(layout("group:128", {5, 512}).block == V{1, 128});
    CHECK(layout("group:128", {5, 300}, true).scale_shape == V{5, 3});
    CHECK(layout("group:16", {64}).scale_shape == V{4});
    CHECK(layout("block:128x128", {300, 200}, true).scale_shape == V{3, 2});
    CHECK(layout("block:128x128", {2, 256, 128}).scale_shape == V{2, 2, 1});
    CHECK(layout("block:128x128", {2, 256, 128}).block == V{1, 128, 128});
    // empty tensors: q is empty, the scales keep their logical shape
    CHECK(layout("group:128", {0, 512}).scale_shape == V{0, 4});
    CHECK(layout("group:128", {4, 0}).scale_shape == V{4, 0});
    CHECK(layout("row", {4, 0}).scale_shape == V{4, 1});
    CHECK(layout("tensor", {0, 0}).n_scales == 1);
    CHECK(layout("tensor", {0, 0}).block == V{1, 1});
    CHECK_THROWS_WITH_AS(layout("group:128", {5, 300}), doctest::Contains("K (the last dimension) = 300 is not a multiple of 128"),
                         InputError);
    CHECK_THROWS_WITH_AS(layout("group:128", {5, 300}), doctest::Contains("tail=partial"), InputError);
    CHECK_THROWS_WITH_AS(layout("block:128x128", {200, 256}), doctest::Contains("M (the second-to-last dimension)"), InputError);
    CHECK_THROWS_WITH_AS(layout("block:4x4", {16}), doctest::Contains("rank >= 2"), InputError);
    CHECK_THROWS_WITH_AS(layout("row", {}), doctest::Contains("scalar"), InputError);
  }

  TEST_CASE("exact contract against an independent f64 computation: every granularity, scale dtype and target") {
    std::mt19937_64 rng(42);
    std::normal_distribution<double> normal;
    std::uniform_int_distribution<int> expo(-60, 60);
    struct Shape {
      const char* granularity;
      std::vector<int64_t> shape;
    };
    const std::vector<Shape> shapes = {{"tensor", {7, 50}},   {"row", {9, 100}},          {"col", {3, 5, 40}},
                                       {"group:32", {6, 96}}, {"group:128", {5, 300}},    {"group:16", {70}},
                                       {"block:16x32", {2, 40, 70}}, {"block:128x128", {130, 129}}};
    int64_t checked = 0, ties = 0;
    for (Format to : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
      const auto grid = positive_grid(to);
      for (ScaleDtype dt : {ScaleDtype::f32, ScaleDtype::bf16, ScaleDtype::f16, ScaleDtype::ue8m0}) {
        for (const Shape& sh : shapes) {
          const QuantSpec spec = spec_for("exact", to, dt, {{"granularity", sh.granularity}, {"tail", "partial"}});
          const double mx = spec.fp8_max;
          int64_t n = 1;
          for (int64_t d : sh.shape) n *= d;
          std::vector<float> x(static_cast<size_t>(n));
          const int64_t K = sh.shape.back();
          // Per row a magnitude 2^e (f16 scales: kept in f16's normal range); some rows all zero; some rows built
          // from exact midpoints of the grid times a power-of-two scale (ties) and their f32 neighbours.
          for (int64_t r = 0; r < n / K; ++r) {
            const int kind = static_cast<int>(rng() % 6);
            const int e = dt == ScaleDtype::f16 ? static_cast<int>(rng() % 18) - 5 : expo(rng);
            for (int64_t k = 0; k < K; ++k) {
              float& v = x[static_cast<size_t>(r * K + k)];
              if (kind == 0) {
                v = (rng() & 1) ? 0.0f : -0.0f;
              } else if (kind == 1 && dt != ScaleDtype::f16) {
                // amax = max·2^e exactly -> s = 2^e; then ties between grid values, nudged by -1, 0, +1 f32 ulp
                const size_t j = 1 + rng() % (grid.size() - 1);
                const double mid = (grid[j - 1].first + grid[j].first) / 2;
                float t = static_cast<float>(std::ldexp(mid, e));
                const int nudge = static_cast<int>(rng() % 3) - 1;
                if (nudge) t = std::nextafter(t, nudge > 0 ? 1e30f : 0.0f);
                v = k == 0 ? static_cast<float>(std::ldexp(mx, e)) : ((rng() & 1) ? t : -t);
              } else {
                v = static_cast<float>(std::ldexp(normal(rng), e));
              }
            }
          }
          const Result r = run(spec, x, sh.shape);
          // amax per group, here
          std::vector<double> amax(static_cast<size_t>(r.layout.n_scales), 0.0);
          const Granularity g = spec.granularity;
          for (int64_t i = 0; i < n; ++i) {
            const int64_t gi = group_index(g, sh.shape, i);
            amax[static_cast<size_t>(gi)] = std::max(amax[static_cast<size_t>(gi)], std::fabs(static_cast<double>(x[static_cast<size_t>(i)])));
          }
          for (size_t gi = 0; gi < amax.size(); ++gi) {
            const float s = scale_at(spec, r, gi);
            const double t = amax[gi];
            INFO(std::string(format_name(to)), " ", std::string(to_string(dt)), " ", std::string(sh.granularity), " group ", gi, " amax ", t, " scale ", s);
            if (dt == ScaleDtype::ue8m0) {
              // the smallest power of two >= amax/max (2^-127 at least)
              CHECK(static_cast<double>(s) * mx >= t);
              CHECK((s == std::ldexp(1.0f, -127) || static_cast<double>(s) / 2 * mx < t));
            } else if (t == 0) {
              CHECK(s == 0);
            } else {
              // RNE of amax/max in the scale dtype: between the midpoints with its neighbours, ties to even
              const auto [lo, hi] = scale_neighbours(dt, s);
              const double mlo = (lo + s) / 2 * mx, mhi = (s + hi) / 2 * mx;
              const uint32_t sb = dt == ScaleDtype::f32 ? bits_of(s)
                                                        : static_cast<uint32_t>(ref::narrow(Format::f32, bits_of(s),
                                                                                            dt == ScaleDtype::bf16 ? Format::bf16 : Format::f16));
              const bool even = (sb & 1) == 0;
              CHECK((t > mlo || (t == mlo && even)));
              CHECK((t < mhi || (t == mhi && even)));
            }
          }
          for (int64_t i = 0; i < n; ++i) {
            const double y = x[static_cast<size_t>(i)];
            const double s = scale_at(spec, r, static_cast<size_t>(group_index(g, sh.shape, i)));
            const uint8_t c = r.q[static_cast<size_t>(i)];
            INFO(std::string(format_name(to)), " ", std::string(to_string(dt)), " ", std::string(sh.granularity), " element ", i, " x ", y, " s ", s,
                 " code ", int(c));
            if (s == 0) {
              CHECK(y == 0);
              CHECK(is_rne(to, grid, y, 1, c));
              CHECK(r.exact[static_cast<size_t>(i)] == 0);
              continue;
            }
            CHECK(is_rne(to, grid, y, s, c));
            CHECK(r.exact[static_cast<size_t>(i)] == y / s);
            ++checked;
            for (size_t j = 1; j < grid.size(); ++j) ties += std::fabs(y) == (grid[j - 1].first + grid[j].first) / 2 * s;
          }
        }
      }
    }
    CHECK(checked > 100000);
    CHECK(ties > 1000);  // exact midpoints: round half to even exercised
  }

  TEST_CASE("exact: zero groups give s = 0 and signed zeros; NaN skips amax and stays NaN; Inf gives s = Inf") {
    const QuantSpec spec = spec_for("exact", Format::e4m3fn, std::nullopt, {{"granularity", "group:4"}});
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {0.0f, -0.0f, 0.0f, -0.0f,   // zeros
                                  nan, 1.0f, -2.0f, 0.5f,     // NaN inside a group
                                  inf, 3.0f, -1.0f, -inf};    // Inf inside a group
    const Result r = run(spec, x, {12});
    CHECK(scale_at(spec, r, 0) == 0.0f);
    CHECK(r.q[0] == 0x00);
    CHECK(r.q[1] == 0x80);
    CHECK(scale_at(spec, r, 1) == 2.0f / 448.0f);  // NaN skipped, amax = 2: RN(2/448) exactly rounded once
    CHECK(r.q[4] == 0x7F);                          // NaN -> the cast's NaN (sign of the canonical NaN: +)
    CHECK(r.q[6] == 0xFE);                          // -2 / (2/448) -> -448
    CHECK(std::isinf(scale_at(spec, r, 2)));
    CHECK(r.q[8] == 0x7F);   // Inf/Inf = NaN
    CHECK(r.q[9] == 0x00);   // 3/Inf = +0
    CHECK(r.q[10] == 0x80);  // -1/Inf = -0
    CHECK(std::isnan(r.exact[8]));
  }

  TEST_CASE("vllm-group: eps floor, x/s, fminf(fmaxf()) turns NaN into -max, Inf poisons only itself") {
    const QuantSpec spec = spec_for("vllm-group", Format::e4m3fn, std::nullopt, {{"granularity", "group:4"}});
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {1.0f, 2.0f, nan, -3.0f,  0.0f, 0.0f, -0.0f, 0.0f,  1e-12f, -2e-12f, 0.0f, 0.0f,
                                  inf, 1.0f, -inf, 0.0f};
    const Result r = run(spec, x, {16});
    const float s0 = 3.0f / 448.0f;
    CHECK(scale_at(spec, r, 0) == s0);
    CHECK(r.q[0] == ref::encode_f32(1.0f / s0, *resolve_convention("torch-2.11", Format::f32, Format::e4m3fn, nullptr)));
    CHECK(r.q[2] == 0xFE);  // NaN: fmaxf(NaN, -448) = -448
    CHECK(r.q[3] == 0xFE);
    CHECK(scale_at(spec, r, 1) == 1e-10f / 448.0f);  // zeros: amax = eps
    CHECK(r.q[4] == 0x00);
    CHECK(r.q[6] == 0x80);
    CHECK(scale_at(spec, r, 2) == 1e-10f / 448.0f);  // a tiny group under the guard
    CHECK(r.q[8] == ref::encode_f32(1e-12f / (1e-10f / 448.0f), *resolve_convention("torch-2.11", Format::f32, Format::e4m3fn, nullptr)));
    CHECK(std::isinf(scale_at(spec, r, 3)));
    CHECK(r.q[12] == 0xFE);  // Inf/Inf = NaN -> -448
    CHECK(r.q[13] == 0x00);  // 1/Inf = 0
    CHECK(r.q[14] == 0xFE);
    // ue8m0: scales are f32 powers of two, floored at 1e-10 before the ceil
    const QuantSpec u = spec_for("vllm-group", Format::e4m3fn, ScaleDtype::ue8m0, {{"granularity", "group:4"}});
    const Result ru = run(u, x, {16});
    REQUIRE(ru.scales.size() == 16);  // 4 f32
    CHECK(scale_at(u, ru, 0) == 1.0f / 128);        // 3/448 = 0.0067 -> 2^-7
    CHECK(scale_at(u, ru, 1) == std::ldexp(1.0f, -33));  // max(1e-10/448, 1e-10) = 1e-10 -> 2^-33
    CHECK(std::isinf(scale_at(u, ru, 3)));          // Inf held as f32
    CHECK(ru.q[13] == 0x00);
  }

  TEST_CASE("vllm-per-token: min scale 1/(448·512), fmaxf(fminf()) turns NaN into +max, satfinite cast") {
    const QuantSpec spec = spec_for("vllm-per-token", Format::e4m3fn);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x = {0.0f, 0.0f, 0.0f, 0.0f, 1.0f, nan, -2.0f, 448.0f};
    const Result r = run(spec, x, {2, 4});
    CHECK(r.layout.scale_shape == std::vector<int64_t>{2, 1});
    CHECK(scale_at(spec, r, 0) == 1.0f / (448.0f * 512.0f));
    CHECK(r.q[0] == 0);
    CHECK(scale_at(spec, r, 1) == 1.0f);
    CHECK(r.q[5] == 0x7E);  // NaN -> +448
    CHECK(r.q[6] == 0xC0);  // -2
    CHECK(r.q[7] == 0x7E);
  }

  TEST_CASE("an op refuses a spec that was not finalized (or was overridden since), on both backends") {
    std::string err;
    QuantSpec s = *resolve_quant_convention("vllm-group", Format::e4m3fnuz, std::nullopt, &err);
    const std::vector<float> x(256, 1.5f);
    std::vector<uint8_t> q(256);
    std::vector<float> sc(2);
    auto both = [&](const QuantSpec& spec) {
      CHECK_THROWS_WITH_AS(ref::quantize(spec, Format::f32, x.data(), {2, 128}, q.data(), sc.data()),
                           doctest::Contains("not finalized"), InputError);
      CHECK_THROWS_WITH_AS(cpu::quantize(spec, Format::f32, x.data(), {2, 128}, q.data(), sc.data()),
                           doctest::Contains("not finalized"), InputError);
      CHECK_THROWS_WITH_AS(cpu::quantize_static(spec, Format::f32, x.data(), {2, 128}, sc.data(), q.data()),
                           doctest::Contains("not finalized"), InputError);
    };
    both(s);  // (its default cast is e4m3fn's: every e4m3fnuz code would come out wrong)
    finalize_quant_spec(&s, true);
    CHECK_NOTHROW(cpu::quantize(s, Format::f32, x.data(), {2, 128}, q.data(), sc.data()));
    REQUIRE(apply_quant_override("cast", "torch-2.11", &s, &err));
    both(s);
    finalize_quant_spec(&s, true);
    CHECK_NOTHROW(ref::quantize(s, Format::f32, x.data(), {2, 128}, q.data(), sc.data()));
  }

  TEST_CASE("vllm-per-tensor: scale amax/448 with no floor, x·RN(1/s), NaN -> +max; an all-zero tensor gives 0 and +max") {
    const QuantSpec spec = spec_for("vllm-per-tensor", Format::e4m3fn);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const Result r = run(spec, {0.08886719f, 0.17089844f, nan, -7.0f * 448.0f}, {2, 2});
    CHECK(r.layout.scale_shape == std::vector<int64_t>{1, 1});
    const float s = 7.0f * 448.0f / 448.0f;
    CHECK(scale_at(spec, r, 0) == s);
    const ConversionSpec sat = *resolve_convention("cuda-satfinite", Format::f32, Format::e4m3fn, nullptr);
    CHECK(r.q[0] == ref::encode_f32(0.08886719f * (1.0f / s), sat));  // x·(1/s): 7, where x/s gives 6
    CHECK(r.q[0] == 7);
    CHECK(r.q[1] == 13);
    CHECK(r.q[2] == 0x7E);  // NaN -> +448
    CHECK(r.q[3] == 0xFE);
    const Result z = run(spec, {0.0f, -0.0f, 0.0f, 0.0f}, {4});
    CHECK(scale_at(spec, z, 0) == 0.0f);  // no floor
    for (int i = 0; i < 4; ++i) CHECK(z.q[static_cast<size_t>(i)] == 0x7E);  // 0 · (1/0) = NaN -> +448
  }

  TEST_CASE("sglang-triton: x·(1 ⊘ s) with Triton's division, tl.clamp with runtime bounds turns NaN into -max (H200)") {
    const QuantSpec spec = spec_for("sglang-triton", Format::e4m3fn, std::nullopt, {{"granularity", "group:8"}});
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> x = {3.0f, 1.0f, nan, -0.7f, 0.3f, 2.9f, -1.1f, 0.01f};
    const Result r = run(spec, x, {8});
    // Triton's `/` (div.full.f32, include/fp8ref/triton_div.h): here 3/448 is one ulp off the IEEE quotient
    const float s = ref::triton_nv_div(3.0f, 448.0f), inv = ref::triton_nv_div(1.0f, s);
    CHECK(s != 3.0f / 448.0f);
    CHECK(scale_at(spec, r, 0) == s);
    const ConversionSpec sat = *resolve_convention("cuda-satfinite", Format::f32, Format::e4m3fn, nullptr);
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) {
        CHECK(r.q[i] == 0xFE);
        continue;
      }
      const float v = std::fmin(std::fmax(x[i] * inv, -448.0f), 448.0f);
      CHECK(r.q[i] == ref::encode_f32(v, sat));
    }
  }

  TEST_CASE("deepseek-act-quant: 1e-4 floor, x/s unclamped, saturating cast keeps NaN") {
    const QuantSpec spec = spec_for("deepseek-act-quant", Format::e4m3fn, std::nullopt, {{"granularity", "group:4"}});
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> x = {0, 0, 0, 0,  1e-7f, -1e-7f, 0, 0,  nan, 2.0f, -1.0f, 0,  inf, 1.0f, -2.0f, 0};
    const Result r = run(spec, x, {16});
    CHECK(scale_at(spec, r, 0) == 1e-4f / 448.0f);
    CHECK(r.q[0] == 0);
    CHECK(scale_at(spec, r, 1) == 1e-4f / 448.0f);  // a tiny group under the guard: q = 1e-7 / 2.2e-7
    CHECK(r.q[4] == ref::encode_f32(1e-7f / (1e-4f / 448.0f), *resolve_convention("cuda-satfinite", Format::f32, Format::e4m3fn, nullptr)));
    CHECK(r.q[8] == 0x7F);  // NaN stays NaN (no clamp)
    CHECK(r.q[9] == 0x7E);
    CHECK(r.q[12] == 0x7F);  // Inf/Inf
    CHECK(r.q[13] == 0x00);
    CHECK(r.q[14] == 0x80);
    // ue8m0 (V3.1 scale_fmt): s = 2^ceil(log2(amax/448)), held as f32
    const QuantSpec u = spec_for("deepseek-act-quant", Format::e4m3fn, ScaleDtype::ue8m0, {{"granularity", "group:4"}});
    const Result ru = run(u, {448.0f, 1.0f, 0, 0, 449.0f, -3.0f, 0, 0}, {8});
    CHECK(scale_at(u, ru, 0) == 1.0f);
    CHECK(scale_at(u, ru, 1) == 2.0f);
    CHECK(ru.q[0] == 0x7E);
  }

  TEST_CASE("deepgemm: NaN poisons the group, scale = amax·RN(1/448), x·RN(1/s), torch cast, K tail padded") {
    const QuantSpec spec = spec_for("deepgemm", Format::e4m3fn, std::nullopt, {{"granularity", "group:4"}});
    CHECK(spec.tail == TailPolicy::partial);
    // a value where the reciprocal multiply and the division differ
    const float inv448 = 1.0f / 448.0f;
    float a = 1.0f;
    std::mt19937 rng(3);
    for (int i = 0; i < 100000; ++i) {
      a = std::ldexp(1.0f + static_cast<float>(rng() % (1u << 23)) * 0x1p-23f, static_cast<int>(rng() % 20) - 10);
      if (a * inv448 != a / 448.0f) break;
    }
    REQUIRE(a * inv448 != a / 448.0f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x = {a, -a / 2, 0, 0,  1.0f, nan, -2.0f, 0,  0, 0, 0, 0,  5.0f, -1.0f};
    const Result r = run(spec, x, {14});  // K = 14: the last group holds 2 elements
    CHECK(r.layout.scale_shape == std::vector<int64_t>{4});
    CHECK(scale_at(spec, r, 0) == a * inv448);
    const float s0 = a * inv448, r0 = 1.0f / s0;
    const ConversionSpec torch_cuda = *resolve_convention("torch-2.11-cuda", Format::f32, Format::e4m3fn, nullptr);
    CHECK(r.q[0] == ref::encode_f32(a * r0, torch_cuda));
    CHECK(r.q[1] == ref::encode_f32(-a / 2 * r0, torch_cuda));
    CHECK(std::isnan(scale_at(spec, r, 1)));  // torch amax propagates NaN; clamp keeps it
    CHECK(bits_of(scale_at(spec, r, 1)) == 0x7FFFFFFFu);
    for (int i = 4; i < 8; ++i) CHECK(r.q[static_cast<size_t>(i)] == 0x7F);  // the whole group NaN, positive (GPU)
    CHECK(scale_at(spec, r, 2) == 1e-4f * inv448);
    CHECK(scale_at(spec, r, 3) == 5.0f * inv448);
    // ue8m0: ceil_to_ue8m0 clamps the exponent to [1, 254] — a NaN scale becomes 2^127
    const QuantSpec u = spec_for("deepgemm", Format::e4m3fn, ScaleDtype::ue8m0, {{"granularity", "group:4"}});
    const Result ru = run(u, x, {14});
    CHECK(scale_at(u, ru, 1) == std::ldexp(1.0f, 127));
    CHECK(ru.q[4] == 0x00);  // 1 · 2^-127 -> 0
    CHECK(ru.q[5] == 0x7F);
    CHECK(ru.q[6] == 0x80);
    CHECK(scale_at(u, ru, 2) == std::ldexp(1.0f, -22));  // 1e-4/448 = 2.2e-7 -> 2^-22
  }

  TEST_CASE("mx: X = 2^(floor(log2 amax) - 8), saturating elements, NaN or Inf -> NaN block, zero block -> 2^-127") {
    const QuantSpec spec = spec_for("mx", Format::e4m3fn);
    CHECK(scale_storage(spec) == Format::ue8m0);
    std::vector<float> x(128, 0.0f);
    for (int i = 0; i < 32; ++i) x[static_cast<size_t>(i)] = i == 0 ? 60.8f : 0.25f * static_cast<float>(i);
    x[40] = std::numeric_limits<float>::quiet_NaN();
    x[64 + 3] = std::numeric_limits<float>::infinity();
    for (int i = 96; i < 128; ++i) x[static_cast<size_t>(i)] = 0.0f;
    const Result r = run(spec, x, {128});
    CHECK(r.scales[0] == 5 - 8 + 127);  // 60.8 = 1.9·2^5
    CHECK(r.q[0] == 0x7E);              // 60.8/2^-3 = 486.4 -> clamped to 448
    CHECK(r.q[4] == ref::encode_f32(1.0f * 8, *resolve_convention("ocp-sat", Format::f32, Format::e4m3fn, nullptr)));
    CHECK(r.scales[1] == 0xFF);
    CHECK(r.q[33] == 0x7F);
    CHECK(r.scales[2] == 0xFF);
    CHECK(r.scales[3] == 0x00);
    CHECK(r.q[100] == 0x00);
    const QuantSpec e5 = spec_for("mx", Format::e5m2);
    const Result r5 = run(e5, std::vector<float>(32, 1.0f), {32});
    CHECK(r5.scales[0] == 0 - 15 + 127);
  }

  TEST_CASE("static scales: given values, the clamp and the cast's overflow policy at the thresholds") {
    // s = 1: quotients 448, 464 (the tie to 448), 464·(1+2^-23) and 480 (overflow), NaN
    const std::vector<float> x = {448.0f, 464.0f, std::nextafter(464.0f, 1e9f), 480.0f, -500.0f,
                                  std::numeric_limits<float>::quiet_NaN(), 0.0f, 1.0f};
    const std::vector<float> s = {1.0f};
    auto q_of = [&](const QuantSpec& spec) {
      std::vector<uint8_t> q(x.size());
      ref::quantize_static(spec, Format::f32, x.data(), {8}, s.data(), q.data());
      return q;
    };
    const std::vector<uint8_t> exact = q_of(spec_for("exact", Format::e4m3fn, std::nullopt, {{"granularity", "tensor"}}, false));
    CHECK(exact == std::vector<uint8_t>{0x7E, 0x7E, 0x7F, 0x7F, 0xFF, 0x7F, 0x00, 0x38});
    const std::vector<uint8_t> vllm = q_of(spec_for("vllm-group", Format::e4m3fn, std::nullopt, {{"granularity", "tensor"}}, false));
    CHECK(vllm == std::vector<uint8_t>{0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0xFE, 0x00, 0x38});
    const std::vector<uint8_t> ds = q_of(spec_for("deepseek-act-quant", Format::e4m3fn, std::nullopt, {{"granularity", "tensor"}}, false));
    CHECK(ds == std::vector<uint8_t>{0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x00, 0x38});
    const std::vector<uint8_t> dg = q_of(spec_for("deepgemm", Format::e4m3fn, std::nullopt, {{"granularity", "tensor"}}, false));
    CHECK(dg == std::vector<uint8_t>{0x7E, 0x7E, 0x7F, 0x7F, 0xFF, 0x7F, 0x00, 0x38});
  }

  TEST_CASE("dequantize: one f32 multiply, then bf16/f16 rounding; NaN canonical; every granularity's grouping") {
    QuantSpec spec;
    spec.to = Format::e4m3fn;
    spec.scale_dtype = ScaleDtype::f32;
    std::string err;
    REQUIRE(apply_quant_override("granularity", "block:2x3", &spec, &err));
    spec.tail = TailPolicy::partial;
    const std::vector<int64_t> shape = {3, 5};
    std::vector<uint8_t> q(15);
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>(0x30 + 5 * i);
    q[7] = 0x7F;  // NaN
    const std::vector<float> s = {1.1f, 0.3f, 7.0f, 1e-3f};
    std::vector<float> out(15);
    std::vector<double> ex(15);
    ref::dequantize(spec, q.data(), shape, s.data(), Format::f32, out.data(), ex.data());
    std::vector<uint16_t> outb(15);
    ref::dequantize(spec, q.data(), shape, s.data(), Format::bf16, outb.data());
    for (int64_t i = 0; i < 15; ++i) {
      const int64_t g = (i / 5 / 2) * 2 + (i % 5) / 3;
      const float v = static_cast<float>(ref::value_of(Format::e4m3fn, q[static_cast<size_t>(i)]));
      INFO(i);
      if (i == 7) {
        CHECK(bits_of(out[7]) == 0x7FFFFFFFu);
        continue;
      }
      CHECK(out[static_cast<size_t>(i)] == v * s[static_cast<size_t>(g)]);  // one f32 multiply
      CHECK(ex[static_cast<size_t>(i)] == static_cast<double>(v) * s[static_cast<size_t>(g)]);
      CHECK(outb[static_cast<size_t>(i)] == ref::narrow(Format::f32, bits_of(v * s[static_cast<size_t>(g)]), Format::bf16));
    }
    // ue8m0 codes
    QuantSpec u = spec;
    u.scale_dtype = ScaleDtype::ue8m0;
    u.granularity.kind = GranularityKind::tensor;
    const uint8_t code = 120;
    ref::dequantize(u, q.data(), shape, &code, Format::f32, out.data());
    CHECK(out[0] == static_cast<float>(ref::value_of(Format::e4m3fn, q[0])) * std::ldexp(1.0f, -7));
  }

  TEST_CASE("quantize → dequantize is within half an FP8 ulp times the scale (exact, every target)") {
    std::mt19937_64 rng(9);
    std::normal_distribution<float> normal;
    for (Format to : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz, Format::e5m2fnuz}) {
      const QuantSpec spec = spec_for("exact", to, std::nullopt, {{"granularity", "group:64"}});
      std::vector<float> x(8 * 256);
      for (auto& v : x) v = normal(rng) * 5;
      const Result r = run(spec, x, {8, 256});
      std::vector<float> y(x.size());
      ref::dequantize(spec, r.q.data(), {8, 256}, r.scales.data(), Format::f32, y.data());
      const double rel = format_info(to).man_bits == 3 ? 1.0 / 16 : 1.0 / 8;
      for (size_t i = 0; i < x.size(); ++i) {
        const double s = scale_at(spec, r, i / 64);
        CHECK(std::fabs(static_cast<double>(y[i]) - x[i]) <= std::max(std::fabs(static_cast<double>(x[i])) * rel, s * 0.002) * 1.0001);
      }
    }
  }

  TEST_CASE("registry: quantize and dequantize golden cases, both backends bit-identical, outputs metadata") {
    using namespace fp8ref::golden;
    for (const char* line :
         {"quantize from=bf16 shape=8x300 convention=deepgemm fill=normal:amax=8+special:rate=0.02 seed=3",
          "quantize from=bf16 shape=8x256 convention=vllm-group scale-dtype=ue8m0 fill=normal:amax=1e-9 seed=4",
          "quantize from=f16 to=e4m3fnuz shape=2x64x128 convention=vllm-per-token seed=5",
          "quantize shape=64x96 granularity=mx:32 convention=mx fill=normal:amax=1000+special:rate=0.01 seed=6",
          "quantize shape=256x256 granularity=block:128x128 convention=exact scale-dtype=bf16 seed=7",
          "quantize shape=16x128 convention=vllm-group mode=static fill=near-max:format=e4m3fn seed=8",
          "quantize shape=16x128 convention=exact scale-dtype=ue8m0 mode=static seed=9",
          "dequantize from=e5m2 to=bf16 shape=32x100 granularity=group:32 tail=partial fill=codes:format=e5m2 seed=10",
          "dequantize shape=16x64 granularity=mx:32 scale-dtype=ue8m0 seed=11"}) {
      INFO(line);
      const Descriptor d = parse_descriptor(line);
      CHECK(parse_descriptor(to_string(d)) == d);
      const io::SafetensorsFile g = make_golden(d);
      const nlohmann::json outs = nlohmann::json::parse(g.metadata.at("fp8ref.outputs"));
      for (auto& [name, o] : outs.items()) {
        CHECK(g.find(name) != nullptr);
        if (o["role"] == "scale") {
          CHECK(o["of"] == "output.q");
          CHECK(o["block"].size() == g.find("output.q")->shape.size());
        }
      }
      CHECK(g.find(d.op == "quantize" ? "exact.q" : "exact.x") != nullptr);
      const Tensors want = tensors_with_prefix(g, "output.");
      for (const char* backend : {"reference", "cpu"}) {
        const io::SafetensorsFile r = run_case(g, backend, "golden");
        const Tensors got = tensors_with_prefix(r, "output.");
        REQUIRE(want.size() == got.size());
        for (size_t i = 0; i < want.size(); ++i) {
          CHECK(want[i].name == got[i].name);
          CHECK(want[i].dtype == got[i].dtype);
          CHECK(want[i].shape == got[i].shape);
          CHECK(want[i].data == got[i].data);
        }
      }
    }
    CHECK(std::string(find_kernel("quantize", "cpu").name).find("cpu::quantize") != std::string::npos);
    CHECK_THROWS_WITH_AS(make_golden(parse_descriptor("quantize shape=8x300 convention=vllm-group")),
                         doctest::Contains("tail=partial"), InputError);
    CHECK_THROWS_WITH_AS(make_golden(parse_descriptor("quantize convention=vllm")), doctest::Contains("unknown quant convention"),
                         InputError);
    CHECK_THROWS_WITH_AS(make_golden(parse_descriptor("quantize to=e5m2 convention=deepgemm")), doctest::Contains("e4m3fn"),
                         InputError);
    // a static case whose scale tensor has the wrong shape
    io::SafetensorsFile st = make_golden(parse_descriptor("quantize shape=16x128 convention=vllm-group mode=static"));
    for (auto& t : st.tensors)
      if (t.name == "input.scale") t.shape = {16, 2};
    CHECK_THROWS_WITH_AS(run_case(st, "cpu", "case.safetensors"), doctest::Contains("input.scale"), InputError);
  }
}

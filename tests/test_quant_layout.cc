// Scale layouts (include/fp8ref/scale_layout.h) on hand-computed tensors, Triton's division against the H200 capture
// (include/fp8ref/triton_div.h), the bit-built reciprocal formulas of sgl-kernel / sglang JIT, the conventions that use
// them, and the golden ops with layouts (both backends, metadata, bad scale tensors).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fp8ref/diff.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"
#include "fp8ref/quant.h"
#include "fp8ref/triton_div.h"

using namespace fp8ref;

namespace {

float f32_of(uint32_t b) { return fp8ref::f32_from_bits(b); }
uint32_t bits_of(float f) { return fp8ref::bits_of_f32(f); }

std::vector<uint32_t> as_words(const std::vector<uint8_t>& b) {
  std::vector<uint32_t> w(b.size() / 4);
  std::memcpy(w.data(), b.data(), b.size());
  return w;
}

QuantSpec spec_for(const char* convention, std::optional<ScaleDtype> dt = std::nullopt,
                   std::vector<std::pair<const char*, const char*>> overrides = {}) {
  std::string err;
  auto s = resolve_quant_convention(convention, Format::e4m3fn, dt, &err);
  REQUIRE_MESSAGE(s.has_value(), err);
  for (auto& [k, v] : overrides) REQUIRE_MESSAGE(apply_quant_override(k, v, &*s, &err), err);
  finalize_quant_spec(&*s, true);
  return *s;
}

}  // namespace

TEST_SUITE("quant") {
  TEST_CASE("scale layouts: col-major, tma-aligned, packed-ue8m0 on a hand-made [2, 3, 5] tensor, and back") {
    const std::vector<int64_t> logical = {2, 3, 5};  // B = 2, R = 3 rows, C = 5 columns
    std::vector<uint32_t> v(30);
    for (uint32_t i = 0; i < 30; ++i) v[i] = 1000 + i;  // S[b][r][c] = 1000 + (b*3 + r)*5 + c
    auto S = [](int b, int r, int c) { return 1000u + static_cast<uint32_t>((b * 3 + r) * 5 + c); };

    CHECK(stored_scale_shape(ScaleLayout::row_major, logical, 4, false).shape == logical);
    // col-major: [2, 5, 3], stored[b][c][r] = S[b][r][c]
    const auto col = as_words(to_scale_layout(ScaleLayout::col_major, logical, 4, false, v.data()));
    CHECK(stored_scale_shape(ScaleLayout::col_major, logical, 4, false).shape == std::vector<int64_t>{2, 5, 3});
    CHECK(col[(1 * 5 + 4) * 3 + 2] == S(1, 2, 4));
    CHECK(col[(0 * 5 + 1) * 3 + 0] == S(0, 0, 1));
    // tma-aligned f32: [2, 5, 4] (3 rows padded to 4), pads zero
    const auto tma = as_words(to_scale_layout(ScaleLayout::tma_aligned, logical, 4, false, v.data()));
    CHECK(stored_scale_shape(ScaleLayout::tma_aligned, logical, 4, false).shape == std::vector<int64_t>{2, 5, 4});
    CHECK(tma[(1 * 5 + 3) * 4 + 1] == S(1, 1, 3));
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 5; ++c) CHECK(tma[(b * 5 + c) * 4 + 3] == 0);
    // bf16 elements pad to 8 rows, E8M0 bytes to 16 (16-byte TMA alignment)
    CHECK(stored_scale_shape(ScaleLayout::tma_aligned, logical, 2, false).shape == std::vector<int64_t>{2, 5, 8});
    CHECK(stored_scale_shape(ScaleLayout::tma_aligned, logical, 1, true).shape == std::vector<int64_t>{2, 5, 16});
    CHECK(stored_scale_shape(ScaleLayout::tma_aligned, {8, 4}, 4, false).shape == std::vector<int64_t>{4, 8});
    // inverse, with garbage in the pads
    std::vector<uint32_t> dirty = tma;
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 5; ++c) dirty[(b * 5 + c) * 4 + 3] = 0xDEADBEEF;
    CHECK(as_words(from_scale_layout(ScaleLayout::tma_aligned, logical, 4, false, dirty.data())) == v);
    CHECK(as_words(from_scale_layout(ScaleLayout::col_major, logical, 4, false, col.data())) == v);

    // packed-ue8m0 from E8M0 codes: int32 [2, 2, 4]; word [b][p][r] byte j = code [b][r][4p + j]; tail bytes 0
    std::vector<uint8_t> codes(30);
    for (int i = 0; i < 30; ++i) codes[i] = static_cast<uint8_t>(100 + i);
    const StoredScaleShape ps = stored_scale_shape(ScaleLayout::packed_ue8m0, logical, 1, true);
    CHECK(ps.packed);
    CHECK(ps.shape == std::vector<int64_t>{2, 2, 4});
    const auto packed = as_words(to_scale_layout(ScaleLayout::packed_ue8m0, logical, 1, true, codes.data()));
    auto code = [&](int b, int r, int c) { return static_cast<uint32_t>(codes[(b * 3 + r) * 5 + c]); };
    CHECK(packed[(0 * 2 + 0) * 4 + 1] == (code(0, 1, 0) | code(0, 1, 1) << 8 | code(0, 1, 2) << 16 | code(0, 1, 3) << 24));
    CHECK(packed[(1 * 2 + 1) * 4 + 2] == code(1, 2, 4));  // the last word holds group 4 only
    for (int b = 0; b < 2; ++b)
      for (int p = 0; p < 2; ++p) CHECK(packed[(b * 2 + p) * 4 + 3] == 0);  // pad row
    CHECK(from_scale_layout(ScaleLayout::packed_ue8m0, logical, 1, true, packed.data()) == codes);
    // ue8m0 held as f32: the exponent field is packed (0.0 -> 0, 2^(c-127) -> c, Inf/NaN -> 0xFF); back: c << 23, NaN
    std::vector<uint32_t> held = {0, 0x3F800000u, 0x7F800000u, 0x7FFFFFFFu, 0x00800000u, 0x41000000u};
    const auto pk = as_words(to_scale_layout(ScaleLayout::packed_ue8m0, {2, 3}, 4, true, held.data()));
    CHECK(pk.size() == 4);  // [1, 4]
    CHECK(pk[0] == (0u | 127u << 8 | 255u << 16));
    CHECK(pk[1] == (255u | 1u << 8 | 130u << 16));
    CHECK(as_words(from_scale_layout(ScaleLayout::packed_ue8m0, {2, 3}, 4, true, pk.data())) ==
          std::vector<uint32_t>{0, 0x3F800000u, 0x7FFFFFFFu, 0x7FFFFFFFu, 0x00800000u, 0x41000000u});
    // a file holding bf16 scales as f32 values keeps the bf16 padding (8 rows)
    CHECK(stored_scale_shape(ScaleLayout::tma_aligned, logical, 4, false, 2).shape == std::vector<int64_t>{2, 5, 8});

    // names and refusals
    for (ScaleLayout l : {ScaleLayout::row_major, ScaleLayout::col_major, ScaleLayout::tma_aligned, ScaleLayout::packed_ue8m0}) {
      ScaleLayout back;
      CHECK(parse_scale_layout(to_string(l), &back));
      CHECK(back == l);
    }
    ScaleLayout dummy;
    CHECK_FALSE(parse_scale_layout("column-major", &dummy));
    CHECK_THROWS_WITH_AS(stored_scale_shape(ScaleLayout::col_major, {4}, 4, false), doctest::Contains("rank >= 2"), InputError);
    CHECK_THROWS_WITH_AS(stored_scale_shape(ScaleLayout::packed_ue8m0, {4, 4}, 4, false), doctest::Contains("ue8m0"),
                         InputError);
  }

  TEST_CASE("triton-nv division: the captured reciprocal table reproduces Triton's x / y on the H200 pairs") {
    // tests/data/h200/triton_div_pairs.npy: (x, y, Triton x / y) bit patterns from tools/device/capture_quant_kernels.py
    // (Triton 3.6.0 on the H200): random operands of every class — normal, |y| > 2^126, subnormal y, tiny normal y,
    // subnormal x, overflowing and underflowing quotients, any bits — plus all pairs of 15 special values and
    // Triton's 1.0 / y.
    const io::Tensor t = io::read_npy(std::string(FP8REF_TEST_DATA) + "/h200/triton_div_pairs.npy");
    REQUIRE(t.shape.size() == 2);
    REQUIRE(t.shape[1] == 3);
    const int64_t n = t.shape[0];
    CHECK(n > 20000);
    std::vector<uint32_t> w(static_cast<size_t>(n) * 3);
    std::memcpy(w.data(), t.data.data(), w.size() * 4);
    int64_t bad = 0, ieee_differs = 0, subnormal_y = 0, huge_y = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = f32_of(w[3 * i]), y = f32_of(w[3 * i + 1]);
      const uint32_t want = w[3 * i + 2];
      const uint32_t got = bits_of(ref::triton_nv_div(x, y));
      if (got != want) {
        if (bad < 5) MESSAGE("x=", w[3 * i], " y=", w[3 * i + 1], " triton=", want, " fp8ref=", got);
        ++bad;
      }
      const float ieee = x / y;
      if (!(std::isnan(ieee) && std::isnan(f32_of(want))) && bits_of(ieee) != want) ++ieee_differs;
      if (y != 0 && std::fabs(y) < 0x1p-126f) ++subnormal_y;
      if (std::fabs(y) > 0x1p126f) ++huge_y;
    }
    CHECK(bad == 0);
    CHECK(ieee_differs > 1000);  // the control: IEEE division is not Triton's
    CHECK(subnormal_y > 1000);
    CHECK(huge_y > 1000);
    // the table: -1 ulp for 374,723 mantissas, +1 ulp for 733,799 (the capture's histogram)
    int64_t lo = 0, hi = 0;
    for (uint32_t m = 0; m < (1u << 23); ++m) {
      const int32_t d = static_cast<int32_t>(bits_of(ref::triton_nv_rcp_mantissa(m)) - bits_of(1.0f / f32_of(0x3F800000u | m)));
      lo += d == -1;
      hi += d == 1;
    }
    CHECK(lo == 374723);
    CHECK(hi == 733799);
  }

  TEST_CASE("conventions: Triton ones divide with triton-nv; sgl-kernel / sglang-jit formulas; default layouts") {
    CHECK(spec_for("sglang-triton").div == Division::triton_nv);
    CHECK(spec_for("deepseek-act-quant").div == Division::triton_nv);
    CHECK(spec_for("vllm-group").div == Division::ieee);
    std::string e0;
    CHECK(resolve_quant_convention("sglang-triton", Format::e4m3fnuz, std::nullopt, &e0)->div == Division::ieee);  // ROCm
    const QuantSpec col = spec_for("sglang-triton-colmajor");
    CHECK(col.div == Division::triton_nv);
    CHECK(col.formula == QuantFormula::div);
    CHECK(col.scale_layout == ScaleLayout::tma_aligned);
    CHECK(col.describe().find("div=triton-nv scale-layout=tma-aligned") != std::string::npos);
    CHECK(spec_for("sgl-kernel").formula == QuantFormula::max_div_amax);
    CHECK(spec_for("sgl-kernel").scale_formula == ScaleFormula::mul_rcp);
    const QuantSpec sk8 = spec_for("sgl-kernel", ScaleDtype::ue8m0);
    CHECK(sk8.formula == QuantFormula::mul_rcp_bits);
    CHECK(sk8.scale_layout == ScaleLayout::packed_ue8m0);
    CHECK(sk8.scale_store == ScaleStore::native);
    CHECK(spec_for("sglang-jit").formula == QuantFormula::max_mul_rcp_amax);
    CHECK(spec_for("sglang-jit", ScaleDtype::ue8m0).formula == QuantFormula::mul_rcp_bits_in);
    std::string err;
    CHECK_FALSE(resolve_quant_convention("sgl-kernel", Format::e4m3fnuz, std::nullopt, &err));
    CHECK_FALSE(resolve_quant_convention("sglang-jit", Format::e4m3fn, ScaleDtype::bf16, &err));
    QuantSpec s = spec_for("exact");
    CHECK_FALSE(apply_quant_override("div", "fast", &s, &err));
    CHECK(err.find("ieee, triton-nv") != std::string::npos);
    CHECK_FALSE(apply_quant_override("scale-layout", "colmajor", &s, &err));
    CHECK(err.find("packed-ue8m0") != std::string::npos);
    // the bit-built multiplier needs ue8m0 codes; packed needs ue8m0
    REQUIRE(apply_quant_override("formula", "x*rcp-bits(s)", &s, &err));
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("needs ue8m0 scales"), InputError);
    s = spec_for("exact");
    REQUIRE(apply_quant_override("scale-layout", "packed-ue8m0", &s, &err));
    CHECK_THROWS_WITH_AS(finalize_quant_spec(&s, true), doctest::Contains("scale-dtype ue8m0"), InputError);
    // a layout needs rank >= 2 scales
    QuantSpec r1 = spec_for("vllm-group", std::nullopt, {{"scale-layout", "col-major"}});
    CHECK_THROWS_WITH_AS(quant_layout(r1, {512}), doctest::Contains("rank >= 2"), InputError);
  }

  TEST_CASE("x*rcp-bits(s): an Inf in the group gives code 0xFF and multiplier -Inf; @in multiplies in f16/bf16") {
    // sgl-kernel ue8m0, f32 source: group 0 = {+Inf, 2, 0, -3}, group 1 = {1, ...}
    const QuantSpec sk = spec_for("sgl-kernel", ScaleDtype::ue8m0, {{"granularity", "group:4"}, {"scale-layout", "row-major"}});
    const std::vector<float> x = {INFINITY, 2.0f, 0.0f, -3.0f, 1.0f, 0.5f, -0.25f, 0.0f};
    std::vector<uint8_t> q(8), s(2);
    ref::quantize(sk, Format::f32, x.data(), {1, 8}, q.data(), s.data());
    CHECK(s[0] == 0xFF);
    CHECK(q[0] == 0xFE);  // +Inf * -Inf = -Inf -> satfinite -448
    CHECK(q[1] == 0xFE);  // 2 * -Inf
    CHECK(q[2] == 0x7F);  // 0 * -Inf = NaN
    CHECK(q[3] == 0x7E);  // -3 * -Inf = +Inf -> +448
    // group 1: amax 1 -> s = 2^ceil(log2(RN(1/448))) = 2^-8, code 119; 1 * 2^8 = 256 -> 0x78
    CHECK(s[1] == 119);
    CHECK(q[4] == 0x78);
    // sglang JIT ue8m0 with f16 source: amax 2^-10 -> s = 2^-18 (code 109): the multiplier 2^18 overflows f16 to Inf
    const QuantSpec jit = spec_for("sglang-jit", ScaleDtype::ue8m0, {{"granularity", "group:4"}, {"scale-layout", "row-major"}});
    const uint16_t h[4] = {0x1400 /* 2^-10 */, 0x0000, 0x9000 /* -2^-11 */, 0x0001 /* 2^-24 */};
    std::vector<uint8_t> qh(4), sh(1);
    ref::quantize(jit, Format::f16, h, {1, 4}, qh.data(), sh.data());
    CHECK(sh[0] == 109);
    CHECK(qh[0] == 0x7E);  // 2^-10 * Inf -> +448
    CHECK(qh[1] == 0x7F);  // 0 * Inf = NaN
    CHECK(qh[2] == 0xFE);
    CHECK(qh[3] == 0x7E);  // even the smallest subnormal
    // the same group in bf16: the multiplier is exact, 2^-10 * 2^18 = 256
    const uint16_t b[4] = {0x3A80 /* 2^-10 */, 0x0000, 0xBA00 /* -2^-11 */, 0x0000};
    ref::quantize(jit, Format::bf16, b, {1, 4}, qh.data(), sh.data());
    CHECK(sh[0] == 109);
    CHECK(qh[0] == 0x78);
    CHECK(qh[2] == 0xF0);  // -128
  }

  TEST_CASE("registry: golden cases with scale layouts, both backends bit-identical, metadata names the layout") {
    using namespace fp8ref::golden;
    for (const char* line :
         {"quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor seed=1",
          "quantize from=bf16 shape=2x30x512 convention=sgl-kernel scale-dtype=ue8m0 seed=2",
          "quantize from=f16 shape=30x384 convention=sglang-jit scale-dtype=ue8m0 fill=normal:amax=0.01 seed=3",
          "quantize from=bf16 shape=16x256 convention=sglang-triton scale-layout=col-major seed=4",
          "quantize from=f32 shape=16x256 convention=exact scale-dtype=bf16 scale-layout=tma-aligned seed=5",
          "quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor mode=static seed=6",
          "quantize from=bf16 shape=18x512 convention=sglang-jit scale-dtype=ue8m0 mode=static seed=7",
          "dequantize shape=18x512 scale-dtype=ue8m0 scale-layout=packed-ue8m0 seed=8",
          "dequantize to=bf16 shape=18x256 scale-layout=tma-aligned seed=9"}) {
      INFO(line);
      const Descriptor d = parse_descriptor(line);
      const io::SafetensorsFile g = make_golden(d);
      const nlohmann::json outs = nlohmann::json::parse(g.metadata.at("fp8ref.outputs"));
      if (outs.contains("output.scale") && d.get("scale-layout") != "row-major") {
        CHECK(outs["output.scale"].contains("layout"));
        CHECK(outs["output.scale"].contains("logical_shape"));
      }
      const Tensors want = tensors_with_prefix(g, "output.");
      for (const char* backend : {"reference", "cpu"}) {
        const Tensors got = tensors_with_prefix(run_case(g, backend, "golden"), "output.");
        REQUIRE(want.size() == got.size());
        for (size_t i = 0; i < want.size(); ++i) {
          CHECK(want[i].dtype == got[i].dtype);
          CHECK(want[i].shape == got[i].shape);
          CHECK(want[i].data == got[i].data);
        }
      }
    }
    // stored shapes: tma-aligned f32 [2, 32] for 30 rows x 2 groups; packed [2, 1, 32] int32 for 2x30 rows x 4 groups
    const io::SafetensorsFile a = make_golden(parse_descriptor("quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor"));
    CHECK(a.find("output.scale")->shape == std::vector<int64_t>{2, 32});
    const io::SafetensorsFile p =
        make_golden(parse_descriptor("quantize from=bf16 shape=2x30x512 convention=sgl-kernel scale-dtype=ue8m0"));
    CHECK(p.find("output.scale")->shape == std::vector<int64_t>{2, 1, 32});
    CHECK(p.find("output.scale")->dtype == io::DType::I32);
    // static scales of the wrong layout (the logical row-major shape) or dtype: a clear error naming input.scale
    io::SafetensorsFile st = make_golden(parse_descriptor("quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor mode=static"));
    for (auto& t : st.tensors)
      if (t.name == "input.scale") t.shape = {30, 2};
    CHECK_THROWS_WITH_AS(run_case(st, "cpu", "case.safetensors"), doctest::Contains("input.scale"), InputError);
    io::SafetensorsFile sp = make_golden(parse_descriptor("quantize from=bf16 shape=18x512 convention=sglang-jit scale-dtype=ue8m0 mode=static"));
    for (auto& t : sp.tensors)
      if (t.name == "input.scale") t.dtype = io::DType::U32;
    CHECK_THROWS_WITH_AS(run_case(sp, "reference", "case.safetensors"), doctest::Contains("I32"), InputError);
    CHECK_THROWS_WITH_AS(make_golden(parse_descriptor("quantize shape=64 convention=vllm-group granularity=group:64 scale-layout=col-major")),
                         doctest::Contains("rank >= 2"), InputError);
    CHECK_THROWS_WITH_AS(make_golden(parse_descriptor("quantize convention=vllm-group scale-layout=packed")),
                         doctest::Contains("unknown scale-layout"), InputError);
  }

  TEST_CASE("diff: laid-out scales are compared in logical coordinates; a row-major result for a col-major golden fails") {
    using namespace fp8ref::golden;
    for (const char* line : {"quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor seed=1",
                             "quantize from=bf16 shape=30x512 convention=sglang-jit scale-dtype=ue8m0 seed=2"}) {
      INFO(line);
      const io::SafetensorsFile g = make_golden(parse_descriptor(line));
      io::SafetensorsFile r = run_case(g, "cpu", "golden");
      CHECK(diff::diff_files(g, r, {}).verdict == diff::Verdict::pass);
      // one stored scale changed: stored [c][r] of row 5, group 1 -> the report names logical block [5, 1]
      for (io::Tensor& t : r.tensors) {
        if (t.name != "output.scale") continue;
        const int64_t Ra = t.shape.back();
        const size_t byte = t.dtype == io::DType::I32 ? static_cast<size_t>(5 * 4 + 1) : static_cast<size_t>((1 * Ra + 5) * 4);
        t.data[byte] ^= 1;
      }
      const diff::DiffReport rep = diff::diff_files(g, r, {});
      CHECK(rep.verdict == diff::Verdict::fail);
      REQUIRE(!rep.tensors.empty());
      const diff::TensorReport& sr = rep.tensors.front();
      CHECK(sr.name == "output.scale");
      CHECK(sr.scale.blocks_differing == 1);
      REQUIRE(!sr.scale.listed.empty());
      CHECK(sr.scale.listed[0].index == std::vector<int64_t>{5, 1});
    }
    // a result that writes the logical row-major tensor where the golden file is tma-aligned: reported, not passed
    const io::SafetensorsFile g = make_golden(parse_descriptor("quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor"));
    io::SafetensorsFile r = run_case(g, "reference", "golden");
    const io::SafetensorsFile row = make_golden(
        parse_descriptor("quantize from=bf16 shape=30x256 convention=sglang-triton-colmajor scale-layout=row-major"));
    for (io::Tensor& t : r.tensors)
      if (t.name == "output.scale") t = *row.find("output.scale");
    CHECK(diff::diff_files(g, r, {}).verdict == diff::Verdict::fail);
  }
}

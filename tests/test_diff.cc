// Tests for src/diff: the diff must catch and correctly classify injected faults on golden files of the convert op
// and on hand-made quantized tensors with scales.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/diff.h"
#include "fp8ref/error.h"
#include "fp8ref/golden.h"
#include "fp8ref/io.h"

using namespace fp8ref;
using diff::Mismatch;
using diff::TensorReport;
using diff::Verdict;

namespace {

io::SafetensorsFile golden_of(const std::string& desc) { return golden::make_golden(golden::parse_descriptor(desc)); }

// A result file: the output.* tensors of f only.
io::SafetensorsFile outputs_of(const io::SafetensorsFile& f) {
  io::SafetensorsFile r;
  for (const io::Tensor& t : f.tensors)
    if (t.name.rfind("output.", 0) == 0) r.tensors.push_back(t);
  r.metadata["fp8ref.backend"] = "test";
  return r;
}

io::Tensor& tensor(io::SafetensorsFile& f, const std::string& name) {
  for (io::Tensor& t : f.tensors)
    if (t.name == name) return t;
  FAIL("no tensor " << name);
  throw 0;
}

const TensorReport& report_of(const diff::DiffReport& r, const std::string& name) {
  for (const TensorReport& t : r.tensors)
    if (t.name == name) return t;
  FAIL("no report for " << name);
  throw 0;
}

uint64_t count(const TensorReport& t, Mismatch m) { return t.classes.counts[static_cast<int>(m)]; }
uint64_t mismatches(const TensorReport& t) { return t.metrics.numel - t.metrics.bitwise_equal; }
uint64_t classified(const TensorReport& t) {
  uint64_t n = 0;
  for (uint64_t c : t.classes.counts) n += c;
  return n;
}

const diff::Breakdown& breakdown(const TensorReport& t, const std::string& name) {
  for (const diff::Breakdown& b : t.structure.breakdowns)
    if (b.name == name) return b;
  FAIL("no breakdown " << name);
  throw 0;
}

diff::DiffReport run(const io::SafetensorsFile& e, const io::SafetensorsFile& a, diff::DiffOptions o = {}) {
  diff::DiffReport r = diff::diff_files(e, a, o);
  // every report renders, and the JSON is self-consistent enough to contain the verdict
  const std::string text = diff::render_text(r), json = diff::render_json(r);
  CHECK(text.find(std::string("verdict: ") + diff::to_string(r.verdict)) != std::string::npos);
  CHECK(json.find(std::string("\"verdict\": \"") + diff::to_string(r.verdict) + "\"") != std::string::npos);
  if (r.verdict == Verdict::fail && !r.descriptor.empty()) CHECK(text.find("repro: fp8ref golden --case") != std::string::npos);
  return r;
}

const char* kBase = "convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 fill=normal:amax=448 seed=1";

}  // namespace

TEST_SUITE("diff") {

TEST_CASE("tolerance grammar") {
  CHECK(diff::parse_tolerance("exact").kind == diff::Tolerance::Kind::exact);
  CHECK(diff::parse_tolerance("bound").kind == diff::Tolerance::Kind::bound);
  const diff::Tolerance u = diff::parse_tolerance("ulp:1,frac:0.003");
  CHECK(u.kind == diff::Tolerance::Kind::ulp);
  CHECK(u.ulp == 1);
  CHECK(u.frac == 0.003);
  CHECK(u.to_string() == "ulp:1,frac:0.003");
  CHECK(diff::parse_tolerance("ulp:2").frac == 1.0);
  const diff::Tolerance ar = diff::parse_tolerance("abs:0.5,rel:0.01");
  CHECK(ar.kind == diff::Tolerance::Kind::absrel);
  CHECK(ar.abs == 0.5);
  CHECK(ar.rel == 0.01);
  for (const char* bad : {"", "ulp", "ulp:-1", "ulp:1.5", "ulp:1,abs:2", "frac:0.1", "abs:x", "rel:-1", "ulp:1,frac:2",
                          "foo:1", "abs:1,abs:2", "ulp:1,"})
    CHECK_THROWS_AS(diff::parse_tolerance(bad), InputError);
}

TEST_CASE("identical files pass") {
  const auto g = golden_of(kBase);
  const auto r = run(g, outputs_of(g));
  REQUIRE(r.tensors.size() == 1);
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::pass);
  CHECK(r.exit_code() == 0);
  CHECK(t.presence == TensorReport::Presence::ok);
  CHECK(t.metrics.bitwise_equal == 64 * 128);
  CHECK(classified(t) == 0);
  CHECK(t.min_tolerance == "exact");
  CHECK(!t.specials.differ);
  CHECK(r.repro.find("fp8ref golden --case 'convert ") == 0);
}

TEST_CASE("special-value class counts match an independent count") {
  for (const char* to : {"e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"}) {
    for (const char* shape : {"33x100", "3x5", "64x4096"}) {
      const std::string conv = std::string(to).find("fnuz") != std::string::npos ? "torch-2.11" : "exact";
      const auto g = golden_of(std::string("convert from=f32 to=") + to + " shape=" + shape + " convention=" + conv +
                               " fill=near-max:format=" + to + "+special:rate=0.1 seed=3");
      auto a = outputs_of(g);
      const io::Tensor& y = tensor(a, "output.y");
      Format f;
      REQUIRE(parse_format(to, &f));
      uint64_t want[diff::kNumValueClasses] = {};
      const double mx = format_info(f).max_value;
      for (uint8_t c : y.data) {
        const double v = ref::value_of(f, c);
        const bool neg = (c & 0x80) != 0;
        diff::ValueClass k = diff::ValueClass::finite;
        if (std::isnan(v)) k = diff::ValueClass::nan;
        else if (std::isinf(v)) k = v > 0 ? diff::ValueClass::pos_inf : diff::ValueClass::neg_inf;
        else if (v == 0) k = neg ? diff::ValueClass::neg_zero : diff::ValueClass::pos_zero;
        else if (std::fabs(v) == mx) k = v > 0 ? diff::ValueClass::pos_max : diff::ValueClass::neg_max;
        want[static_cast<int>(k)]++;
      }
      // flip a few elements so that both the equal and the mismatch paths count
      tensor(a, "output.y").data[1] ^= 0x01;
      const TensorReport t = run(g, a).tensors[0];
      for (int k = 0; k < diff::kNumValueClasses; ++k) CHECK(t.specials.expected[k] == want[k]);
    }
  }
}

TEST_CASE("one flipped element: wrong, located") {
  const auto g = golden_of(kBase);
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  const uint8_t before = y.data[5 * 128 + 17];
  y.data[5 * 128 + 17] = static_cast<uint8_t>(before ^ 0x08);  // one exponent step
  REQUIRE(classify_code(Format::e4m3fn, y.data[5 * 128 + 17]) != CodeClass::nan);
  const auto r = run(g, a);
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  CHECK(r.exit_code() == 1);
  CHECK(mismatches(t) == 1);
  CHECK(count(t, Mismatch::wrong) == 1);
  CHECK(classified(t) == 1);
  CHECK(t.summary.find("bitwise 99.99% (1 of 8192 differ)") != std::string::npos);
  REQUIRE(t.metrics.worst.size() == 1);
  CHECK(t.metrics.worst[0].index == std::vector<int64_t>{5, 17});
  CHECK(t.metrics.worst[0].expected_bits == before);
  CHECK(t.metrics.worst[0].exact.has_value());
  CHECK(t.metrics.max_ulp == 8);
  CHECK(t.min_tolerance == "ulp:8,frac:0.00013");
  const diff::Breakdown& rows = breakdown(t, "row");
  CHECK(rows.units_with_mismatch == 1);
  CHECK(rows.top[0].first == 5);
  CHECK(breakdown(t, "group 1x128").top[0].first == 5);  // row 5, cols 0-127
  CHECK(breakdown(t, "dim col").ranges == std::vector<std::pair<int64_t, int64_t>>{{17, 17}});
  // within tolerance: the same file passes ulp:8 and fails ulp:7
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("ulp:8");
  CHECK(run(g, a, o).verdict == Verdict::pass);
  o.tol = diff::parse_tolerance("ulp:7");
  CHECK(run(g, a, o).verdict == Verdict::fail);
  o.tol = diff::parse_tolerance("ulp:8,frac:0.0001");  // 1/8192 > 0.0001
  CHECK(run(g, a, o).verdict == Verdict::fail);
}

TEST_CASE("NaN policy swapped: torch-2.11 keeps the NaN sign, cuda-nosat drops it") {
  const std::string fill = " fill=normal:amax=448+special:rate=0.05 seed=7";
  const auto e = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11" + fill);
  const auto a = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=cuda-nosat" + fill);
  // independent count: inputs that are NaN with the sign bit set
  uint64_t neg_nan = 0;
  for (const io::Tensor& t : e.tensors)
    if (t.name == "input.x")
      for (int64_t i = 0; i < t.numel(); ++i) {
        uint32_t b;
        std::memcpy(&b, &t.data[4 * i], 4);
        if ((b & 0x7F800000u) == 0x7F800000u && (b & 0x7FFFFFu) && (b >> 31)) ++neg_nan;
      }
  REQUIRE(neg_nan > 0);
  const auto r = run(e, outputs_of(a));
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  CHECK(mismatches(t) == neg_nan);
  CHECK(count(t, Mismatch::nan_policy) == neg_nan);
  CHECK(classified(t) == neg_nan);
  CHECK(!t.specials.differ);  // NaN stays NaN: only the code differs
  CHECK(t.metrics.incompatible == 0);
  CHECK(t.metrics.no_distance == neg_nan);
  // NaN vs NaN is distance 0 under a ULP tolerance
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("ulp:0");
  CHECK(run(e, outputs_of(a), o).verdict == Verdict::pass);
}

TEST_CASE("saturation swapped for NaN: torch-2.11 vs cuda-satfinite near max") {
  const std::string rest = " fill=near-max:format=e4m3fn seed=2";
  const auto e = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11" + rest);
  const auto a = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=cuda-satfinite" + rest);
  for (int dir = 0; dir < 2; ++dir) {
    const auto r = dir == 0 ? run(e, outputs_of(a)) : run(a, outputs_of(e));
    const TensorReport& t = r.tensors[0];
    CHECK(r.verdict == Verdict::fail);
    REQUIRE(mismatches(t) > 0);
    CHECK(count(t, Mismatch::overflow) == mismatches(t));
    CHECK(t.specials.differ);
    const int nan = static_cast<int>(diff::ValueClass::nan), pmax = static_cast<int>(diff::ValueClass::pos_max),
              nmax = static_cast<int>(diff::ValueClass::neg_max);
    const uint64_t moved = dir == 0 ? t.specials.confusion[nan][pmax] + t.specials.confusion[nan][nmax]
                                    : t.specials.confusion[pmax][nan] + t.specials.confusion[nmax][nan];
    CHECK(moved == mismatches(t));
    CHECK(t.min_tolerance.rfind("none", 0) == 0);  // no tolerance passes a class change
  }
}

TEST_CASE("double rounding: f64 via f32 (torch-2.11) vs direct (cuda-nosat) on ties") {
  const std::string rest = " fill=ties:format=e4m3fn seed=3";
  const auto direct = golden_of("convert from=f64 to=e4m3fn shape=64x128 convention=cuda-nosat" + rest);
  const auto via = golden_of("convert from=f64 to=e4m3fn shape=64x128 convention=torch-2.11" + rest);
  for (int dir = 0; dir < 2; ++dir) {
    const auto r = dir == 0 ? run(direct, outputs_of(via)) : run(via, outputs_of(direct));
    const TensorReport& t = r.tensors[0];
    CHECK(r.verdict == Verdict::fail);
    REQUIRE(mismatches(t) > 0);
    CHECK(count(t, Mismatch::double_rounding) == mismatches(t));
    CHECK(t.metrics.max_ulp == 1);
  }
}

TEST_CASE("-0 for +0: signed_zero, and within ulp:0") {
  const auto g = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 fill=normal:amax=0.01 seed=2");
  auto a = outputs_of(g);
  uint64_t flipped = 0;
  for (uint8_t& c : tensor(a, "output.y").data)
    if ((c & 0x7F) == 0) c ^= 0x80, ++flipped;
  REQUIRE(flipped > 20);
  const TensorReport t = run(g, a).tensors[0];
  CHECK(t.verdict == Verdict::fail);
  CHECK(t.summary.find("no ULP distance") != std::string::npos);
  CHECK(count(t, Mismatch::signed_zero) == flipped);
  CHECK(mismatches(t) == flipped);
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("ulp:0");
  const TensorReport u = run(g, a, o).tensors[0];
  CHECK(u.verdict == Verdict::pass);
  CHECK(count(u, Mismatch::wrong) == 0);
}

TEST_CASE("special inputs: NaN and Inf inputs flushed to 0 are nan_policy; e5m2 overflow as NaN for Inf is overflow") {
  {
    const auto g = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 "
                             "fill=normal:amax=100+special:rate=0.05 seed=3");
    const io::Tensor* x = g.find("input.x");
    REQUIRE(x);
    auto a = outputs_of(g);
    io::Tensor& y = tensor(a, "output.y");
    uint64_t flushed = 0;
    for (size_t i = 0; i < y.data.size(); ++i) {
      float v;
      std::memcpy(&v, &x->data[4 * i], 4);
      if (!std::isfinite(v) && y.data[i] != 0) y.data[i] = 0, ++flushed;  // the device turned NaN and Inf into 0
    }
    REQUIRE(flushed > 50);
    const TensorReport t = run(g, a).tensors[0];
    CHECK(mismatches(t) == flushed);
    CHECK(count(t, Mismatch::nan_policy) == flushed);
  }
  {  // e5m2, RNE without saturation: overflow gives +-Inf; a device that gives NaN instead
    const auto g = golden_of("convert from=f32 to=e5m2 shape=64x128 convention=exact fill=near-max:format=e5m2 seed=4");
    auto a = outputs_of(g);
    uint64_t changed = 0;
    for (uint8_t& c : tensor(a, "output.y").data)
      if ((c & 0x7F) == 0x7C) c = 0x7F, ++changed;
    REQUIRE(changed > 100);
    const TensorReport t = run(g, a).tensors[0];
    CHECK(mismatches(t) == changed);
    CHECK(count(t, Mismatch::overflow) == changed);
  }
}

TEST_CASE("a convert from f16 whose subnormals are flushed: subnormal_flush, never double_rounding") {
  const auto g = golden_of("convert from=f16 to=e4m3fn shape=64x256 convention=torch-2.11 fill=normal:amax=0.02 seed=5");
  auto a = outputs_of(g);
  uint64_t flushed = 0;
  for (uint8_t& c : tensor(a, "output.y").data)
    if ((c & 0x78) == 0 && (c & 0x07) != 0) c &= 0x80, ++flushed;
  REQUIRE(flushed > 1000);
  const TensorReport t = run(g, a).tensors[0];
  CHECK(mismatches(t) == flushed);
  CHECK(count(t, Mismatch::subnormal_flush) == flushed);
}

TEST_CASE("a tie rounded the other way: rne vs rna") {
  const std::string rest = " fill=ties:format=e4m3fn seed=3";
  const auto e = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=exact" + rest);
  const auto a = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=exact rounding=rna" + rest);
  const auto r = run(e, outputs_of(a));
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  REQUIRE(mismatches(t) > 0);
  CHECK(count(t, Mismatch::tie) == mismatches(t));
  CHECK(t.metrics.max_ulp == 1);
  // "equal up to what the contract allows": 1 ULP passes
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("ulp:1");
  CHECK(run(e, outputs_of(a), o).verdict == Verdict::pass);
  // without exact.* the codes alone cannot show a tie
  auto e2 = e;
  e2.tensors.erase(std::remove_if(e2.tensors.begin(), e2.tensors.end(), [](const io::Tensor& x) { return x.name == "exact.y"; }),
                   e2.tensors.end());
  const TensorReport t2 = run(e2, outputs_of(a)).tensors[0];
  CHECK(!t2.classes.exact_available);
  CHECK(count(t2, Mismatch::tie) == 0);
  CHECK(count(t2, Mismatch::wrong) == mismatches(t2));
}

TEST_CASE("a row shifted by one: wrong, localized to the row") {
  const auto g = golden_of(kBase);
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  for (int c = 127; c >= 1; --c) y.data[9 * 128 + c] = y.data[9 * 128 + c - 1];
  const auto r = run(g, a);
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  REQUIRE(mismatches(t) > 100);
  CHECK(count(t, Mismatch::wrong) == mismatches(t));
  const diff::Breakdown& rows = breakdown(t, "row");
  CHECK(rows.units_with_mismatch == 1);
  CHECK(rows.top[0] == std::pair<uint64_t, uint64_t>{9, mismatches(t)});
  CHECK(breakdown(t, "dim row").ranges == std::vector<std::pair<int64_t, int64_t>>{{9, 9}});
  // heatmap: 16 rows of cells, 4 rows each: only the cell row holding row 9 is marked
  REQUIRE(t.structure.heatmap.size() == 16);
  for (int h = 0; h < 16; ++h)
    CHECK((t.structure.heatmap[h].find_first_not_of('.') != std::string::npos) == (h == 2));
}

TEST_CASE("the K tail dropped: errors confined to the last columns") {
  const auto g = golden_of(kBase);
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  for (int r = 0; r < 64; ++r)
    for (int c = 96; c < 128; ++c) y.data[r * 128 + c] = 0;
  const TensorReport t = run(g, a).tensors[0];
  CHECK(t.verdict == Verdict::fail);
  const diff::Breakdown& col = breakdown(t, "dim col");
  REQUIRE(col.ranges.size() == 1);
  CHECK(col.ranges[0].first >= 96);
  CHECK(col.ranges[0].second == 127);
  CHECK(breakdown(t, "row").units_with_mismatch == 64);
}

TEST_CASE("a transposed output") {
  const auto g = golden_of(kBase);
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  const io::Tensor orig = y;
  y.shape = {128, 64};
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < 128; ++c) y.data[c * 64 + r] = orig.data[r * 128 + c];
  const auto r = run(g, a);
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  CHECK(t.presence == TensorReport::Presence::transposed);
  CHECK(t.presence_note.find("bit for bit") != std::string::npos);
  CHECK(!t.compared);
  // square: the shapes agree, the data is the transpose
  const auto sq = golden_of("convert from=f32 to=e4m3fn shape=128x128 convention=torch-2.11 fill=normal:amax=448 seed=4");
  auto sa = outputs_of(sq);
  io::Tensor& s = tensor(sa, "output.y");
  const io::Tensor so = s;
  for (int i = 0; i < 128; ++i)
    for (int j = 0; j < 128; ++j) s.data[j * 128 + i] = so.data[i * 128 + j];
  const TensorReport st = run(sq, sa).tensors[0];
  CHECK(st.verdict == Verdict::fail);
  REQUIRE(!st.structure.notes.empty());
  CHECK(st.structure.notes[0].find("transposed") != std::string::npos);
}

TEST_CASE("paged attention: mismatching token rows are broken down by sequence (query_start_loc)") {
  // q-lens 1, 1, 0, 5: tokens 0 | 1 | - | 2..6; tokens 3 and 4 wrong -> sequence 3 only
  const auto g = golden_of("paged_attention convention=vllm-triton-unified md=bf16 out=bf16 cache=e4m3fn block-size=16 "
                           "kv-heads=2 q-heads=8 head-dim=64 seq-lens=37,1,0,100 q-lens=1,1,0,5 table=dense seed=1");
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.out");  // [7, 8, 64] bf16
  for (size_t i = 3 * 8 * 64 * 2; i < 5 * 8 * 64 * 2; ++i) y.data[i] = 0;
  const TensorReport t = run(g, a).tensors[0];
  const diff::Breakdown& b = breakdown(t, "sequence (query_start_loc)");
  CHECK(b.units == 4);
  CHECK(b.units_with_mismatch == 1);
  REQUIRE(b.top.size() == 1);
  CHECK(b.top[0].first == 3);
  CHECK(b.top[0].second == mismatches(t));
}

TEST_CASE("EXPECTED and ACTUAL swapped (a result file as EXPECTED, the golden file as ACTUAL): exit 2, said so") {
  const auto g = golden_of(kBase);
  diff::DiffOptions o;
  o.expected_name = "result.safetensors";
  o.actual_name = "golden.safetensors";
  CHECK_THROWS_WITH_AS(diff::diff_files(outputs_of(g), g, o),
                       doctest::Contains("golden.safetensors is a golden file (a descriptor and input.* / exact.* tensors) "
                                         "and result.safetensors a result file: the two are given the wrong way round"),
                       InputError);
  CHECK(diff::diff_files(outputs_of(g), outputs_of(g), o).verdict == Verdict::pass);  // two result files: fine
}

TEST_CASE("presence: missing, extra, dtype") {
  const auto g = golden_of(kBase);
  io::SafetensorsFile none;
  none.tensors.push_back(io::make_tensor("output.z", io::DType::F32, {2}));
  const auto r = run(g, none);
  CHECK(r.verdict == Verdict::fail);
  REQUIRE(r.tensors.size() == 2);
  CHECK(report_of(r, "output.y").presence == TensorReport::Presence::missing);
  CHECK(report_of(r, "output.z").presence == TensorReport::Presence::extra);
  auto a = outputs_of(g);
  tensor(a, "output.y").dtype = io::DType::F8_E5M2;
  const auto r2 = run(g, a);
  CHECK(r2.tensors[0].presence == TensorReport::Presence::dtype_mismatch);
  CHECK(r2.verdict == Verdict::fail);
}

TEST_CASE("bad input: malformed metadata and auxiliary tensors") {
  auto g = golden_of(kBase);
  auto a = outputs_of(g);
  auto bad = g;
  bad.metadata["fp8ref.outputs"] = "{not json";
  CHECK_THROWS_AS(diff::diff_files(bad, a), InputError);
  bad = g;
  bad.metadata["fp8ref.outputs"] = R"({"output.y": {"role": "data", "format": "e5m2"}})";
  CHECK_THROWS_AS(diff::diff_files(bad, a), InputError);
  bad = g;
  tensor(bad, "exact.y").shape = {128, 64};
  CHECK_THROWS_AS(diff::diff_files(bad, a), InputError);
  io::SafetensorsFile empty;
  CHECK_THROWS_AS(diff::diff_files(empty, empty), InputError);
}

TEST_CASE("MISTRUSTED: an all-zero expected output") {
  const auto g = golden_of("convert from=f32 to=e4m3fn shape=64x128 convention=torch-2.11 fill=normal:amax=0.0004 seed=1");
  const auto r = run(g, outputs_of(g));
  CHECK(r.verdict == Verdict::mistrusted);
  CHECK(r.exit_code() == 0);
  CHECK(r.tensors[0].trust_note.find("zeros") != std::string::npos);
  CHECK(diff::render_json(r).find("\"mistrusted\": true") != std::string::npos);
  CHECK(diff::render_text(r).find("MISTRUSTED") != std::string::npos);
  // a mistrusted tensor that differs is a failure all the same
  auto a = outputs_of(g);
  tensor(a, "output.y").data[0] = 0x38;  // 1.0
  const auto r2 = run(g, a);
  CHECK(r2.tensors[0].mistrusted);
  CHECK(r2.verdict == Verdict::fail);
  CHECK(r2.exit_code() == 1);
}

TEST_CASE("a derived bound: accumulation class and --tol bound") {
  auto g = golden_of(kBase);
  auto a = outputs_of(g);
  tensor(a, "output.y").data[3] ^= 0x01;
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("bound");
  // no bound tensor: judged exact, and said so
  const TensorReport t0 = run(g, a, o).tensors[0];
  CHECK(t0.verdict == Verdict::fail);
  CHECK(!t0.tol_note.empty());
  io::Tensor b = io::make_tensor("bound.y", io::DType::F64, {64, 128});
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double v = 64.0;
    std::memcpy(&b.data[8 * i], &v, 8);
  }
  g.tensors.push_back(b);
  const auto r = run(g, a, o);
  CHECK(r.verdict == Verdict::pass);
  CHECK(count(r.tensors[0], Mismatch::accumulation) == 1);
}

TEST_CASE("a GEMM summed in another order (exact contract): accumulation, and within --tol bound") {
  // the golden output is hopper-tc's (bit-exact contract); the device's is the exact sum rounded once
  const auto g = golden_of("scaled_mm scaling=blockwise model=hopper-tc seed=51");
  const io::SafetensorsFile dev = golden::run_case(golden_of("scaled_mm scaling=blockwise model=exact seed=51"), "cpu", "exact");
  const auto r = run(g, outputs_of(dev));
  const TensorReport& t = r.tensors[0];
  CHECK(t.verdict == Verdict::fail);
  REQUIRE(mismatches(t) > 100);
  CHECK(count(t, Mismatch::accumulation) == mismatches(t));
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("bound");
  CHECK(run(g, outputs_of(dev), o).verdict == Verdict::pass);
  // a wrong value is still wrong
  auto bad = outputs_of(dev);
  tensor(bad, "output.out").data[2 * 77 + 1] ^= 0x40;
  CHECK(count(run(g, bad).tensors[0], Mismatch::wrong) == 1);
}

TEST_CASE("a data block off by one common factor (no scale tensor)") {
  const auto g = golden_of("convert from=f32 to=e4m3fn shape=64x256 convention=ocp-sat fill=normal:amax=200 seed=5");
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  std::string err;
  const ConversionSpec spec = *resolve_convention("ocp-sat", Format::f64, Format::e4m3fn, &err);
  // row 3, cols 128-255: every value halved; row 7, cols 0-127: every value times 0.75 (re-rounded)
  for (int c = 128; c < 256; ++c) y.data[3 * 256 + c] = ref::encode_f64(ref::value_of(Format::e4m3fn, y.data[3 * 256 + c]) / 2, spec);
  for (int c = 0; c < 128; ++c) y.data[7 * 256 + c] = ref::encode_f64(ref::value_of(Format::e4m3fn, y.data[7 * 256 + c]) * 0.75, spec);
  const auto r = run(g, a);
  const TensorReport& t = r.tensors[0];
  CHECK(r.verdict == Verdict::fail);
  CHECK(t.classes.scale_blocks == 2);
  CHECK(count(t, Mismatch::scale) + count(t, Mismatch::subnormal_flush) == mismatches(t));
  CHECK(count(t, Mismatch::wrong) == 0);
  REQUIRE(t.classes.scale_block_examples.size() == 2);
  CHECK(t.classes.scale_block_examples[0].find("row 3, cols 128-255") != std::string::npos);
  CHECK(t.classes.scale_block_examples[0].find("×0.5 (2^-1: exponent off by one)") != std::string::npos);
  CHECK(t.classes.scale_block_examples[1].find("row 7, cols 0-127") != std::string::npos);
  // a single flipped element is not a scale error
  auto a1 = outputs_of(g);
  tensor(a1, "output.y").data[5] ^= 0x01;
  CHECK(run(g, a1).tensors[0].classes.scale_blocks == 0);
}

// ---- hand-made quantized tensors: output.q [256,256] e4m3fn, output.s [256,2] f32, block [1,128] ----------------

namespace {

struct Quant {
  io::SafetensorsFile expected;
  std::vector<float> s;     // [256][2]
  std::vector<uint8_t> q;   // [256][256]
};

Quant make_quant() {
  Quant Q;
  golden::Rng rng(11, 0);
  Q.q.resize(256 * 256);
  for (auto& c : Q.q) {
    uint8_t code;
    do code = static_cast<uint8_t>(rng.next());
    while (classify_code(Format::e4m3fn, code) == CodeClass::nan || std::fabs(ref::value_of(Format::e4m3fn, code)) > 64);
    c = code;
  }
  Q.s.resize(512);
  for (int r = 0; r < 256; ++r)
    for (int g = 0; g < 2; ++g) Q.s[r * 2 + g] = 0.5f + static_cast<float>((r * 37 + g * 11) % 17) / 8.0f;
  io::Tensor qt = io::make_tensor("output.q", io::DType::F8_E4M3, {256, 256});
  std::memcpy(qt.data.data(), Q.q.data(), Q.q.size());
  io::Tensor st = io::make_tensor("output.s", io::DType::F32, {256, 2});
  std::memcpy(st.data.data(), Q.s.data(), 4 * Q.s.size());
  Q.expected.tensors = {qt, st};
  Q.expected.metadata["fp8ref.outputs"] =
      R"({"output.q": {"role": "data", "format": "e4m3fn", "contract": "exact", "dims": ["row", "col"]},)"
      R"( "output.s": {"role": "scale", "format": "f32", "of": "output.q", "block": [1, 128]}})";
  return Q;
}

// ACTUAL with scales s2, the data requantized to them: q2 = RNE(q * s / s2).
io::SafetensorsFile requantized(const Quant& Q, const std::vector<float>& s2) {
  std::string err;
  const ConversionSpec spec = *resolve_convention("ocp-sat", Format::f64, Format::e4m3fn, &err);
  io::SafetensorsFile a = Q.expected;
  io::Tensor& qt = tensor(a, "output.q");
  io::Tensor& st = tensor(a, "output.s");
  for (int r = 0; r < 256; ++r)
    for (int c = 0; c < 256; ++c) {
      const int b = r * 2 + c / 128;
      if (s2[b] == Q.s[b]) continue;
      const double x = ref::value_of(Format::e4m3fn, Q.q[r * 256 + c]) * Q.s[b];
      qt.data[r * 256 + c] = ref::encode_f64(x / s2[b], spec);
    }
  std::memcpy(st.data.data(), s2.data(), 4 * s2.size());
  a.metadata.clear();
  return a;
}

}  // namespace

TEST_CASE("scales: one block's scale doubled") {
  const Quant Q = make_quant();
  std::vector<float> s2 = Q.s;
  s2[77 * 2 + 1] *= 2;  // row 77, cols 128-255
  const auto r = run(Q.expected, requantized(Q, s2));
  CHECK(r.verdict == Verdict::fail);
  REQUIRE(r.tensors.size() == 2);
  CHECK(r.tensors[0].name == "output.s");  // scales first
  const TensorReport& s = report_of(r, "output.s");
  CHECK(s.scale.is_scale);
  CHECK(s.scale.blocks == 512);
  CHECK(s.scale.blocks_differing == 1);
  REQUIRE(s.scale.listed.size() == 1);
  CHECK(s.scale.listed[0].index == std::vector<int64_t>{77, 1});
  CHECK(s.scale.listed[0].covers == std::vector<std::pair<int64_t, int64_t>>{{77, 78}, {128, 256}});
  CHECK(s.scale.listed[0].factor == 2.0);
  CHECK(count(s, Mismatch::scale) == 1);
  CHECK(diff::render_text(r).find("×2 (2^1: exponent off by one)") != std::string::npos);
  const TensorReport& q = report_of(r, "output.q");
  CHECK(q.verdict == Verdict::fail);
  REQUIRE(mismatches(q) > 100);
  CHECK(count(q, Mismatch::scale) == mismatches(q));
  CHECK(q.scale.data_explained == mismatches(q));
  CHECK(q.scale.data_in_differing_blocks == 128);
  CHECK(breakdown(q, "row").units_with_mismatch == 1);
  // the scale doubled but the data left alone: the scale tensor fails, the data passes
  io::SafetensorsFile only_scale = Q.expected;
  std::memcpy(tensor(only_scale, "output.s").data.data(), s2.data(), 4 * s2.size());
  const auto r2 = run(Q.expected, only_scale);
  CHECK(r2.verdict == Verdict::fail);
  CHECK(report_of(r2, "output.s").verdict == Verdict::fail);
  CHECK(report_of(r2, "output.q").verdict == Verdict::pass);
}

TEST_CASE("scales: a block's scale 16x too small saturates its data: every mismatch there is scale") {
  const Quant Q = make_quant();
  std::vector<float> s2 = Q.s;
  s2[40 * 2] /= 16;  // row 40, cols 0-127: |q| up to 64 becomes up to 1024, saturated at 448 (ocp-sat)
  io::SafetensorsFile a = requantized(Q, s2);
  uint64_t saturated = 0;
  for (int c = 0; c < 128; ++c) saturated += (tensor(a, "output.q").data[40 * 256 + c] & 0x7F) == 0x7E;
  REQUIRE(saturated > 10);
  const auto r = run(Q.expected, a);
  const TensorReport& q = report_of(r, "output.q");
  CHECK(mismatches(q) > saturated);
  CHECK(count(q, Mismatch::scale) == mismatches(q));
}

TEST_CASE("scales: a KV cache's dynamic per-head scale doubled explains that head's codes (a flat [H] scale tensor)") {
  const auto g = golden_of("kv_cache_write convention=spyre model=bf16 cache=e4m3fn num-blocks=8 block-size=16 "
                           "kv-heads=2 head-dim=64 tokens=20 seqs=2 scale-kind=head mode=dynamic seed=1");
  auto a = outputs_of(g);
  io::Tensor& ks = tensor(a, "output.k_scale");
  float s1;
  std::memcpy(&s1, &ks.data[4], 4);
  s1 *= 2;
  std::memcpy(&ks.data[4], &s1, 4);
  std::string err;
  const ConversionSpec sat = *resolve_convention("ocp-sat", Format::f64, Format::e4m3fn, &err);
  io::Tensor& kc = tensor(a, "output.k_cache");  // [8, 16, 2, 64]: head 1's codes halved, as the device would write them
  uint64_t changed = 0;
  for (size_t i = 0; i < kc.data.size(); ++i) {
    if ((i / 64) % 2 != 1 || classify_code(Format::e4m3fn, kc.data[i]) == CodeClass::nan) continue;
    const uint8_t c = ref::encode_f64(ref::value_of(Format::e4m3fn, kc.data[i]) / 2, sat);
    changed += c != kc.data[i];
    kc.data[i] = c;
  }
  REQUIRE(changed > 100);
  const auto r = run(g, a);
  const TensorReport& s = report_of(r, "output.k_scale");
  CHECK(s.scale.is_scale);
  REQUIRE(s.scale.listed.size() == 1);
  CHECK(s.scale.listed[0].index == std::vector<int64_t>{0, 0, 1, 0});
  CHECK(s.scale.listed[0].covers == std::vector<std::pair<int64_t, int64_t>>{{0, 8}, {0, 16}, {1, 2}, {0, 64}});
  const TensorReport& c = report_of(r, "output.k_cache");
  CHECK(mismatches(c) == changed);
  CHECK(count(c, Mismatch::scale) == changed);
  CHECK(report_of(r, "output.v_cache").verdict == Verdict::pass);
}

TEST_CASE("scales: every 128x128 block after the first uses another block's scale") {
  const Quant Q = make_quant();
  std::vector<float> s2 = Q.s;
  uint64_t differing = 0;
  for (int r = 0; r < 256; ++r)
    for (int g = 0; g < 2; ++g) {
      if (r < 128 && g == 0) continue;
      s2[r * 2 + g] = Q.s[(r % 128) * 2];  // the scale of the same row of block (0, 0)
      if (s2[r * 2 + g] != Q.s[r * 2 + g]) ++differing;
    }
  REQUIRE(differing > 300);
  const auto r = run(Q.expected, requantized(Q, s2));
  CHECK(r.verdict == Verdict::fail);
  const TensorReport& s = report_of(r, "output.s");
  CHECK(s.scale.blocks_differing == differing);
  CHECK(s.scale.from_other_block == differing);
  CHECK(count(s, Mismatch::scale) == differing);
  const TensorReport& q = report_of(r, "output.q");
  REQUIRE(mismatches(q) > 10000);
  CHECK(count(q, Mismatch::scale) == mismatches(q));
  // the first 128x128 block is clean
  const diff::Breakdown& blocks = breakdown(q, "block 128x128");
  CHECK(blocks.units_with_mismatch == 3);
  for (const auto& [unit, n] : blocks.top) CHECK(unit != 0);
}

TEST_CASE("results do not depend on the thread count") {
  const auto g = golden_of("convert from=f32 to=e4m3fn shape=300x1000 convention=torch-2.11 fill=normal:amax=448+special:rate=0.01 seed=9");
  const auto a = golden_of("convert from=f32 to=e4m3fn shape=300x1000 convention=cuda-satfinite fill=normal:amax=448+special:rate=0.01 seed=9");
  auto af = outputs_of(a);
  io::Tensor& y = tensor(af, "output.y");
  for (size_t i = 0; i < y.data.size(); i += 97) y.data[i] ^= 0x03;
  diff::DiffOptions o1, o4;
  o1.threads = 1;
  o4.threads = 4;
  o1.top_k = o4.top_k = 25;
  const std::string j1 = diff::render_json(diff::diff_files(g, af, o1));
  const std::string j4 = diff::render_json(diff::diff_files(g, af, o4));
  CHECK(j1 == j4);
}

TEST_CASE("memory-mapped files give the same report as files read into memory") {
  const auto g = golden_of("convert from=f32 to=e4m3fn shape=300x1000 convention=torch-2.11 fill=normal:amax=448+special:rate=0.01 seed=9");
  auto af = outputs_of(g);
  io::Tensor& y = tensor(af, "output.y");
  for (size_t i = 0; i < y.data.size(); i += 89) y.data[i] ^= 0x05;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("fp8ref_diff_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string ep = (dir / "e.safetensors").string(), ap = (dir / "a.safetensors").string();
  io::write_safetensors(ep, g.tensors, g.metadata);
  io::write_safetensors(ap, af.tensors, af.metadata);
  for (int threads : {1, 3}) {
    diff::DiffOptions o;
    o.threads = threads;
    o.top_k = 25;
    const std::string read = diff::render_json(diff::diff_files(io::read_safetensors(ep), io::read_safetensors(ap), o));
    const io::MappedSafetensors em(ep), am(ap);
    const diff::DiffReport mapped = diff::diff_files(em, am, o);
    CHECK(mapped.verdict == Verdict::fail);
    CHECK(diff::render_json(mapped) == read);
    CHECK(diff::render_json(diff::diff_files(g, af, o)) == read);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("odd shapes and integer outputs") {
  auto one = [](const char* name, io::DType d, std::vector<int64_t> shape) {
    io::SafetensorsFile f;
    f.tensors.push_back(io::make_tensor(name, d, std::move(shape)));
    for (size_t i = 0; i < f.tensors[0].data.size(); ++i) f.tensors[0].data[i] = static_cast<uint8_t>(i * 7 + 1);
    return f;
  };
  for (const auto& ds : std::vector<std::pair<io::DType, std::vector<int64_t>>>{
           {io::DType::F8_E4M3, {}}, {io::DType::F8_E4M3, {1000}}, {io::DType::F8_E4M3, {0, 128}},
           {io::DType::BF16, {2, 3, 300}}, {io::DType::I32, {17, 5}}, {io::DType::U8, {3, 129}},
           {io::DType::F8_E8M0, {4, 2}}, {io::DType::F64, {9}}, {io::DType::F16, {1, 1, 1, 130}}}) {
    const io::DType d = ds.first;
    const std::vector<int64_t>& shape = ds.second;
    CAPTURE(io::dtype_name(d));
    CAPTURE(shape.size());
    const auto e = one("output.t", d, shape);
    CHECK(run(e, e).verdict == Verdict::pass);
    auto a = e;
    if (a.tensors[0].data.empty()) continue;
    a.tensors[0].data.back() ^= 0x01;
    const auto r = run(e, a);
    CHECK(r.verdict == Verdict::fail);
    CHECK(mismatches(r.tensors[0]) == 1);
    CHECK(classified(r.tensors[0]) == 1);
    REQUIRE(r.tensors[0].metrics.worst.size() == 1);
    CHECK(r.tensors[0].metrics.worst[0].flat == static_cast<uint64_t>(e.tensors[0].numel() - 1));
  }
}

TEST_CASE("wider outputs: ULP in the output's own format (decode to f32)") {
  const auto g = golden_of("convert from=e4m3fn to=f32 shape=16x256 convention=torch-2.11 fill=codes:format=e4m3fn seed=1");
  auto a = outputs_of(g);
  io::Tensor& y = tensor(a, "output.y");
  uint32_t b;
  std::memcpy(&b, &y.data[4 * 10], 4);
  REQUIRE((b & 0x7F800000u) != 0x7F800000u);
  b += 3;  // 3 f32 ULPs
  std::memcpy(&y.data[4 * 10], &b, 4);
  const TensorReport t = run(g, a).tensors[0];
  CHECK(mismatches(t) == 1);
  CHECK(t.metrics.max_ulp == 3);
  CHECK(t.format == "f32");
}

}  // TEST_SUITE

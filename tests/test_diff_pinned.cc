// Pinned diff reports of many-mismatch cases (issue 3, "Speed"): the diff's fast paths must not change a single
// number of what it reports. Each case below builds EXPECTED and ACTUAL by hand (a local splitmix64, no golden
// fills, so nothing else in the tree can move them), diffs them with 1 and 3 threads, and compares the whole JSON
// report (render_json: every section, every number) with the copy kept in tests/data/diff/pinned_<case>.json,
// written by the diff as it was before its speed work (commit a9bc5df plus the working tree of 2026-12-01).
//
// The pins are a regression oracle, not a correctness one: the correctness of each section is tested against
// independent counts in test_diff.cc. To re-pin after an intended change of the report, run
//   FP8REF_PIN_WRITE=1 ./build/tests/fp8ref_tests -tc='pinned diff report*'
// and review the change of the JSON files in the commit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "fp8ref/diff.h"
#include "fp8ref/io.h"

using namespace fp8ref;

namespace {

struct Mix {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
  uint64_t below(uint64_t n) { return next() % n; }
};

io::Tensor raw(const std::string& name, io::DType d, std::vector<int64_t> shape) { return io::make_tensor(name, d, std::move(shape)); }

template <typename T>
void put(io::Tensor& t, size_t i, T v) {
  std::memcpy(t.data.data() + i * sizeof(T), &v, sizeof(T));
}
template <typename T>
T get(const io::Tensor& t, size_t i) {
  T v;
  std::memcpy(&v, t.data.data() + i * sizeof(T), sizeof(T));
  return v;
}

io::Tensor& find(io::SafetensorsFile& f, const std::string& name) {
  for (io::Tensor& t : f.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

// ACTUAL: the output.* tensors of EXPECTED (which the caller then changes).
io::SafetensorsFile outputs(const io::SafetensorsFile& e) {
  io::SafetensorsFile a;
  for (const io::Tensor& t : e.tensors)
    if (t.name.rfind("output.", 0) == 0) a.tensors.push_back(t);
  a.metadata["fp8ref.backend"] = "pinned-test";
  return a;
}

bool is_nan_e4m3(uint8_t c) { return (c & 0x7F) == 0x7F; }

// pure: e4m3fn [640, 4160] (a partial last 1x128 group, a partial last 128-row band), every code (NaN, +-0, +-max
// included) in EXPECTED; ACTUAL: 0.3% random codes at random positions, 10 whole rows one code step off, one 1x128
// group doubled (a common factor), a run in the partial last group. The classes depend on the codes alone.
void make_pure(io::SafetensorsFile& e, io::SafetensorsFile& a) {
  const int64_t R = 640, C = 4160;
  Mix m{1};
  io::Tensor y = raw("output.y", io::DType::F8_E4M3, {R, C});
  for (auto& c : y.data) c = static_cast<uint8_t>(m.next());
  // row 5, cols 256-383: normal finite codes small enough to double
  for (int64_t c = 256; c < 384; ++c) {
    const uint64_t sign = m.next() & 0x80;  // one PRNG call per statement: the order is the same for every compiler
    y.data[5 * C + c] = static_cast<uint8_t>(sign | (0x08 + m.below(0x60)));
  }
  e.tensors = {y};
  e.metadata["fp8ref.descriptor"] = "convert from=f32 to=e4m3fn shape=640x4160 convention=torch-2.11 seed=1";
  a = outputs(e);
  io::Tensor& q = find(a, "output.y");
  for (size_t k = 0; k < q.data.size() * 3 / 1000; ++k) q.data[m.below(q.data.size())] = static_cast<uint8_t>(m.next());
  for (int64_t r = 300; r < 310; ++r)
    for (int64_t c = 0; c < C; ++c) q.data[r * C + c] ^= 0x01;
  for (int64_t c = 256; c < 384; ++c) q.data[5 * C + c] = static_cast<uint8_t>(y.data[5 * C + c] + 0x08);
  for (int64_t c = 4100; c < 4160; ++c) q.data[600 * C + c] = static_cast<uint8_t>(y.data[600 * C + c] ^ 0x80);
}

// exact: e4m3fn [256, 1152], contract bound, with exact.y and bound.y: ties, double roundings (via f32), subnormal
// flushes, overflow/NaN policies, accumulation within the bound, and wrong ones.
void make_exact(io::SafetensorsFile& e, io::SafetensorsFile& a) {
  const int64_t R = 256, C = 1152, N = R * C;
  Mix m{2};
  io::Tensor y = raw("output.y", io::DType::F8_E4M3, {R, C});
  io::Tensor x = raw("exact.y", io::DType::F64, {R, C});
  io::Tensor b = raw("bound.y", io::DType::F64, {R, C});
  std::string err;
  const ConversionSpec spec = *resolve_convention("cuda-nosat", Format::f64, Format::e4m3fn, &err);
  for (int64_t i = 0; i < N; ++i) {
    const int ex = static_cast<int>(m.below(18)) - 9;  // (argument evaluation order is unspecified: sequenced here)
    double v = std::ldexp(m.unit() * 2 - 1, ex);        // |v| < 512: some beyond max
    const uint64_t pick = m.below(1000);
    if (pick < 3) v = std::nan("");
    if (pick >= 3 && pick < 8) v = std::ldexp(static_cast<double>(1 + m.below(7)), -9);  // subnormals
    put(x, i, v);
    y.data[i] = ref::encode_f64(v, spec);
    put(b, i, std::ldexp(1.0, static_cast<int>(m.below(6)) - 6));
  }
  e.tensors = {y, x, b};
  e.metadata["fp8ref.outputs"] = R"({"output.y": {"role": "data", "format": "e4m3fn", "contract": "bound", "dims": ["m", "n"]}})";
  a = outputs(e);
  io::Tensor& q = find(a, "output.y");
  for (int64_t i = 0; i < N; ++i) {
    const uint64_t pick = m.below(100);
    if (pick >= 12) continue;
    const uint8_t c = y.data[i];
    if (is_nan_e4m3(c)) {
      q.data[i] = pick < 6 ? static_cast<uint8_t>(c ^ 0x80) : 0x7E;  // NaN sign / saturated
    } else if (pick < 4) {
      // a tie: the exact value becomes the midpoint of c and its neighbour, which ACTUAL returns
      const uint8_t d = (c & 0x7F) == 0x7E ? static_cast<uint8_t>(c - 1) : static_cast<uint8_t>(c + 1);
      put(x, i, (ref::value_of(Format::e4m3fn, c) + ref::value_of(Format::e4m3fn, d)) / 2);
      q.data[i] = d;
    } else if (pick < 6) {
      q.data[i] = ref::encode_f64(static_cast<double>(static_cast<float>(get<double>(x, i))), spec);
      if (q.data[i] == c) q.data[i] = static_cast<uint8_t>(c ^ 0x02);
    } else if (pick < 8) {
      q.data[i] = (c & 0x78) == 0 ? static_cast<uint8_t>(c & 0x80) : static_cast<uint8_t>(c ^ 0x01);
    } else if (pick < 10) {
      q.data[i] = (c & 0x7F) == 0x7E ? static_cast<uint8_t>(c | 0x7F) : static_cast<uint8_t>(c ^ 0x04);
    } else {
      q.data[i] = static_cast<uint8_t>(m.next());
    }
  }
  find(e, "exact.y") = x;
}

// scaled: e4m3fn data [384, 640] with an f32 scale [3, 5] per 128x128 block; block (1, 2)'s scale doubled and its
// data halved, block (2, 4)'s scale changed by 3 with its data left alone, block (0, 0)'s data doubled with the
// scale left alone, and 0.5% random codes elsewhere.
void make_scaled(io::SafetensorsFile& e, io::SafetensorsFile& a) {
  const int64_t R = 384, C = 640;
  Mix m{3};
  io::Tensor q = raw("output.q", io::DType::F8_E4M3, {R, C});
  for (auto& c : q.data) {
    const uint64_t sign = m.next() & 0x80;
    c = static_cast<uint8_t>(sign | (0x10 + m.below(0x60)));
  }
  io::Tensor s = raw("output.s", io::DType::F32, {3, 5});
  for (int i = 0; i < 15; ++i) put(s, i, static_cast<float>(0.25 + m.below(64) / 16.0));
  e.tensors = {q, s};
  e.metadata["fp8ref.outputs"] =
      R"({"output.q": {"role": "data", "format": "e4m3fn", "contract": "exact", "dims": ["token", "hidden"]},)"
      R"( "output.s": {"role": "scale", "format": "f32", "of": "output.q", "block": [128, 128]}})";
  a = outputs(e);
  io::Tensor& aq = find(a, "output.q");
  io::Tensor& as = find(a, "output.s");
  put(as, 7, get<float>(s, 7) * 2);
  put(as, 14, get<float>(s, 14) * 3);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      uint8_t& v = aq.data[r * C + c];
      if (r / 128 == 1 && c / 128 == 2) v = static_cast<uint8_t>(v - 0x08);
      else if (r / 128 == 0 && c / 128 == 0) v = static_cast<uint8_t>(v + 0x08);
      else if (m.below(200) == 0) v = static_cast<uint8_t>(m.next());
    }
}

// wide: bf16 [200, 1000] and f32 [3, 7, 50] (rank 3, named dims), with random changes of 1-3 ULP, a few special
// values and one doubled 1x128 group.
void make_wide(io::SafetensorsFile& e, io::SafetensorsFile& a) {
  Mix m{4};
  io::Tensor h = raw("output.h", io::DType::BF16, {200, 1000});
  for (int64_t i = 0; i < 200 * 1000; ++i) {
    const int ex = static_cast<int>(m.below(20)) - 10;
    const float f = static_cast<float>(std::ldexp(m.unit() * 2 - 1, ex));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    put(h, i, static_cast<uint16_t>(u >> 16));
  }
  io::Tensor f = raw("output.f", io::DType::F32, {3, 7, 50});
  for (int64_t i = 0; i < 3 * 7 * 50; ++i) put(f, i, static_cast<float>(m.unit() * 100 - 50));
  e.tensors = {h, f};
  e.metadata["fp8ref.outputs"] = R"({"output.f": {"role": "data", "format": "f32", "dims": ["batch", "head", "d"]}})";
  a = outputs(e);
  io::Tensor& ah = find(a, "output.h");
  for (int64_t i = 0; i < 200 * 1000; ++i) {
    const uint64_t pick = m.below(1000);
    if (pick < 20) put(ah, i, static_cast<uint16_t>(get<uint16_t>(h, i) + 1 + m.below(3)));
    else if (pick == 20) put(ah, i, static_cast<uint16_t>(0x7FC0));
    else if (pick == 21) put(ah, i, static_cast<uint16_t>(0x8000));
  }
  // row 7, cols 128-255: every value doubled (a common factor, found by the post-pass on a two-byte format)
  for (int64_t c = 128; c < 256; ++c) put(ah, 7 * 1000 + c, static_cast<uint16_t>(get<uint16_t>(h, 7 * 1000 + c) + 0x0080));
  io::Tensor& af = find(a, "output.f");
  for (int64_t i = 0; i < 3 * 7 * 50; i += 7) put(af, i, std::nextafter(get<float>(f, i), 100.0f));
}

// mixed: the other one-byte formats and shapes, in one file: e5m2 (IEEE Inf/NaN) [300, 1000], u8 [64, 300],
// i8 [1000], ue8m0 [40, 200] (no post-pass), e4m3fnuz [3, 50, 260] (rank 3, named dims), e4m3fn [5, 70000] (rows
// longer than the pass's 65536-column segments; a doubled group in the second segment), e5m2fnuz scalar.
void make_mixed(io::SafetensorsFile& e, io::SafetensorsFile& a) {
  Mix m{5};
  struct Spec {
    const char* name;
    io::DType d;
    std::vector<int64_t> shape;
  };
  const std::vector<Spec> specs = {{"output.a", io::DType::F8_E5M2, {300, 1000}},      {"output.b", io::DType::U8, {64, 300}},
                                   {"output.c", io::DType::I8, {1000}},                {"output.d", io::DType::F8_E8M0, {40, 200}},
                                   {"output.e", io::DType::F8_E4M3FNUZ, {3, 50, 260}}, {"output.f", io::DType::F8_E4M3, {5, 70000}},
                                   {"output.g", io::DType::F8_E5M2FNUZ, {}}};
  for (const Spec& sp : specs) {
    io::Tensor t = raw(sp.name, sp.d, sp.shape);
    for (auto& c : t.data) c = static_cast<uint8_t>(m.next());
    e.tensors.push_back(t);
  }
  io::Tensor& f = e.tensors[5];
  for (int64_t c = 65536 + 256; c < 65536 + 384; ++c) {
    const uint64_t sign = m.next() & 0x80;
    f.data[3 * 70000 + c] = static_cast<uint8_t>(sign | (0x08 + m.below(0x60)));
  }
  e.metadata["fp8ref.outputs"] =
      R"({"output.e": {"role": "data", "format": "e4m3fnuz", "dims": ["layer", "token", "hidden"]}})";
  a = outputs(e);
  for (io::Tensor& t : a.tensors) {
    if (t.name == "output.g") {
      t.data[0] ^= 0x01;
      continue;
    }
    for (size_t i = 0; i < t.data.size(); ++i)
      if (m.below(50) == 0) t.data[i] = m.below(2) ? static_cast<uint8_t>(t.data[i] ^ 0x01) : static_cast<uint8_t>(m.next());
  }
  io::Tensor& af = find(a, "output.f");
  for (int64_t c = 65536 + 256; c < 65536 + 384; ++c) af.data[3 * 70000 + c] = static_cast<uint8_t>(f.data[3 * 70000 + c] + 0x08);
  for (int64_t c = 60000; c < 70000; ++c) af.data[1 * 70000 + c] = static_cast<uint8_t>(f.data[1 * 70000 + c] ^ 0x80);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void check_pinned(const std::string& name, const io::SafetensorsFile& e, const io::SafetensorsFile& a, diff::DiffOptions o) {
  CAPTURE(name);
  o.top_k = 25;
  o.threads = 1;
  const std::string one = diff::render_json(diff::diff_files(e, a, o));
  o.threads = 3;
  const std::string three = diff::render_json(diff::diff_files(e, a, o));
  CHECK(one == three);
  const std::string path = std::string(FP8REF_TEST_DATA) + "/diff/pinned_" + name + ".json";
  const char* w = std::getenv("FP8REF_PIN_WRITE");
  if (w && *w == '1') {
    std::ofstream(path, std::ios::binary) << one;
    MESSAGE("wrote " << path);
    return;
  }
  const std::string pinned = read_file(path);
  REQUIRE_MESSAGE(!pinned.empty(), "missing " << path);
  if (one != pinned) {
    const std::string got = path + ".got";
    std::ofstream(got, std::ios::binary) << one;
    FAIL_CHECK("the report differs from " << path << " (this run's report: " << got << ")");
  }
}

}  // namespace

TEST_SUITE("diff") {

TEST_CASE("pinned diff report: e4m3 with many mismatches, classes from the codes alone") {
  io::SafetensorsFile e, a;
  make_pure(e, a);
  check_pinned("pure", e, a, {});
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("abs:0.5,rel:0.25");
  o.heatmap_rows = 7;
  o.heatmap_cols = 33;
  check_pinned("pure_absrel", e, a, o);
  o = {};
  o.tol = diff::parse_tolerance("ulp:2,frac:0.01");
  check_pinned("pure_ulp", e, a, o);
}

TEST_CASE("pinned diff report: e4m3 with exact values and a derived bound") {
  io::SafetensorsFile e, a;
  make_exact(e, a);
  check_pinned("exact", e, a, {});
}

TEST_CASE("pinned diff report: e4m3 with 128x128 block scales") {
  io::SafetensorsFile e, a;
  make_scaled(e, a);
  check_pinned("scaled", e, a, {});
}

TEST_CASE("pinned diff report: other one-byte formats, rank 1 and 3, scalars, rows longer than a segment") {
  io::SafetensorsFile e, a;
  make_mixed(e, a);
  check_pinned("mixed", e, a, {});
  diff::DiffOptions o;
  o.tol = diff::parse_tolerance("ulp:1");
  o.heatmap_rows = 3;
  o.heatmap_cols = 100;
  check_pinned("mixed_ulp", e, a, o);
}

TEST_CASE("pinned diff report: bf16 and rank-3 f32 outputs") {
  io::SafetensorsFile e, a;
  make_wide(e, a);
  check_pinned("wide", e, a, {});
}

}  // TEST_SUITE

// Conventions against the hardware: every table captured on an NVIDIA H200 (tools/device/capture_convert.py,
// data in tests/data/h200/) must be reproduced bit for bit —
//   f32 sources: all 2^32 inputs (the reference's run table equals the captured run table; the CPU fast path is
//                tied to the same run table over all 2^32 inputs by tests/exhaustive_convert.cc);
//   f16/bf16:    all 2^16 inputs, reference and CPU backend element by element;
//   f64:         the targeted vectors (midpoints ± ulps, double-rounding witnesses, specials), both backends;
//   decode:      all 256 codes per format, both backends.
#include <doctest/doctest.h>

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "fp8ref/convert.h"
#include "support/rle.h"

using namespace fp8ref;

namespace {

const std::string kDir = std::string(FP8REF_TEST_DATA) + "/h200";

struct Producer {
  const char* name;
  const char* convention;
  const char* rounding;  // override, or nullptr
};

// How each captured producer maps onto a named convention.
const Producer kProducers[] = {
    {"torch_cuda", "torch-2.11-cuda", nullptr}, {"torch_cpu", "torch-2.11", nullptr},
    {"cuda_sat", "cuda-satfinite", nullptr},    {"cuda_nosat", "cuda-nosat", nullptr},
    {"cuda_rz_sat", "cuda-satfinite", "rz"},    {"cuda_ru_sat", "cuda-satfinite", "ru"},
    {"cuda_rz_nosat", "cuda-nosat", "rz"},      {"cuda_ru_nosat", "cuda-nosat", "ru"},
};

ConversionSpec spec_for(const Producer& p, Format from, Format to) {
  std::string err;
  auto s = resolve_convention(p.convention, from, to, &err);
  REQUIRE_MESSAGE(s.has_value(), err);
  if (p.rounding) REQUIRE_MESSAGE(apply_override(p.convention, "rounding", p.rounding, &*s, &err), err);
  return *s;
}

std::vector<std::string> rle_files() {
  std::vector<std::string> out;
  DIR* d = opendir(kDir.c_str());
  REQUIRE_MESSAGE(d != nullptr, "missing capture directory ", kDir);
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind("rle_", 0) == 0 && n.size() > 4 && n.substr(n.size() - 4) == ".txt") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// rle_<producer>_<src>_<dst>.txt -> producer, src, dst
bool parse_name(const std::string& file, const Producer** prod, Format* from, Format* to) {
  const std::string stem = file.substr(4, file.size() - 8);
  const size_t last = stem.rfind('_');
  const size_t mid = stem.rfind('_', last - 1);
  const std::string p = stem.substr(0, mid), src = stem.substr(mid + 1, last - mid - 1), dst = stem.substr(last + 1);
  *prod = nullptr;
  for (const Producer& q : kProducers)
    if (p == q.name) *prod = &q;
  return *prod && parse_format(src, from) && parse_format(dst, to);
}

std::vector<std::vector<std::string>> read_table(const std::string& path, std::vector<std::string>* columns) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream ls(line.front() == '#' ? line.substr(1) : line);
    std::vector<std::string> cells;
    for (std::string c; ls >> c;) cells.push_back(c);
    if (line.front() == '#') {
      if (!cells.empty() && (cells[0] == "code" || cells[0] == "f64_bits")) *columns = cells;
      continue;
    }
    rows.push_back(cells);
  }
  return rows;
}

}  // namespace

TEST_SUITE("h200") {
  TEST_CASE("every captured run table (f32: all 2^32 inputs; f16/bf16: all 2^16) is reproduced") {
    const auto files = rle_files();
    CHECK(files.size() >= 40);
    for (const std::string& file : files) {
      const Producer* prod;
      Format from, to;
      REQUIRE_MESSAGE(parse_name(file, &prod, &from, &to), "unrecognised capture file name ", file);
      const ConversionSpec spec = spec_for(*prod, from, to);
      const auto captured = test::read_runs(kDir + "/" + file);
      INFO(file, " as convention ", prod->convention, ": ", spec.describe());
      if (from == Format::f32) {
        const auto ours = test::runs_of([&](uint64_t x) { return ref::encode(Format::f32, x, spec, x); }, 32);
        uint64_t count = 0;
        const int64_t first = test::first_difference(ours, captured, 32, &count);
        INFO("first differing f32 input ", test::hex(first < 0 ? 0 : first), " (", count, " inputs differ): ours ",
             test::hex(first < 0 ? 0 : test::code_at(ours, first), 2), " H200 ",
             test::hex(first < 0 ? 0 : test::code_at(captured, first), 2));
        CHECK(first == -1);
      } else {
        std::vector<uint16_t> all(65536);
        for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
        std::vector<uint8_t> want(65536), fast(65536);
        test::expand(captured, 0, 65536, want.data());
        cpu::encode_bits16(from, all.data(), fast.data(), 65536, spec);
        int bad_ref = 0, bad_cpu = 0, first = -1;
        for (uint32_t i = 0; i < 65536; ++i) {
          const bool r = ref::encode(from, i, spec, i) != want[i];
          bad_ref += r;
          bad_cpu += fast[i] != want[i];
          if ((r || fast[i] != want[i]) && first < 0) first = static_cast<int>(i);
        }
        INFO("first differing input ", test::hex(first < 0 ? 0 : first, 4));
        CHECK(bad_ref == 0);
        CHECK(bad_cpu == 0);
      }
    }
  }

  TEST_CASE("f64 vectors: torch (via f32) and __nv_cvt_double_to_fp8 / _to_e8m0 (one rounding)") {
    std::vector<std::string> cols;
    const auto rows = read_table(kDir + "/f64_vectors.txt", &cols);
    REQUIRE(cols.size() >= 2);
    CHECK(rows.size() > 10000);
    for (size_t c = 1; c < cols.size(); ++c) {
      // column: <producer>_<dst>
      const std::string col = cols[c];
      const size_t us = col.rfind('_');
      const Producer* prod = nullptr;
      for (const Producer& q : kProducers)
        if (col.substr(0, us) == q.name) prod = &q;
      Format to = Format::e4m3fn;
      REQUIRE_MESSAGE((prod && parse_format(col.substr(us + 1), &to)), "unknown column ", col);
      const ConversionSpec spec = spec_for(*prod, Format::f64, to);
      std::vector<double> xs(rows.size());
      std::vector<uint8_t> want(rows.size()), fast(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint64_t b = std::stoull(rows[i][0], nullptr, 16);
        std::memcpy(&xs[i], &b, 8);
        want[i] = static_cast<uint8_t>(std::stoul(rows[i][c], nullptr, 16));
      }
      cpu::encode_f64(xs.data(), fast.data(), xs.size(), spec);
      int bad = 0;
      std::string first;
      for (size_t i = 0; i < rows.size(); ++i) {
        const uint8_t r = ref::encode_f64(xs[i], spec, i);
        if (r != want[i] || fast[i] != want[i]) {
          if (bad++ == 0) first = rows[i][0] + " H200 " + rows[i][c] + " ours " + test::hex(r, 2);
        }
      }
      INFO(col, " as ", prod->convention, ": ", spec.describe(), "; first: ", first);
      CHECK(bad == 0);
    }
  }

  TEST_CASE("decode: all 256 codes, NaN bit patterns included") {
    std::vector<std::string> cols;
    const auto rows = read_table(kDir + "/decode.txt", &cols);
    REQUIRE(rows.size() == 256);
    for (size_t c = 1; c < cols.size(); ++c) {
      const std::string col = cols[c];
      const size_t us = col.rfind('_');
      const std::string prod = col.substr(0, us);
      const char* convention = prod == "torch_cuda" ? "torch-2.11-cuda" : prod == "torch_cpu" ? "torch-2.11" : "cuda-nosat";
      Format f;
      REQUIRE(parse_format(col.substr(us + 1), &f));
      std::string err;
      const auto d = resolve_decode(convention, f, &err);
      REQUIRE_MESSAGE(d.has_value(), err);
      std::vector<uint8_t> codes(256);
      for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
      std::vector<float> fast(256);
      cpu::decode_f32(f, codes.data(), fast.data(), 256, *d);
      int bad = 0;
      for (int i = 0; i < 256; ++i) {
        const uint32_t want = static_cast<uint32_t>(std::stoul(rows[i][c], nullptr, 16));
        uint32_t got;
        std::memcpy(&got, &fast[i], 4);
        const uint32_t r = ref::decode_f32_bits(f, static_cast<uint8_t>(i), *d);
        if (r != want || got != want) {
          ++bad;
          MESSAGE(col, " code ", rows[i][0], " H200 ", rows[i][c], " ours ", test::hex(r));
        }
      }
      INFO(col, " as ", convention);
      CHECK(bad == 0);
    }
  }
}

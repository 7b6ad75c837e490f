// Run-length tables of a conversion over every bit pattern of a source type (2^32 for f32, 2^16 for f16/bf16).
//
// A conversion is piecewise constant in the source bit pattern: for each sign the code is monotone in the
// pattern (NaN payload modes alternate in blocks of 2^21). A table lists the first pattern of each run and its
// code; the last run extends to 2^bits - 1. The same format holds the captures from the H200
// (tests/data/h200/rle_*.txt, written by tools/device/capture_convert.py).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fp8ref::test {

inline std::string hex(uint64_t x, int digits = 8) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llx", digits, static_cast<unsigned long long>(x));
  return buf;
}

struct Run {
  uint64_t start;
  uint8_t code;
  bool operator==(const Run& o) const { return start == o.start && code == o.code; }
};

// Builds the run table of f over [0, 2^bits) by sampling every 2^12 patterns and bisecting every interval whose
// ends differ. Sound as long as no run shorter than 2^12 patterns lies strictly inside an interval whose two ends
// have the same code — true for every FP8 conversion (the shortest runs are one fp8 quantum, >= 2^19 f32
// patterns, and the single-pattern runs at 0, ±Inf and the NaN boundary sit on or next to grid points).
inline std::vector<Run> runs_of(const std::function<uint8_t(uint64_t)>& f, int bits) {
  const uint64_t total = uint64_t{1} << bits;
  const uint64_t step = bits > 16 ? (uint64_t{1} << 12) : 1;
  std::vector<Run> runs;
  uint8_t cur = f(0);
  runs.push_back({0, cur});
  // find every change in (lo, hi] given f(lo) = a, f(hi) = b
  std::function<void(uint64_t, uint8_t, uint64_t, uint8_t)> bisect = [&](uint64_t lo, uint8_t a, uint64_t hi, uint8_t b) {
    if (a == b) return;
    if (hi == lo + 1) {
      runs.push_back({hi, b});
      return;
    }
    const uint64_t mid = lo + (hi - lo) / 2;
    const uint8_t m = f(mid);
    bisect(lo, a, mid, m);
    bisect(mid, m, hi, b);
  };
  for (uint64_t lo = 0; lo < total - 1;) {
    const uint64_t hi = lo + step < total ? lo + step : total - 1;
    const uint8_t b = f(hi);
    bisect(lo, cur, hi, b);
    cur = b;
    lo = hi;
  }
  return runs;
}

inline std::vector<Run> read_runs(const std::string& path, std::string* header = nullptr) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::vector<Run> runs;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (header) *header += line + "\n";
      continue;
    }
    std::istringstream ls(line);
    std::string a, b;
    ls >> a >> b;
    runs.push_back({std::stoull(a, nullptr, 16), static_cast<uint8_t>(std::stoul(b, nullptr, 16))});
  }
  return runs;
}

// Code of pattern x under a run table (binary search).
inline uint8_t code_at(const std::vector<Run>& runs, uint64_t x) {
  size_t lo = 0, hi = runs.size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (runs[mid].start <= x) lo = mid;
    else hi = mid;
  }
  return runs[lo].code;
}

// Writes the codes of patterns [begin, begin + n) into out.
inline void expand(const std::vector<Run>& runs, uint64_t begin, uint64_t n, uint8_t* out) {
  size_t lo = 0, hi = runs.size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    if (runs[mid].start <= begin) lo = mid;
    else hi = mid;
  }
  uint64_t x = begin;
  const uint64_t end = begin + n;
  for (size_t r = lo; x < end; ++r) {
    const uint64_t run_end = r + 1 < runs.size() ? runs[r + 1].start : ~uint64_t{0};
    const uint64_t stop = run_end < end ? run_end : end;
    std::memset(out + (x - begin), runs[r].code, stop - x);
    x = stop;
  }
}

// First pattern where two run tables differ, or -1 if they agree everywhere. Also counts differing patterns.
inline int64_t first_difference(const std::vector<Run>& a, const std::vector<Run>& b, int bits,
                                uint64_t* count = nullptr) {
  const uint64_t total = uint64_t{1} << bits;
  size_t i = 0, j = 0;
  uint64_t x = 0, n = 0;
  int64_t first = -1;
  while (x < total) {
    while (i + 1 < a.size() && a[i + 1].start <= x) ++i;
    while (j + 1 < b.size() && b[j + 1].start <= x) ++j;
    const uint64_t na = i + 1 < a.size() ? a[i + 1].start : total;
    const uint64_t nb = j + 1 < b.size() ? b[j + 1].start : total;
    const uint64_t next = na < nb ? na : nb;
    if (a[i].code != b[j].code) {
      if (first < 0) first = static_cast<int64_t>(x);
      n += next - x;
    }
    x = next;
  }
  if (count) *count = n;
  return first;
}

}  // namespace fp8ref::test

// fp8ref — diff internals shared by src/diff/*.cc (not installed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp8ref/diff.h"

namespace fp8ref::diff::detail {

// "×2 (ue8m0 off by one)" for a ue8m0 scale, "×2 (2^1: exponent off by one)" otherwise, "×1.5" ...
std::string factor_string(double f, bool ue8m0);
// %.17g-free number formatting: the shortest of %.6g/%.9g/%.17g that reads back the same double.
std::string num(double v);
// The smallest number >= v with at most 2 significant digits (for "would have passed" thresholds).
std::string round_up_2(double v);
std::string shape_string(const std::vector<int64_t>& shape);  // "[64,128]"
std::string index_string(const std::vector<int64_t>& index);  // "[5,17]"
std::string hex_bits(uint64_t bits, size_t bytes);            // "0x7e", "0x3f800000"

// ---- the one-byte scan kernel (src/diff/scan.cc, Highway dynamic dispatch) ----------------------------------
struct Scan8Params {
  uint8_t freq[4] = {};      // codes counted by compare (unused slots: any code, the caller ignores their counts)
  bool rare_by_mag = false;  // also list the positions whose magnitude (code & 0x7F) is above max_mag
  uint8_t max_mag = 0;
};
struct Scan8Result {
  uint64_t freq[4] = {};  // EXPECTED's bytes equal to freq[k]
  size_t n_rare = 0, n_diff = 0;
};
constexpr size_t kScan8Block = 8192;  // the most bytes per call (positions fit in uint16_t)
// Scans p[0..n) (EXPECTED) and q[0..n) (ACTUAL), n <= kScan8Block: counts into res->freq, writes the ascending
// positions of p's rare codes to rare_pos and of p[i] != q[i] to diff_pos (room for n entries each).
void scan8(const Scan8Params& prm, const uint8_t* p, const uint8_t* q, size_t n, uint16_t* rare_pos, uint16_t* diff_pos,
           Scan8Result* res);

}  // namespace fp8ref::diff::detail

// fp8ref — diff internals shared by src/diff/*.cc (not installed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp8ref/diff.h"

namespace fp8ref::diff::detail {

// "x2 (ue8m0 off by one)", "x0.25 (ue8m0 off by 2)", "x1.37" (with the multiplication sign).
std::string factor_string(double f);
// %.17g-free number formatting: the shortest of %.6g/%.9g/%.17g that reads back the same double.
std::string num(double v);
// The smallest number >= v with at most 2 significant digits (for "would have passed" thresholds).
std::string round_up_2(double v);
std::string shape_string(const std::vector<int64_t>& shape);  // "[64,128]"
std::string index_string(const std::vector<int64_t>& index);  // "[5,17]"
std::string hex_bits(uint64_t bits, size_t bytes);            // "0x7e", "0x3f800000"

}  // namespace fp8ref::diff::detail

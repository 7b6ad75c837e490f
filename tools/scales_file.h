// fp8ref command line — the SCALES file of quantize and rmsnorm-quant: the scale storage as float32 values (or E8M0
// codes), in the spec's scale layout.
#pragma once

#include <cstdint>
#include <vector>

#include "fp8ref/io.h"
#include "fp8ref/quant.h"

namespace fp8ref::cli {

// float32 values (exact widening; ue8m0 codes as 2^(c-127), 0xFF as NaN), or uint8 codes (codes: ue8m0 only), of the
// logical scale storage `storage` (scale_storage(spec) elements of shape `shape`).
io::Tensor scales_file(const QuantSpec& spec, bool codes, const std::vector<uint8_t>& storage,
                       const std::vector<int64_t>& shape);
// The same in spec.scale_layout: packed-ue8m0 -> int32 words; other layouts transform the values/codes file (padded as
// the real storage dtype is).
io::Tensor stored_scales_file(const QuantSpec& spec, bool codes, const std::vector<uint8_t>& storage, const QuantLayout& L);

}  // namespace fp8ref::cli

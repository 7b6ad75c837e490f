// fp8ref CPU backend — the dynamic group quant of single f32 rows with its context built once (src/cpu/quant_cpu.cc),
// for callers that produce a row at a time in cache (rmsnorm_quant's quant specs off its fused path).
#pragma once

#include <cstdint>
#include <memory>

#include "fp8ref/quant.h"

namespace fp8ref::cpu {

// Quantizes rows y [1, K] (f32) as cpu::quantize(spec, Format::f32, y, {1, K}, q, scales) does, bit for bit, for a
// finalized dynamic spec at group, mx or row granularity: the context (conversion specs, constants, scratch) is
// built once, the row runs on the calling thread, and a caller that knows the row's group maxima passes them instead
// of a pass over the row. Not thread-safe: one per thread. Specs the vector kernels do not take (quant_path's
// "reference: ...") and rows longer than a work chunk run cpu::quantize itself.
class RowQuantizer {
 public:
  RowQuantizer(const QuantSpec& spec, int64_t K);
  ~RowQuantizer();
  RowQuantizer(const RowQuantizer&) = delete;
  RowQuantizer& operator=(const RowQuantizer&) = delete;
  // q: K codes; scales: the row's logical scales (ceil(K/G) of scale_storage(spec)). amax, when not null: the max
  // of |y| per group (bit patterns of non-negative f32), given only for a row without a NaN.
  void row(const float* y, uint8_t* q, void* scales, const uint32_t* amax = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8ref::cpu

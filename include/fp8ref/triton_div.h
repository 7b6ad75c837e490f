// fp8ref — Triton's fp32 division on NVIDIA GPUs, bit for bit (QuantSpec `div=triton-nv`, include/fp8ref/quant.h).
//
// Triton lowers fp32 `x / y` to PTX div.full.f32 (triton third_party/nvidia/.../ElementwiseOpToLLVM.cpp
// FDivOpConversion; research/quant-conventions.md A1), which is not IEEE division. ptxas compiles it on sm_90 to
// (SASS of a Triton 3.6.0 `x / y` kernel, captured on the H200 by tools/device/capture_quant_kernels.py):
//   if |y| > 2^126:        y = y · 0.25,  x = RN(x · 0.25)          FSETP.GT |y|, 2^126;  @P FMUL
//   if !(|y| >= 2^-126):   y = y · 2^24,  x = RN(x · 2^24)          FSETP.GEU |y|, 2^-126; @!P FMUL (not for NaN y)
//   r = MUFU.RCP(y)                                                  approximate reciprocal
//   x / y = RN(x · r)                                                FMUL (round to nearest even, subnormals kept)
// Both tests read the original y. After them every finite nonzero y is normal, and MUFU.RCP of a normal
// y = ±(1 + m·2^-23)·2^(e-127) is ±T(m)·2^(127-e) with T depending only on the mantissa m — T(m) differs from
// RN(1/(1 + m·2^-23)) by -1 ulp for 374,723 of the 2^23 mantissas, +1 ulp for 733,799, 0 for the rest.
// MUFU.RCP(±0) = ±Inf, (±Inf) = ±0, NaN -> NaN; every NaN result is the canonical 0x7FFFFFFF.
// The table of T (2^23 entries) is embedded compressed (reference/data/triton_nv_rcp_sm90.zlib: the differences in
// ulps, zlib) and inflated on first use (8 MiB). Verified against 30,000 captured (x, y, Triton x / y) triples over
// every operand class (tests/test_triton_div.cc; tests/data/h200/triton_div_pairs.npy); on the device the model
// matched Triton in all of 2^24 random pairs per class.
#pragma once

#include <cstdint>

namespace fp8ref::ref {

// T(m) = MUFU.RCP(1 + m·2^-23), m in [0, 2^23).
float triton_nv_rcp_mantissa(uint32_t m);
// The table behind it: d[m] = bits(T(m)) − bits(RN(1/(1 + m·2^-23))) in {-1, 0, 1}, 2^23 entries (inflated on the
// first call). For callers that look up many mantissas: prefetching &d[m] first lets the misses overlap (8 MiB).
const int8_t* triton_nv_rcp_deltas();
// Triton `x / y` (div.full.f32 on sm_90).
float triton_nv_div(float x, float y);

}  // namespace fp8ref::ref

// fp8ref — PTX ex2.approx.ftz.f32 on sm_90 (MUFU.EX2), bit for bit, for x <= 0: FlashInfer's exp2 (math::ptx_exp2).
//
// Captured on an H100 (tools/device/capture_mufu_ex2.py) and checked there over every f32 in [-150, 0): with
// x = -(n + f), n = floor(-x) an integer and f in [0, 1),
//   ex2(x) = 2^-n · T[trunc(f · 2^23)]   (f truncated to the 2^-23 grid; nearest or away from zero miss), 0 below 2^-126
// where T[k] = ex2(-k·2^-23), k = 0 .. 2^23, the table embedded from reference/data/mufu_ex2_sm90.zlib (the int8 steps
// between consecutive bit patterns, T[0] = 1.0; inflated to 32 MiB on first use). ±0 -> 1, −Inf -> +0, NaN -> NaN.
// x > 0 was not captured: RN32(2^x) stands in there (no caller of fp8ref passes one).
#pragma once

namespace fp8ref::ref {

float mufu_ex2(float x);

}  // namespace fp8ref::ref

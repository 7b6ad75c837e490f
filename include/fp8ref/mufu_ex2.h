// fp8ref — PTX ex2.approx.ftz.f32 on sm_90 (MUFU.EX2), bit for bit: FlashInfer's exp2 (math::ptx_exp2), and Triton's
// tl.exp on NVIDIA.
//
// Captured on an H100 (tools/device/capture_mufu_ex2.py; an H200 gave the same tables) and checked there over every
// f32 in [-150, 128): with
// |x| = n + f, n = floor(|x|) an integer and f in [0, 1),
//   ex2(x) = 2^-n · T[trunc(f · 2^23)]  for x <= 0 (flushed to 0 below 2^-126)
//   ex2(x) = 2^n · P[trunc(f · 2^23)]   for x > 0 (+Inf from 128)
// (f truncated to the 2^-23 grid; rounding it to nearest or away from zero misses), where T[k] = ex2(-k·2^-23) and
// P[k] = ex2(k·2^-23), k = 0 .. 2^23: two tables (P is not T mirrored), embedded from reference/data/
// mufu_ex2_sm90.zlib (the int8 steps between consecutive bit patterns, T[0] = P[0] = 1.0; on first use rebuilt as
// every 256th pattern plus an int8 correction per entry: 16 MiB in all). ±0 -> 1, −Inf -> +0, NaN -> NaN.
#pragma once

// triton_exp(x): Triton's tl.exp for f32 on NVIDIA (3.6.0, read in a kernel's PTX on the H200): mul.f32 by
// RN32(log2 e) = 0x3FB8AA3B, then ex2.approx.f32 — the same MUFU.EX2 without ftz: results below 2^-126 are the table
// value rounded (RNE) to a subnormal, which misses the GPU's own in ~4 % of such inputs. vllm-triton-unified's exp
// (0.4.0; docs/attention.md).
namespace fp8ref::ref {

float mufu_ex2(float x);
float triton_exp(float x);

}  // namespace fp8ref::ref

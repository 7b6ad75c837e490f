#!/usr/bin/env python3
"""Anchor for bench_rmsnorm_quant: a vectorised numpy + ml_dtypes fused RMSNorm + FP8 group quant on the same
shape (bf16 [M, K] -> e4m3fn codes + f32 group-128 scales), aiter-style arithmetic (f32 y, s = max(amax, 1e-10)/448,
q = clamp(y * (1/s))) with numpy's own f32 sum order. Times the op (best of --reps) and prints
`numpy_gbs=G` on stdout (bytes read + written per second, counted as bench_rmsnorm_quant counts them).
"""
import argparse
import sys
import time

import ml_dtypes
import numpy as np

F32 = np.float32


def rmsnorm_quant(xb, w32, group=128, eps=F32(1e-6)):
    M, K = xb.shape
    x = xb.astype(F32)
    ss = np.einsum("ij,ij->i", x, x)                                  # f32 sum of squares per row
    r = F32(1) / np.sqrt(ss / F32(K) + eps)
    y = (x * r[:, None]) * w32
    yg = y.reshape(M, K // group, group)
    amax = np.maximum(np.abs(yg).max(axis=2), F32(1e-10))
    s = amax / F32(448)
    q = np.clip(yg * (F32(1) / s)[:, :, None], F32(-448), F32(448)).astype(ml_dtypes.float8_e4m3fn)
    return q.reshape(M, K), s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    scale = np.exp2((np.arange(a.m) % 13 - 6).astype(F32))[:, None]
    xb = (rng.standard_normal((a.m, a.k), dtype=F32) * scale).astype(ml_dtypes.bfloat16)
    w32 = (1 + 0.1 * rng.standard_normal(a.k, dtype=F32)).astype(ml_dtypes.bfloat16).astype(F32)
    best = float("inf")
    for _ in range(a.reps):
        t0 = time.perf_counter()
        rmsnorm_quant(xb, w32)
        best = min(best, time.perf_counter() - t0)
    moved = a.m * a.k * 2 + a.k * 2 + a.m * a.k + a.m * (a.k // 128) * 4
    print(f"anchor_rmsnorm_quant: best {best * 1e3:.1f} ms, {moved / best / 1e9:.3f} GB/s "
          f"(numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__})", file=sys.stderr)
    print(f"numpy_gbs={moved / best / 1e9:.4f}")


if __name__ == "__main__":
    main()

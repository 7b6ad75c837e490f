#!/usr/bin/env python3
"""Anchor for bench_quant: the same group quantization and dequantization in vectorised numpy + ml_dtypes.

Builds the identical bf16 input bench_quant.cc builds (the same counter hash), then times (best of --reps,
single-threaded, as numpy is):
  vllm-group          amax = fmax.reduce |x| per 1x128 group, fmax(amax, 1e-10); s = f32(amax / 448);
                      v = f32(x / s); fmin(fmax(v, -448), 448); astype(float8_e4m3fn)  — bit-identical to fp8ref's
                      vllm-group (the checksums printed match bench_quant's)
  deepseek-act-quant  the same with amax floor 1e-4 and no clamp, IEEE division — Triton's division (fp8ref's
                      div=triton-nv) has no numpy form; same traffic and operation count, not the same bits
  dequantize          codes.view(float8_e4m3fn).astype(f32) * s per group, astype(bfloat16)
Bandwidth = bytes read + bytes written per second, counted as bench_quant counts them.

stdout: `vllm-group=G`, `deepseek-act-quant=G`, `dequantize=G` (GB/s; read by bench/run_quant.sh); details on stderr.
"""
import argparse
import sys
import time

import ml_dtypes
import numpy as np

U = np.uint32


def lowbias32(x):
    x ^= x >> U(16)
    x *= U(0x7FEB352D)
    x ^= x >> U(15)
    x *= U(0x846CA68B)
    x ^= x >> U(16)
    return x


def bf16_input(n):
    """bench_quant.cc bf16_input(i): sign random, exponent 2^-8 .. 2^7, 7 random fraction bits; 1/4096 zero."""
    i = np.arange(n, dtype=np.uint32)
    h = lowbias32(i ^ U(0x9E3779B9))
    bits = ((h >> U(31)) << U(15)) | ((U(119) + (h >> U(12)) % U(16)) << U(7)) | ((h >> U(4)) & U(0x7F))
    bits[(h & U(4095)) == U(7)] = 0
    return bits.astype(np.uint16)


def checksum(b):
    """Σ byte[i] · (i | 1) mod 2^64, as bench_quant.cc."""
    b = b.reshape(-1).view(np.uint8).astype(np.uint64)
    return int((b * (np.arange(b.size, dtype=np.uint64) | np.uint64(1))).sum(dtype=np.uint64))


def quantize(x, floor, clamp):
    m, k = x.shape
    y = x.astype(np.float32).reshape(m, k // 128, 128)
    amax = np.fmax(np.fmax.reduce(np.abs(y), axis=2), np.float32(floor))
    s = amax / np.float32(448.0)
    v = y / s[..., None]
    if clamp:
        v = np.fmin(np.fmax(v, np.float32(-448.0)), np.float32(448.0))
    return v.astype(ml_dtypes.float8_e4m3fn).reshape(m, k), s


def dequantize(q, s):
    m, k = q.shape
    v = q.astype(np.float32).reshape(m, k // 128, 128) * s[..., None]
    return v.astype(ml_dtypes.bfloat16).reshape(m, k)


def best_of(reps, fn):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--k", type=int, default=7168)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    n, ng = a.m * a.k, a.m * a.k // 128
    x = bf16_input(n).view(ml_dtypes.bfloat16).reshape(a.m, a.k)
    moved_q = 2.0 * n + n + 4.0 * ng
    print(f"anchor_quant: ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, bf16 [{a.m}, {a.k}]",
          file=sys.stderr)
    t, (q, s) = best_of(a.reps, lambda: quantize(x, 1e-10, True))
    print(f"  vllm-group: best of {a.reps} {t * 1e3:.1f} ms; checksums: codes {checksum(q)} scales {checksum(s)}",
          file=sys.stderr)
    print(f"vllm-group={moved_q / t / 1e9:.4f}")
    t, _ = best_of(a.reps, lambda: quantize(x, 1e-4, False))
    print(f"  deepseek-act-quant (IEEE division): best of {a.reps} {t * 1e3:.1f} ms", file=sys.stderr)
    print(f"deepseek-act-quant={moved_q / t / 1e9:.4f}")
    t, back = best_of(a.reps, lambda: dequantize(q, s))
    print(f"  dequantize -> bf16: best of {a.reps} {t * 1e3:.1f} ms; checksum {checksum(back)}", file=sys.stderr)
    print(f"dequantize={moved_q / t / 1e9:.4f}")


if __name__ == "__main__":
    main()

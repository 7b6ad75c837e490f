#!/usr/bin/env python3
"""Anchor for bench_convert: ml_dtypes' numpy cast to float8_e4m3fn on the same array.

Builds, in numpy, the identical f32 array bench_convert.cc builds (the same counter hash, so the printed input
checksum matches the C++ one), then times `x.astype(ml_dtypes.float8_e4m3fn)` (best of --reps), and the same for
the bf16 array (the top halves of the f32 patterns). Bandwidth = bytes read + bytes written per second.

stdout: `ml_dtypes_f32_gbs=G` and `ml_dtypes_bf16_gbs=G` (read by bench/run_convert.sh); details on stderr.
"""
import argparse
import sys
import time

import ml_dtypes
import numpy as np

U = np.uint32


def lowbias32(x):
    """In place on a uint32 array (numpy wraps uint32 arithmetic)."""
    x ^= x >> U(16)
    x *= U(0x7FEB352D)
    x ^= x >> U(15)
    x *= U(0x846CA68B)
    x ^= x >> U(16)
    return x


def f32_patterns(n, chunk=1 << 22):
    """bench_convert.cc f32_pattern(i) for i in [0, n): sign random, exponent 2^-20..2^11, 1/1024 NaN, 1/1024 Inf."""
    out = np.empty(n, dtype=np.uint32)
    for b in range(0, n, chunk):
        i = np.arange(b, min(n, b + chunk), dtype=np.uint32)
        h = lowbias32(i ^ U(0x9E3779B9))
        g = lowbias32(h ^ U(0x85EBCA6B))
        sign = h & U(0x80000000)
        r = g & U(1023)
        bits = sign | ((U(107) + ((h >> U(23)) & U(31))) << U(23)) | (h & U(0x7FFFFF))
        nan = r == 0
        bits[nan] = (sign | U(0x7FC00000) | (h & U(0x3FFFFF)))[nan]
        inf = r == 1
        bits[inf] = (sign | U(0x7F800000))[inf]
        out[b:b + len(bits)] = bits
    return out


def best_of(reps, fn):
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-bf16", action="store_true")
    a = ap.parse_args()
    n = 1 << a.log2n

    t0 = time.perf_counter()
    bits = f32_patterns(n)
    checksum = int(bits.sum(dtype=np.uint64))
    x = bits.view(np.float32)
    print(f"anchor_ml_dtypes: ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, n = 2^{a.log2n}; "
          f"init {time.perf_counter() - t0:.2f} s; f32 input checksum {checksum}", file=sys.stderr)

    e4m3 = ml_dtypes.float8_e4m3fn
    t = best_of(a.reps, lambda: x.astype(e4m3))
    gbs = 5.0 * n / t / 1e9
    print(f"  astype f32 -> float8_e4m3fn: best of {a.reps} {t * 1e3:.1f} ms, {gbs:.2f} GB/s", file=sys.stderr)
    print(f"ml_dtypes_f32_gbs={gbs:.4f}")
    sys.stdout.flush()

    if not a.no_bf16:
        xb = (bits >> U(16)).astype(np.uint16).view(ml_dtypes.bfloat16)
        del bits, x
        t = best_of(a.reps, lambda: xb.astype(e4m3))
        gbs = 3.0 * n / t / 1e9
        print(f"  astype bf16 -> float8_e4m3fn: best of {a.reps} {t * 1e3:.1f} ms, {gbs:.2f} GB/s", file=sys.stderr)
        print(f"ml_dtypes_bf16_gbs={gbs:.4f}")


if __name__ == "__main__":
    main()

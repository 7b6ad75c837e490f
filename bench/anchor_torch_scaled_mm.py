#!/usr/bin/env python3
"""Anchor for bench_gemm_fast: torch CPU `_scaled_mm` (e4m3fn x e4m3fn, tensorwise scales — the only scaling the
CPU op takes — bf16 output) on the issue's shapes, best of R (median), TFLOP/s = 2*M*N*K / time.

Needs torch (not a project dependency; bench/run_gemm_fast.sh looks for it and says so when it is missing).
Usage: anchor_torch_scaled_mm.py [--reps R] [--threads T] [--shape M,N,K ...]
"""
import argparse
import time

import torch


def best_and_median(run, reps):
    """One warm-up call, then `reps` timed calls: (best, median) in seconds."""
    run()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        ts.append(time.perf_counter() - t0)
    return min(ts), sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", action="append")
    ap.add_argument("--scaling", default="tensor", help="ignored: torch's CPU _scaled_mm takes tensorwise only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(map(int, s.split(","))) for s in args.shape] if args.shape else [
        (128, 7168, 2048), (512, 4096, 7168), (16, 7168, 7168), (4096, 7168, 7168)]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, best of {args.reps} (median)")
    print("| M,N,K | kernel | wall, best (median) | TFLOP/s |\n|---|---|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for M, N, K in shapes:
        a = (torch.randn(M, K, generator=g) * 4).to(torch.float8_e4m3fn)
        b = (torch.randn(N, K, generator=g) * 4).to(torch.float8_e4m3fn)
        sa = torch.tensor(0.01)
        sb = torch.tensor(0.02)
        run = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)  # noqa: E731
        best, med = best_and_median(run, args.reps)
        print(f"| {M},{N},{K} | torch CPU _scaled_mm (tensorwise) | {best * 1e3:.2f} ms ({med * 1e3:.2f}) | "
              f"{2.0 * M * N * K / best / 1e12:.3f} |", flush=True)


if __name__ == "__main__":
    main()

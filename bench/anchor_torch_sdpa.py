#!/usr/bin/env python3
"""Anchor for bench_attention (issue 6): torch CPU scaled_dot_product_attention on the same decode problem — batch 32,
context 4096, Hkv 8, Hq 64 (GQA 8:1, enable_gqa=True), D 128 — with the K/V cache already dequantized to dense bf16
[B, Hkv, ctx, D] tensors (what a torch CPU fallback runs after dequantizing the FP8 pages), bf16 queries [B, Hq, 1, D].
Best of R (median), in the units of bench_attention: the FP8 cache bytes (2 x B*ctx*Hkv*D) per second, and the bf16
bytes torch actually reads. The dequantization itself is not timed (it would add a full pass over the cache).

Needs torch (not a project dependency; bench/run_attention.sh looks for it and says so when it is missing).
--qlen N: N query tokens per sequence at the context's last N positions, causal (bench_attention --qlen: a chunked-
prefill step; SDPA's is_causal aligns top-left, so the mask is given).
Usage: anchor_torch_sdpa.py [--reps R] [--threads T] [--ctx 4096] [--batch 32] [--qlen 1]
"""
import argparse
import torch
import torch.nn.functional as F

from anchor_torch_scaled_mm import best_and_median


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--qlen", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    B, ctx, Hkv, Hq, D = args.batch, args.ctx, 8, 64, 128
    g = torch.Generator().manual_seed(0)
    # values of an e4m3fn cache times a per-tensor scale, as bf16 (exact: e4m3 values fit in bf16)
    k = (torch.randn(B, Hkv, ctx, D, generator=g) * 2).to(torch.float8_e4m3fn).to(torch.bfloat16) * 0.05
    v = (torch.randn(B, Hkv, ctx, D, generator=g) * 2).to(torch.float8_e4m3fn).to(torch.bfloat16) * 0.05
    n = args.qlen
    q = torch.randn(B, Hq, n, D, generator=g).to(torch.bfloat16)
    # query i (position ctx - n + i) sees keys 0 .. ctx - n + i
    mask = None if n == 1 else torch.arange(ctx)[None, :] <= (ctx - n + torch.arange(n))[:, None]
    run = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # noqa: E731
    with torch.no_grad():
        best, med = best_and_median(run, args.reps)
    fp8_bytes = 2 * B * ctx * Hkv * D
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, best of {args.reps} (median)")
    print("| kernel | threads | wall, best (median) | FP8-cache GB/s | bf16 GB/s read |\n|---|---:|---:|---:|---:|")
    what = "decode" if n == 1 else f"prefill chunk {n}"
    print(f"| torch CPU SDPA {what} B={B} ctx={ctx} (dense bf16 K/V, enable_gqa) | {args.threads} | {best * 1e3:.1f} ms ({med * 1e3:.1f}) | "
          f"{fp8_bytes / best / 1e9:.2f} | {2 * fp8_bytes / best / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()

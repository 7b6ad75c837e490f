#!/usr/bin/env python3
"""Capture the torch 2.11 + cuBLAS 13.0 blockwise-scale layout bug on an H200 (NUMERICS.md §5).

torch._scaled_mm with 1x128 activation scales and 128x128 weight scales: cuBLAS reads the weight scale of
n-block nb, k-block kb at offset nb*roundup(K/128, 4) + kb, while torch passes them densely (stride K/128).
For N > 128 and K/128 not a multiple of 4 every n-block after the first uses wrong scales.

Inputs are exact-sum data (small integers as e4m3, power-of-two scales), so the correct result is exact in f32
and any correct kernel gives the bf16 rounding of the exact value, bit for bit. The weight-scale tensor is a
dense view at the start of a larger buffer filled with known values, so that what cuBLAS reads past the
tensor is deterministic (it is the rest of that buffer, saved as sb_buffer).

Writes, per case (K = 640: the bug; K = 512: the control, no bug), into $OUT (or ./blockwise_capture):
  blockwise_K<K>.npz with a [M,K] u8 (e4m3 codes), b [N,K] u8, sa [M,K/128] f32 (row-major logical values),
  sb [N/128,K/128] f32 (dense, as torch passes it), sb_buffer [..] f32 (the whole buffer), out [M,N] u16 (bf16)
"""
import os
import sys

import numpy as np
import torch

M, N = 256, 384
out_dir = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUT", "blockwise_capture")
os.makedirs(out_dir, exist_ok=True)
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))

for K in (640, 512):
    g = torch.Generator().manual_seed(K)
    kb, nb = K // 128, N // 128
    a = torch.randint(-4, 5, (M, K), generator=g).float().to(torch.float8_e4m3fn)
    b = torch.randint(-4, 5, (N, K), generator=g).float().to(torch.float8_e4m3fn)
    sa = torch.pow(2.0, torch.randint(-2, 3, (M, kb), generator=g).float())
    sb_dense = torch.pow(2.0, torch.randint(-3, 4, (nb, kb), generator=g).float())
    stride4 = (kb + 3) // 4 * 4
    buf = torch.pow(2.0, torch.randint(-3, 4, (nb * stride4 + 8,), generator=g).float())
    buf[: nb * kb] = sb_dense.flatten()
    buf = buf.cuda()
    sb = buf[: nb * kb].view(nb, kb)  # dense (N/128, K/128), as torch 2.11 lays it out
    a_d, b_d = a.cuda(), b.cuda()
    sa_d = sa.cuda().t().contiguous().t()  # (M, K/128), M-major (column-major), as torch requires
    out = torch._scaled_mm(a_d, b_d.t(), scale_a=sa_d, scale_b=sb.t(), out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    # the exact result, for a quick look here (the test recomputes it independently)
    af, bf = a.float().double(), b.float().double()
    exact = torch.zeros(M, N, dtype=torch.float64)
    for k in range(kb):
        p = af[:, k * 128:(k + 1) * 128] @ bf[:, k * 128:(k + 1) * 128].t()
        exact += p * sa[:, k:k + 1].double() * sb_dense[:, k].double().repeat_interleave(128)[None, :]
    ok = out.cpu().view(torch.int16) == exact.to(torch.bfloat16).view(torch.int16)
    cols = [ok[:, j * 128:(j + 1) * 128].float().mean().item() for j in range(nb)]
    print(f"K={K}: bitwise-equal fraction per n-block {cols}")
    np.savez(os.path.join(out_dir, f"blockwise_K{K}.npz"),
             a=a.view(torch.uint8).numpy(), b=b.view(torch.uint8).numpy(), sa=sa.numpy(),
             sb=sb_dense.numpy(), sb_buffer=buf.cpu().numpy(), out=out.cpu().view(torch.int16).numpy().view(np.uint16))
print("done")

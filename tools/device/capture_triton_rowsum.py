#!/usr/bin/env python3
"""Capture the order in which Triton's tl.sum(P, axis=1) adds a [16, T] f32 tile held in the tensor-core (MMAv2)
layout, and whether `L * alpha + l` is contracted to an FMA — the two f32 steps of vLLM's unified attention between
its dots (l_j = tl.sum(P, axis=1); L = L * alpha + l_j) — for fp8ref's `vllm-triton-unified`.

The tile is X = tl.dot(Z, W) + V with Z, W zero bf16 tiles loaded at run time (so X takes the dot's layout, as P does
in vLLM's kernel, where P = tl.exp(S - m) is elementwise on the dot's result S) and V the f32 values under test:
normal x 2^U(-20, 20), so that every summation order rounds differently. BLOCK_M = 16, num_warps = 4 (vLLM's
launch), T = 16 (the 3D kernel's TILE_SIZE_DECODE) and 32 (the 2D kernel's TILE_SIZE_PREFILL).
Writes $OUT/triton_rowsum/ (tests/data/h200/triton_rowsum/, read by tests/test_attention.cc): t<T>_v.npy [R, 16, T]
f32, t<T>_sum.npy [R, 16] f32 (tl.sum), t<T>_l / _alpha / _ls.npy [R, 16] f32 and t<T>_lout.npy [R, 16] (L * alpha +
ls as written in the kernel), R = 64 programs; the PTX of the T = 16 kernel is printed in part (mma, fma, shfl).
"""
import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from npy_dir import save_npy_dir  # noqa: E402

dev = torch.device("cuda")


@triton.jit
def rowsum_kernel(z_ptr, w_ptr, v_ptr, l_ptr, a_ptr, s_ptr, sum_ptr, lout_ptr, T: tl.constexpr):
    t = tl.program_id(0)
    om = tl.arange(0, 16)
    on = tl.arange(0, T)
    ok = tl.arange(0, 16)
    z = tl.load(z_ptr + om[:, None] * 16 + ok[None, :])
    w = tl.load(w_ptr + ok[:, None] * T + on[None, :])
    x = tl.dot(z, w) + tl.load(v_ptr + t * 16 * T + om[:, None] * T + on[None, :])
    s = tl.sum(x, axis=1)
    tl.store(sum_ptr + t * 16 + om, s)
    L = tl.load(l_ptr + t * 16 + om)
    alpha = tl.load(a_ptr + t * 16 + om)
    ls = tl.load(s_ptr + t * 16 + om)
    L = L * alpha + ls
    tl.store(lout_ptr + t * 16 + om, L)


rng = np.random.default_rng(20261208)
R = 64
res = {}
print("triton", triton.__version__, torch.cuda.get_device_name(0))
for T in (16, 32):
    v = (rng.standard_normal((R, 16, T)) * np.exp2(rng.integers(-20, 21, (R, 16, T)))).astype(np.float32)
    lv = (rng.uniform(0, 64, (R, 16))).astype(np.float32)
    al = (rng.uniform(0, 1, (R, 16))).astype(np.float32)
    ls = (rng.uniform(0, 16, (R, 16))).astype(np.float32)
    g = {k: torch.from_numpy(x).to(dev) for k, x in (("v", v), ("l", lv), ("a", al), ("s", ls))}
    z = torch.zeros(16, 16, dtype=torch.bfloat16, device=dev)
    w = torch.zeros(16, T, dtype=torch.bfloat16, device=dev)
    sm = torch.empty(R, 16, dtype=torch.float32, device=dev)
    lo = torch.empty(R, 16, dtype=torch.float32, device=dev)
    k = rowsum_kernel[(R,)](z, w, g["v"], g["l"], g["a"], g["s"], sm, lo, T=T, num_warps=4)
    ptx = k.asm["ptx"]
    print(T, "mma lines:", sorted({ln.split()[0] for ln in ptx.split("\n") if "mma" in ln}),
          "fma.rn.f32:", ptx.count("fma.rn.f32"), "shfl:", ptx.count("shfl.sync"), flush=True)
    res.update({f"t{T}_v": v, f"t{T}_sum": sm.cpu().numpy(), f"t{T}_l": lv, f"t{T}_alpha": al, f"t{T}_ls": ls,
                f"t{T}_lout": lo.cpu().numpy()})
save_npy_dir("triton_rowsum", res)

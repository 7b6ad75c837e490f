#!/usr/bin/env python3
"""Capture the k order of Triton's tl.dot when an operand was converted from fp8 in registers, as in vLLM's unified
attention: K = (K8.to(f32) * k_scale).to(Q.dtype), S = scale * tl.dot(Q, K); P = tl.exp(S - max); acc =
tl.dot(P.to(V.dtype), V) with V converted the same way (BLOCK_M = 16, head dim 128, a tile of 32 keys, num_warps = 4).
The PTX is mma.sync m16n8k16 as for 16-bit loads (capture_triton_dot.py), but the operands take Triton's "kWidth =
4" register layout, and each block of 32 k is two mma steps: the k with k mod 4 in {0, 1}, then those in {2, 3}
(fp8ref::ref::hmma16_dot_kw4); in order, as for 16-bit loads, most outputs differ.

Writes $OUT/triton_dot_fp8/ (tests/data/h200/triton_dot_fp8/, read by tests/test_mma.cc), per query dtype
<dt> in f16, bf16: <dt>_q.npy [R, 16, 128] u16 bits, <dt>_k.npy [R, 128, 32] u8 e4m3fn codes, <dt>_v.npy [R, 32, 128]
u8, <dt>_scales.npy [3] f32 (k_scale, v_scale, the softmax scale), <dt>_s.npy [R, 16, 32] f32 (S), <dt>_p.npy
[R, 16, 32] f32 (P), <dt>_a.npy [R, 16, 128] f32 (tl.dot(P.to(dt), V) from +0); R = 16 programs. The device tool
returns at most 8 files, so tar the directory.
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
def sp_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, s_ptr, p_ptr, a_ptr, scale, D: tl.constexpr, T: tl.constexpr):
    pid = tl.program_id(0)
    om = tl.arange(0, 16)
    od = tl.arange(0, D)
    ot = tl.arange(0, T)
    Q = tl.load(q_ptr + pid * 16 * D + om[:, None] * D + od[None, :])
    K8 = tl.load(k_ptr + pid * D * T + od[:, None] * T + ot[None, :])
    K = (K8.to(tl.float32) * tl.load(ks_ptr)).to(Q.dtype)
    V8 = tl.load(v_ptr + pid * T * D + ot[:, None] * D + od[None, :])
    V = (V8.to(tl.float32) * tl.load(vs_ptr)).to(Q.dtype)
    S = tl.zeros([16, T], dtype=tl.float32)
    S += scale * tl.dot(Q, K)
    m = tl.max(S, axis=1)
    P = tl.exp(S - m[:, None])
    acc = tl.zeros([16, D], dtype=tl.float32)
    acc += tl.dot(P.to(V.dtype), V)
    tl.store(s_ptr + pid * 16 * T + om[:, None] * T + ot[None, :], S)
    tl.store(p_ptr + pid * 16 * T + om[:, None] * T + ot[None, :], P)
    tl.store(a_ptr + pid * 16 * D + om[:, None] * D + od[None, :], acc)


rng = np.random.default_rng(20261210)
R, D, T = 16, 128, 32
print("triton", triton.__version__, torch.cuda.get_device_name(0))
res = {}
for dt, name in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
    q = torch.from_numpy(rng.normal(0, 1, (R, 16, D)).astype(np.float32)).to(dt)
    k8 = torch.from_numpy(rng.normal(0, 3, (R, D, T)).astype(np.float32)).to(torch.float8_e4m3fn)
    v8 = torch.from_numpy(rng.normal(0, 3, (R, T, D)).astype(np.float32)).to(torch.float8_e4m3fn)
    ks = torch.tensor([np.ldexp(rng.uniform(1, 2), -4)], dtype=torch.float32)
    vs = torch.tensor([np.ldexp(rng.uniform(1, 2), -4)], dtype=torch.float32)
    scale = float(np.float32(1 / np.sqrt(D)))
    S = torch.empty(R, 16, T, device=dev)
    P = torch.empty(R, 16, T, device=dev)
    A = torch.empty(R, 16, D, device=dev)
    k = sp_kernel[(R,)](q.to(dev), k8.to(dev), v8.to(dev), ks.to(dev), vs.to(dev), S, P, A, scale, D=D, T=T)
    print(name, sorted({ln.split()[0] for ln in k.asm["ptx"].split("\n") if "mma" in ln}))
    for key, arr in (("q", q.view(torch.int16).numpy().view(np.uint16)), ("k", k8.view(torch.uint8).numpy()),
                     ("v", v8.view(torch.uint8).numpy()),
                     ("scales", np.array([ks.item(), vs.item(), scale], np.float32)), ("s", S.cpu().numpy()),
                     ("p", P.cpu().numpy()), ("a", A.cpu().numpy())):
        res[f"{name}_{key}"] = arr
save_npy_dir("triton_dot_fp8", res)

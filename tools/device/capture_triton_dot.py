#!/usr/bin/env python3
"""Capture what Triton's tl.dot of bf16 (and f16) tiles computes on the GPU, for fp8ref's model of the tensor-core
step behind `vllm-triton-unified`'s two dots (S = tl.dot(Q, K), acc += tl.dot(P, V)).

One program per tile: A [16, K], B [K, 16] (bf16 or f16), C [16, 16] f32; D = tl.dot(A, B, C) ("fold") or
D = C + tl.dot(A, B) written as vLLM writes it ("add": Triton folds the add into the dot's accumulator, or not:
the capture shows which). With BLOCK_M = 16, Triton builds the dot on Hopper from mma.sync m16n8k16 (MMAv2): the
PTX's mma instructions are printed so that the log says which instruction ran.

Cases (inputs from np.random.default_rng(20261207), stored: a few hundred KB):
  rand      normal A, B; C = 0                         (the plain dot, S in vLLM)
  acc       normal A, B; C normal x 2^U(-8, 8)         (the accumulator joins the steps' alignment)
  spread    A, B normal x 2^U(-12, 12) each           (terms truncated away below the block's largest)
  cancel    B's columns in +/- pairs over k            (sums far below their terms: the truncation shows)
  attn      A = bf16(exp(-U(0, 12))) (P), B = e4m3 values x 0.0123 rounded to bf16 (V), C as a running acc
  f16       normal f16 A, B, C normal (the f16 datapath)
Writes $OUT/triton_dot/ (tests/data/h200/triton_dot/, read by tests/test_mma.cc): per case <name>_a.npy [T, 16, K]
u16 bits, <name>_b.npy [T, K, 16] u16, <name>_c.npy [T, 16, 16] f32, <name>_d.npy [T, 16, 16] f32 (the "fold"
kernel's D; the "add" kernel's is checked equal here), T = 16 tiles; meta.txt (Triton, device, the PTX mma lines).
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
def dot_kernel(a_ptr, b_ptr, c_ptr, d_ptr, K: tl.constexpr, FOLD: tl.constexpr):
    t = tl.program_id(0)
    om = tl.arange(0, 16)
    on = tl.arange(0, 16)
    ok = tl.arange(0, K)
    a = tl.load(a_ptr + t * 16 * K + om[:, None] * K + ok[None, :])
    b = tl.load(b_ptr + t * K * 16 + ok[:, None] * 16 + on[None, :])
    c = tl.load(c_ptr + t * 256 + om[:, None] * 16 + on[None, :])
    if FOLD:
        d = tl.dot(a, b, c)
    else:
        d = c
        d += tl.dot(a, b)
    tl.store(d_ptr + t * 256 + om[:, None] * 16 + on[None, :], d)


def bf16(x):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)


def run(a, b, c, K):
    T = a.shape[0]
    ga, gb, gc = a.to(dev), b.to(dev), torch.from_numpy(c).to(dev)
    res = {}
    ptx = ""
    for fold in (True, False):
        d = torch.empty(T, 16, 16, dtype=torch.float32, device=dev)
        k = dot_kernel[(T,)](ga, gb, gc, d, K=K, FOLD=fold)
        res["fold" if fold else "add"] = d.cpu().numpy()
        ptx += "\n".join(sorted({ln.strip().split()[0] for ln in k.asm["ptx"].splitlines() if "mma" in ln})) + "\n"
    return res, ptx


rng = np.random.default_rng(20261207)
T = 16
cases = {}


def e4m3_values():
    v = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    return v[np.isfinite(v)]


E4 = e4m3_values()
mma_lines = set()
for name, K, dt in (("rand", 128, torch.bfloat16), ("acc", 32, torch.bfloat16), ("spread", 64, torch.bfloat16),
                    ("cancel", 128, torch.bfloat16), ("attn", 32, torch.bfloat16), ("f16", 64, torch.float16)):
    a = rng.standard_normal((T, 16, K)).astype(np.float32)
    b = rng.standard_normal((T, K, 16)).astype(np.float32)
    c = np.zeros((T, 16, 16), np.float32)
    if name == "acc" or name == "f16":
        c = (rng.standard_normal((T, 16, 16)) * np.exp2(rng.integers(-8, 9, (T, 16, 16)))).astype(np.float32)
    if name == "spread":
        a *= np.exp2(rng.integers(-12, 13, a.shape)).astype(np.float32)
        b *= np.exp2(rng.integers(-12, 13, b.shape)).astype(np.float32)
    if name == "cancel":
        b[:, 1::2, :] = -b[:, 0::2, :] * (1 + rng.integers(-3, 4, b[:, 1::2, :].shape) / 128.0)
    if name == "attn":
        a = np.exp(-rng.uniform(0, 12, a.shape)).astype(np.float32)
        b = (rng.choice(E4, b.shape) * np.float32(0.0123)).astype(np.float32)
        c = (rng.uniform(-1, 1, c.shape) * 4).astype(np.float32)
    ta, tb = torch.from_numpy(a).to(dt), torch.from_numpy(b).to(dt)
    res, ptx = run(ta, tb, c, K)
    print(name, K, dt, "mma:", " ".join(sorted(set(ptx.split()))), "fold==add:",
          bool((res["fold"].view(np.uint32) == res["add"].view(np.uint32)).all()), flush=True)
    assert (res["fold"].view(np.uint32) == res["add"].view(np.uint32)).all()
    cases[name + "_a"] = ta.view(torch.int16).numpy().view(np.uint16)
    cases[name + "_b"] = tb.view(torch.int16).numpy().view(np.uint16)
    cases[name + "_c"] = c
    cases[name + "_d"] = res["fold"]
    mma_lines |= set(ptx.split())
meta = (f"triton {triton.__version__} torch {torch.__version__} {torch.cuda.get_device_name(0)} "
        f"ptx: {' '.join(sorted(mma_lines))}")
save_npy_dir("triton_dot", cases, meta)

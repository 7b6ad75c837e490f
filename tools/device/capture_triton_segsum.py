#!/usr/bin/env python3
"""Capture the order in which Triton adds vLLM's 16 segments in reduce_segments (the last step of its 3D unified
attention kernel): overall_expsum = tl.sum(segm_expsum) over a [16] vector and acc_sum = tl.sum(segm_output, axis=0)
over a [16, HEAD_SIZE_PADDED] tile, both loaded as reduce_segments loads them (masked loads, num_warps = 4, one
program per query token and head). Values normal x 2^U(-20, 20) so that every order rounds differently.
Writes $OUT/triton_segsum/ (tests/data/h200/triton_segsum/, read by tests/test_attention.cc): d<D>_out.npy [R, 16, D]
f32, d<D>_osum.npy [R, D] (axis-0 sums), d<D>_e.npy [R, 16], d<D>_esum.npy [R] (the vector's sum), for D = 32, 64,
128, 256 and R = 16 programs.
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
def segsum_kernel(o_ptr, e_ptr, osum_ptr, esum_ptr, D: tl.constexpr, NSEG: tl.constexpr):
    t = tl.program_id(0)
    segm_mask = tl.arange(0, NSEG) < NSEG
    dim_mask = tl.arange(0, D) < D
    e = tl.load(e_ptr + t * NSEG + tl.arange(0, NSEG), mask=segm_mask, other=0.0)
    tl.store(esum_ptr + t, tl.sum(e))
    off = t * NSEG * D + tl.arange(0, NSEG)[:, None] * D + tl.arange(0, D)[None, :]
    o = tl.load(o_ptr + off, mask=segm_mask[:, None] & dim_mask[None, :], other=0.0)
    tl.store(osum_ptr + t * D + tl.arange(0, D), tl.sum(o, axis=0))


rng = np.random.default_rng(20261209)
R = 16
res = {}
print("triton", triton.__version__, torch.cuda.get_device_name(0))
for D in (32, 64, 128, 256):
    o = (rng.standard_normal((R, 16, D)) * np.exp2(rng.integers(-20, 21, (R, 16, D)))).astype(np.float32)
    e = (rng.standard_normal((R, 16)) * np.exp2(rng.integers(-20, 21, (R, 16)))).astype(np.float32)
    go, ge = torch.from_numpy(o).to(dev), torch.from_numpy(e).to(dev)
    osum = torch.empty(R, D, dtype=torch.float32, device=dev)
    esum = torch.empty(R, dtype=torch.float32, device=dev)
    segsum_kernel[(R,)](go, ge, osum, esum, D=D, NSEG=16, num_warps=4)
    res.update({f"d{D}_out": o, f"d{D}_osum": osum.cpu().numpy(), f"d{D}_e": e, f"d{D}_esum": esum.cpu().numpy()})
save_npy_dir("triton_segsum", res)

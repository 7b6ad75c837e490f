#!/usr/bin/env python3
"""Triton's tl.exp on f32 (Triton 3.6.0 with torch 2.11.0 on the H200): prints the kernel's PTX lines with ex2 and the
multiply before it (mul.f32 by 0f3FB8AA3B = RN32(log2 e), then ex2.approx.f32, no ftz), and writes (x, tl.exp x)
pairs for x in [-1, 0] and [-110, 0] (the exponent of vllm-triton-unified's weights, subnormal results included):
$OUT/tl_exp_pairs.npy uint32 [N, 2] -> tests/data/h200/triton_exp_pairs.npy (fp8ref_tests -tc='triton_exp*').
Run: run(command="mkdir -p $OUT && python3 tools/device/capture_triton_exp.py")
"""
import os

import numpy as np
import torch
import triton
import triton.language as tl


@triton.jit
def exp_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m)
    tl.store(y_ptr + i, tl.exp(x), mask=m)


rng = np.random.default_rng(1)
x = np.concatenate([-rng.uniform(0, 1, 20000), -rng.uniform(0, 110, 44000),
                    np.array([0, -87.3, -88.0, -100.0, -103.0, -104.0])]).astype(np.float32)
xt = torch.from_numpy(x).cuda()
yt = torch.empty_like(xt)
h = exp_kernel[(triton.cdiv(len(x), 1024),)](xt, yt, len(x), BLOCK=1024)
print([ln.strip() for ln in h.asm["ptx"].splitlines() if "ex2" in ln or "mul.f32" in ln][:4])
np.save(os.path.join(os.environ.get("OUT", "."), "tl_exp_pairs.npy"),
        np.stack([x.view(np.uint32), yt.cpu().numpy().view(np.uint32)], 1))

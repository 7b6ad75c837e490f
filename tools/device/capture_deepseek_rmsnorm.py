#!/usr/bin/env python3
"""H200 measurement for fp8ref's `deepseek-rmsnorm`: DeepSeek-V3 inference/model.py RMSNorm.forward run in torch on
CUDA (x.float(); var = x.pow(2).mean(-1, keepdim=True); x * torch.rsqrt(var + eps); (w * x).to(bf16)) on bf16 rows
of mixed magnitudes. Writes $OUT/deepseek_rmsnorm_h200.npz: x, w, the torch variance (f32), r = torch.rsqrt(var+eps)
and y (bf16 bits), so the test can count the rows where fp8ref's stand-in (variance=exact, rsqrt=cuda-rsqrtf)
differs from torch's mean — the part of the convention that is not modelled.
"""
import os

import numpy as np
import torch

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
print("torch", torch.__version__, torch.cuda.get_device_name())
rng = np.random.default_rng(11)
out = {}
for M, K in [(256, 7168), (256, 1536), (64, 512)]:
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(-30, 30, size=(M, 1)))
    xb = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16).cuda()
    w = torch.from_numpy((1 + 0.5 * rng.standard_normal(K)).astype(np.float32)).to(torch.bfloat16).cuda()
    x32 = xb.float()
    var = x32.pow(2).mean(-1, keepdim=True)
    r = torch.rsqrt(var + 1e-6)
    y = (w * (x32 * r)).to(torch.bfloat16)
    key = f"m{M}_k{K}"
    out[f"{key}.x"] = xb.cpu().view(torch.int16).numpy().view(np.uint16)
    out[f"{key}.w"] = w.cpu().view(torch.int16).numpy().view(np.uint16)
    out[f"{key}.var"] = var.cpu().numpy()[:, 0]
    out[f"{key}.r"] = r.cpu().numpy()[:, 0]
    out[f"{key}.y"] = y.cpu().view(torch.int16).numpy().view(np.uint16)
    # a rough look: torch's mean against the f64 mean rounded to f32
    ref = (x32.double().pow(2).mean(-1)).float()
    print(key, "rows where torch's f32 mean != f32(f64 mean):", int((ref != var[:, 0]).sum()), "of", M)
np.savez_compressed(f"{OUT}/deepseek_rmsnorm_h200.npz", **out)
print("wrote", os.path.getsize(f"{OUT}/deepseek_rmsnorm_h200.npz"), "bytes")

#!/usr/bin/env python3
"""Capture PyTorch's CPU math SDPA on dequantized FP8 K/V (the `torch-sdpa-math` paged-attention convention).

Runs on the CPU of the device machine (it has torch; this one does not). One call writes
$OUT/sdpa_math_cpu.safetensors (AVX512 capability; with ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
ONEDNN_MAX_CPU_ISA=AVX2 in the environment: $OUT/sdpa_math_cpu_avx2.safetensors, the AVX2 kernels) (uncompressed, small) and prints a log. Stored as tests/data/h200/sdpa_math_cpu.safetensors;
tests/test_attention_torch.cc rebuilds a paged cache from each case and checks fp8ref's torch-sdpa-math bit for bit.

Per case i (metadata "case<i>" = JSON: md, dk, dv, hq, hkv, kv, q_len, sm_scale, causal, k_scale, v_scale):
  c<i>.k8 [kv, Hkv, Dk] U8 e4m3fn codes; c<i>.v8 [kv, Hkv, Dv] U8 (absent for MLA: V = K[..., :Dv]);
  c<i>.q [q_len, Hq, Dk] (BF16/F16/F32 bits); c<i>.out [q_len, Hq, Dv] (md) = aten._scaled_dot_product_attention_math
  on K̂ = (k8.float() * k_scale).to(md), V̂ likewise, bool mask (bottom-right or top-left), scale=sm_scale;
  c<i>.attn [Hq, q_len, kv] (f32 weights as returned); c<i>.logits [Hq, q_len, kv] F32 = (q.float()*c) @ (K̂.float()*c)ᵀ.
Diagnostics for the model's pieces: exp.x / exp.y (torch.exp on f32 CPU), smx.x / smx.y (torch.softmax rows of
lengths 1..70, row r of length r+1 zero-padded to 70), bmm.a/bmm.b/bmm.y (f32 matmuls [8,40]x[40,64]).
Metadata "torch": version, cpu capability, threads.
"""
import json
import os
import struct
import sys

import numpy as np
import torch

out_dir = os.environ.get("OUT", sys.argv[1] if len(sys.argv) > 1 else "attn_capture")
os.makedirs(out_dir, exist_ok=True)
torch.set_num_threads(1)
cap = torch.backends.cpu.get_cpu_capability()
print("torch", torch.__version__, "cpu capability", cap, flush=True)

E4 = torch.float8_e4m3fn
MD = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TAG = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.uint8: "U8"}

tensors = {}
meta = {"torch": json.dumps({"version": torch.__version__, "capability": cap, "threads": torch.get_num_threads()})}


def put(name, t):
    t = t.contiguous().cpu()
    raw = t.view(torch.uint8).numpy().tobytes() if t.dtype != torch.uint8 else t.numpy().tobytes()
    tensors[name] = (TAG[t.dtype], list(t.shape), raw)


CASES = [
    # md, dk, dv, hq, hkv, kv, q_len, sm_scale, causal
    ("bf16", 64, 64, 4, 1, 37, 1, None, "bottom-right"),
    ("bf16", 64, 64, 4, 2, 29, 5, 0.1, "bottom-right"),
    ("f16", 128, 128, 2, 2, 40, 3, None, "bottom-right"),
    ("f32", 64, 64, 2, 1, 21, 4, None, "top-left"),
    ("bf16", 128, 128, 8, 1, 9, 1, None, "bottom-right"),
    ("bf16", 256, 256, 2, 1, 64, 2, 0.05, "bottom-right"),
    ("f16", 64, 64, 2, 1, 16, 16, None, "bottom-right"),
    ("bf16", 576, 512, 4, 1, 20, 1, None, "bottom-right"),  # MLA: V = K[..., :512]
]

rng = np.random.default_rng(20261201)
for i, (md, dk, dv, hq, hkv, kv, ql, sm, causal) in enumerate(CASES):
    dt = MD[md]
    mla = dv != dk
    k8 = (torch.from_numpy(rng.standard_normal((kv, hkv, dk)).astype(np.float32)) * 3).to(E4).view(torch.uint8)
    v8 = k8[..., :dv] if mla else (torch.from_numpy(rng.standard_normal((kv, hkv, dv)).astype(np.float32)) * 3).to(E4).view(torch.uint8)
    ks = float(np.float32(rng.uniform(0.02, 0.2)))
    vs = ks if mla else float(np.float32(rng.uniform(0.02, 0.2)))
    q = torch.from_numpy(rng.standard_normal((ql, hq, dk)).astype(np.float32)).to(dt)
    ks_t = torch.tensor(ks, dtype=torch.float32)
    vs_t = torch.tensor(vs, dtype=torch.float32)
    K = (k8.view(E4).to(torch.float32) * ks_t).to(dt)  # [kv, hkv, dk]
    V = (v8.contiguous().view(E4).to(torch.float32) * vs_t).to(dt)
    G = hq // hkv
    Q4 = q.permute(1, 0, 2).unsqueeze(0)  # [1, hq, ql, dk]
    K4 = K.permute(1, 0, 2).repeat_interleave(G, dim=0).unsqueeze(0)
    V4 = V.permute(1, 0, 2).repeat_interleave(G, dim=0).unsqueeze(0)
    r = torch.arange(ql).unsqueeze(1)
    c = torch.arange(kv).unsqueeze(0)
    mask = (c <= r + (kv - ql)) if causal == "bottom-right" else (c <= r)
    # The aten op adds a bool mask as 0/1 (F.sdpa converts it first): pass the additive 0/-inf mask in md, as
    # F.sdpa's convert_boolean_attn_mask does. (The 2026-12-01 capture passed the bool mask: its masked cases
    # 1, 2, 3, 5, 6 hold SDPA with +1 added to the visible logits; only the unmasked cases 0, 4, 7 are used.)
    fmask = torch.zeros(mask.shape, dtype=dt).masked_fill(~mask, float("-inf"))
    out, attn = torch.ops.aten._scaled_dot_product_attention_math(Q4, K4, V4, attn_mask=fmask, scale=sm)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        out2 = torch.nn.functional.scaled_dot_product_attention(Q4, K4, V4, attn_mask=mask, scale=sm)
    scale = sm if sm is not None else 1.0 / (dk ** 0.5)
    cf = torch.tensor(scale ** 0.5, dtype=torch.float64).item()
    logits = (Q4.float() * cf) @ (K4.float().transpose(-2, -1) * cf)
    print(f"case {i}: md={md} dk={dk} dv={dv} hq={hq} hkv={hkv} kv={kv} q_len={ql} out {out.dtype} attn {attn.dtype} "
          f"F.sdpa(MATH)==aten math: {torch.equal(out, out2)}", flush=True)
    put(f"c{i}.k8", k8)
    if not mla:
        put(f"c{i}.v8", v8)
    put(f"c{i}.q", q)
    put(f"c{i}.out", out[0].permute(1, 0, 2))
    put(f"c{i}.attn", attn[0].float())
    put(f"c{i}.logits", logits[0])
    meta[f"case{i}"] = json.dumps({"md": md, "dk": dk, "dv": dv, "hq": hq, "hkv": hkv, "kv": kv, "q_len": ql,
                                   "sm_scale": scale, "causal": causal, "k_scale": ks, "v_scale": vs,
                                   "math_equals_F_sdpa": bool(torch.equal(out, out2))})

# Diagnostics: exp, softmax rows, f32 matmul.
x = np.concatenate([np.linspace(-103.9, 0.0, 30000, dtype=np.float32),
                    -rng.exponential(8.0, 30000).astype(np.float32)]).astype(np.float32)
xt = torch.from_numpy(x)
put("exp.x", xt)
put("exp.y", torch.exp(xt))
rows = torch.zeros(70, 70)
sm_out = torch.zeros(70, 70)
for n in range(1, 71):
    row = torch.from_numpy((rng.standard_normal(n) * 4).astype(np.float32))
    rows[n - 1, :n] = row
    sm_out[n - 1, :n] = torch.softmax(row, dim=-1)
put("smx.x", rows)
put("smx.y", sm_out)
a = torch.from_numpy(rng.standard_normal((8, 40)).astype(np.float32))
b = torch.from_numpy(rng.standard_normal((40, 64)).astype(np.float32))
put("bmm.a", a)
put("bmm.b", b)
put("bmm.y", a @ b)

# safetensors writer (header JSON, 8-byte aligned data)
header, off, blobs = {}, 0, []
for name, (tag, shape, raw) in tensors.items():
    header[name] = {"dtype": tag, "shape": shape, "data_offsets": [off, off + len(raw)]}
    blobs.append(raw)
    off += len(raw)
header["__metadata__"] = meta
h = json.dumps(header, separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
# ATEN_CPU_CAPABILITY=avx2 (with MKL_ENABLE_INSTRUCTIONS=AVX2 and ONEDNN_MAX_CPU_ISA=AVX2): the kernels an AVX2-only
# CPU runs (Vectorized<float> of 8 lanes), written to sdpa_math_cpu_avx2.safetensors
suffix = "" if cap == "AVX512" else "_" + cap.lower()
path = os.path.join(out_dir, f"sdpa_math_cpu{suffix}.safetensors")
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for raw in blobs:
        f.write(raw)
print("wrote", path, os.path.getsize(path), "bytes", flush=True)

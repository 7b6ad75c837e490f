#!/usr/bin/env python3
"""Run FlashInfer's batch decode kernel (BatchDecodeWithPagedKVCache: its CUDA-core decode path, as FlashInfer's
BatchDecodeWithPagedKVCacheWrapper runs it with use_tensor_cores=False) over a paged e4m3 KV cache on the GPU, for
fp8ref's `flashinfer` convention (tests/python/test_attention_flashinfer_capture.py).

FlashInfer is not part of fp8ref and the device machine has no FlashInfer: give the path of the include/ directory of
a FlashInfer release (flashinfer-python 0.7.4's flashinfer/data/include; the 18 headers this kernel needs are
header-only) as the first argument. The harness tools/device/capture_flashinfer_decode.cu (fp8ref's) drives the
kernel as FlashInfer's csrc/batch_decode.cu does: DecodePlan with FlashInfer's work estimation (split-KV or not, by
occupancy), then BatchDecodeWithPagedKVCacheDispatched; DefaultAttention, no RoPE; bf16 q and output.
One adaptation to the toolkit: FlashInfer 0.7.4's fastdiv.cuh wraps cuda::fast_mod_div, which CUDA 13.0's CCCL lacks;
the copy compiled here divides with plain integer / and % (the same quotients: page and slot indices only).
As FlashInfer's Python wrapper does, the K scale is folded into sm_scale (RN32 of (1/sqrt(D))·k_scale computed in
double) and the V scale applied after the kernel in the output dtype, (out.float() * v_scale).to(bf16), skipped when
v_scale == 1.

The inputs come from tools/device/paged_inputs.py (numpy only, from a seed), so the capture keeps only what the GPU
gave. Writes $OUT/flashinfer_occupancy.npy [N, 5] int32 (head dim, window variant, group size, SMs, FlashInfer's
max_grid_size) and $OUT/flashinfer_decode.npz: per case c<i>: _case [seed, Hkv, Hq, D, page, window_left (-1: none)] int64,
_seq_lens [B] int32, _plan [split_kv, kv_chunk_size] int32 (what FlashInfer's DecodePlan chose), _out [B, Hq, D]
uint16 (bf16 bits, after the V scale).
"""
import os
import subprocess
import sys

import numpy as np
import torch

from flashinfer_include import prepared_include  # noqa: E402 (this script's directory)

work, src_inc = prepared_include(sys.argv[1] if len(sys.argv) > 1 else "", "decode.cuh")
out_dir = os.environ.get("OUT", "flashinfer_capture")
os.makedirs(out_dir, exist_ok=True)
print("torch", torch.__version__, torch.cuda.get_device_name(0), flush=True)
harness = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capture_flashinfer_decode.cu")
binaries = {}


def binary(d, window):
    key = (d, window)
    if key not in binaries:
        exe = os.path.join(work, f"fi_decode_{d}_{window}")
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "--expt-relaxed-constexpr", f"-DFI_HEAD_DIM={d}",
                        f"-DFI_WINDOW={window}", "-DFI_CAP=0", "-I", src_inc, "-o", exe, harness], check=True)
        binaries[key] = exe
    return binaries[key]


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paged_inputs import decode_case  # noqa: E402

# occupancy: FlashInfer's max_grid_size (blocks per SM x SMs) per head dim, window variant and group size
occ = []
for d in (64, 128, 256):
    for window in (0, 1):
        run = subprocess.run([binary(d, window), "--occupancy"], capture_output=True, text=True, check=True)
        for line in run.stdout.splitlines():
            f = line.split()
            occ.append([d, window, int(f[f.index("G") + 1]), int(f[f.index("sms") + 1]),
                        int(f[f.index("max_grid_size") + 1])])
        print(run.stdout.strip(), flush=True)

CASES = [  # seed, seq_lens, Hkv, Hq, D, page size, window_left (-1: none)
    (1, [300, 77, 1, 1000], 2, 16, 128, 16, -1),           # G = 8
    (2, [500, 41, 2000], 2, 8, 64, 64, -1),                # G = 4
    (3, [129, 700], 4, 4, 128, 16, -1),                    # G = 1
    (4, [4096], 1, 8, 128, 16, -1),                        # one long sequence
    (5, [100, 50, 128, 7], 2, 16, 128, 16, -1),            # short sequences: no split
    (6, [300, 77, 1, 1000], 2, 16, 128, 16, 50),           # sliding window
    (7, [1500 + 97 * i for i in range(16)], 8, 64, 64, 16, -1),   # 16 x ~2200 keys x 8 KV heads: larger chunks
    (8, [2000] * 8, 4, 8, 256, 16, 700),                   # D = 256, G = 2, window
    (9, list(range(20, 660, 10)), 2, 12, 64, 1, -1),      # page size 1, G = 6, 64 sequences
]

np.save(os.path.join(out_dir, "flashinfer_occupancy.npy"), np.array(occ, np.int32))
res = {}
for i, (seed, seq_lens, hkv, hq, d, page, window) in enumerate(CASES):
    B = len(seq_lens)
    c = decode_case(seed, seq_lens, hkv, hq, d, page)
    case_dir = os.path.join(work, f"c{i}")
    os.makedirs(case_dir)
    for name, key in (("q", "q"), ("k", "kc"), ("v", "vc"), ("indptr", "indptr"), ("indices", "indices"),
                      ("last", "last")):
        c[key].tofile(os.path.join(case_dir, f"{name}.bin"))
    pages = c["kc"].shape[0]
    sm_scale = (1.0 / np.sqrt(d)) * float(c["ks"][0])  # FlashInfer's Python: sm_scale * k_scale, in double
    run = subprocess.run([binary(d, int(window >= 0)), case_dir, str(B), str(hq), str(hkv), str(d), str(page),
                          str(pages), repr(float(sm_scale)), str(window), "0"], capture_output=True, text=True)
    print(run.stdout.strip(), run.stderr.strip()[-2000:], flush=True)
    run.check_returncode()
    plan = run.stdout.split()
    o = torch.from_numpy(np.fromfile(os.path.join(case_dir, "o.bin"), np.int16).reshape(B, hq, d)).view(
        torch.bfloat16).to("cuda")
    vs = float(c["vs"][0])
    if vs != 1.0:
        o = (o.float() * vs).to(torch.bfloat16)
    o = o.cpu().view(torch.int16).numpy().view(np.uint16)
    assert not np.any((o & 0x7F80) == 0x7F80), "a NaN/Inf output"
    res.update({f"c{i}_case": np.array([seed, hkv, hq, d, page, window], np.int64),
                f"c{i}_seq_lens": np.array(seq_lens, np.int32),
                f"c{i}_plan": np.array([int(plan[plan.index("split_kv") + 1]),
                                        int(plan[plan.index("kv_chunk_size") + 1])], np.int32),
                f"c{i}_out": o})
    print(f"case {i}: B {B} Hq {hq} Hkv {hkv} D {d} page {page} window {window}: {run.stdout.strip()}", flush=True)

np.savez_compressed(os.path.join(out_dir, "flashinfer_decode.npz"), **res)
print("wrote", sum(a.nbytes for a in res.values()), "bytes raw", flush=True)

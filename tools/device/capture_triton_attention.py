#!/usr/bin/env python3
"""Run the steps of vLLM's Triton unified attention on the GPU, to measure how close fp8ref's `vllm-triton-unified`
convention comes to a GPU run of the same steps (not a bitwise oracle: tl.dot runs on tensor cores and tl.exp is
the GPU's approximate exp2, neither of which fp8ref models).

The kernel below is written from the steps as include/fp8ref/attention.h and the research notes (pac b.3) state
them, not copied from vLLM: one program per (query token, KV head) with the token's G query heads as rows (padded
to 16 for tl.dot); per tile of TILE keys of the sequence, from tile 0 to the tile holding the row's last key:
    K = (K8.to(f32) * k_scale).to(bf16); S = scale * dot(Q, K^T); S = -inf where the key is not visible;
    m = max(M, rowmax S); m = m if m > -inf else 0; P = exp(S - m); alpha = exp(M - m);
    acc = acc * alpha + dot(P.to(bf16), V); L = L * alpha + rowsum P; M = m
  out = acc / L, rounded to bf16. M starts at -inf, L at 1, acc at 0.
TILE = 32 is vLLM's 2D kernel's tile and fp8ref's default; TILE = 16 its 3D decode kernel's (without the segments).

Writes $OUT/triton_unified_attention.npz: per case i: c<i>_q [T, Hq, D] uint16 (bf16 bits), c<i>_kc/c<i>_vc
[nb, bs, Hkv, D] uint8 e4m3fn codes (NHD; every unused slot 0x7F, a NaN code), c<i>_bt [B, max_blocks] int32,
c<i>_sl [B] int32, c<i>_qsl [B+1] int32, c<i>_ks/c<i>_vs [1] float32, c<i>_out16 / c<i>_out32 [T, Hq, D] uint16
(bf16 bits: TILE 16 / 32). tests/python/test_attention_triton_capture.py reads it.
"""
import os
import sys

import numpy as np
import torch
import triton
import triton.language as tl

out_dir = os.environ.get("OUT", sys.argv[1] if len(sys.argv) > 1 else "triton_attn_capture")
os.makedirs(out_dir, exist_ok=True)
dev = torch.device("cuda")
print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), flush=True)


@triton.jit
def attn_kernel(out_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, sl_ptr, tok_seq_ptr, tok_pos_ptr, k_scale, v_scale, scale,
                HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, HKV: tl.constexpr,
                MAXB: tl.constexpr, TILE: tl.constexpr, BLOCK_M: tl.constexpr):
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.load(tok_seq_ptr + t)
    qpos = tl.load(tok_pos_ptr + t)  # the absolute key position of this query (bottom-right causal)
    seq_len = tl.load(sl_ptr + b)
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = rows < G
    heads = kvh * G + rows
    Q = tl.load(q_ptr + (t * HQ + heads)[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    M = tl.full([BLOCK_M], float("-inf"), tl.float32)
    L = tl.full([BLOCK_M], 1.0, tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    last = tl.minimum(qpos + 1, seq_len)  # keys [0, last) are visible
    num_tiles = (last + TILE - 1) // TILE
    offs_t = tl.arange(0, TILE)
    for j in range(0, num_tiles):
        kpos = j * TILE + offs_t
        kmask = kpos < last
        page = tl.load(bt_ptr + b * MAXB + kpos // BS, mask=kmask, other=0)
        base = ((page * BS + kpos % BS) * HKV + kvh) * D
        K8 = tl.load(kc_ptr + base[None, :] + offs_d[:, None], mask=kmask[None, :], other=0)
        V8 = tl.load(vc_ptr + base[:, None] + offs_d[None, :], mask=kmask[:, None], other=0)
        K = (K8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * k_scale).to(tl.bfloat16)
        V = (V8.to(tl.float8e4nv, bitcast=True).to(tl.float32) * v_scale).to(tl.bfloat16)
        S = scale * tl.dot(Q, K)
        S = tl.where(kmask[None, :], S, float("-inf"))
        m_j = tl.maximum(M, tl.max(S, axis=1))
        m_j = tl.where(m_j > float("-inf"), m_j, 0.0)
        P = tl.exp(S - m_j[:, None])
        l_j = tl.sum(P, axis=1)
        alpha = tl.exp(M - m_j)
        acc = acc * alpha[:, None]
        L = L * alpha + l_j
        M = m_j
        acc += tl.dot(P.to(tl.bfloat16), V)
    acc = acc / L[:, None]
    tl.store(out_ptr + (t * HQ + heads)[:, None] * D + offs_d[None, :], acc.to(tl.bfloat16), mask=row_ok[:, None])


CASES = [  # seq_lens, q_lens, Hkv, Hq, D, block size
    ([300, 77, 1, 140], [1, 3, 1, 20], 2, 16, 128, 16),
    ([64, 200, 33], [1, 1, 33], 1, 8, 128, 16),
    ([500, 41], [1, 9], 2, 8, 64, 64),
    ([129, 95, 256], [1, 16, 1], 4, 16, 128, 16),
]

rng = np.random.default_rng(20261206)
res = {}
for i, (seq_lens, q_lens, hkv, hq, d, bs) in enumerate(CASES):
    B = len(seq_lens)
    need = [(s + bs - 1) // bs for s in seq_lens]
    nb = sum(need) + 3
    perm = rng.permutation(nb).astype(np.int32)
    maxb = max(need) + 1
    bt = np.full((B, maxb), -1, np.int32)
    kc = np.full((nb, bs, hkv, d), 0x7F, np.uint8)
    vc = np.full((nb, bs, hkv, d), 0x7F, np.uint8)
    nxt = 0
    for b in range(B):
        for p in range(need[b]):
            bt[b, p] = perm[nxt]
            nxt += 1
        for j in range(seq_lens[b]):
            for arr in (kc, vc):
                vals = torch.tensor(rng.normal(0, 3, (hkv, d)), dtype=torch.float32)
                arr[bt[b, j // bs], j % bs] = vals.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qsl[-1])
    q = torch.tensor(rng.normal(0, 1, (T, hq, d)), dtype=torch.float32).to(torch.bfloat16)
    tok_seq = np.concatenate([[b] * q_lens[b] for b in range(B)]).astype(np.int32)
    tok_pos = np.concatenate([np.arange(seq_lens[b] - q_lens[b], seq_lens[b]) for b in range(B)]).astype(np.int32)
    ks = np.array([np.ldexp(rng.uniform(1, 2), -int(rng.integers(3, 6)))], np.float32)
    vs = np.array([np.ldexp(rng.uniform(1, 2), -int(rng.integers(3, 6)))], np.float32)
    g = hq // hkv
    scale = 1.0 / np.sqrt(d)
    for tile in (16, 32):
        out = torch.empty((T, hq, d), dtype=torch.bfloat16, device=dev)
        attn_kernel[(T, hkv)](out, q.to(dev), torch.from_numpy(kc).to(dev), torch.from_numpy(vc).to(dev),
                              torch.from_numpy(bt).to(dev), torch.tensor(seq_lens, dtype=torch.int32, device=dev),
                              torch.from_numpy(tok_seq).to(dev), torch.from_numpy(tok_pos).to(dev),
                              float(ks[0]), float(vs[0]), float(scale), HQ=hq, G=g, D=d, BS=bs, HKV=hkv, MAXB=maxb,
                              TILE=tile, BLOCK_M=max(16, triton.next_power_of_2(g)))
        res[f"c{i}_out{tile}"] = out.cpu().view(torch.int16).numpy().view(np.uint16)
    res.update({f"c{i}_q": q.view(torch.int16).numpy().view(np.uint16), f"c{i}_kc": kc, f"c{i}_vc": vc, f"c{i}_bt": bt,
                f"c{i}_sl": np.array(seq_lens, np.int32), f"c{i}_qsl": qsl, f"c{i}_ks": ks, f"c{i}_vs": vs})
    o16, o32 = res[f"c{i}_out16"], res[f"c{i}_out32"]
    print(f"case {i}: T={T} Hq={hq} Hkv={hkv} D={d} bs={bs}: tile 16 vs 32 bit-equal {np.mean(o16 == o32):.4f}",
          flush=True)

np.savez_compressed(os.path.join(out_dir, "triton_unified_attention.npz"), **res)
print("wrote", os.path.join(out_dir, "triton_unified_attention.npz"))

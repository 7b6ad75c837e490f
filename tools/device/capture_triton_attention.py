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
(bf16 bits: TILE 16 / 32). Decode-only cases also run vLLM's 3D split (16 segments of tiles of 16, each from M = -inf,
L = 1, then its reduce_segments: out = sum_s acc_s·exp(M_s − max) / sum_s L_s·exp(M_s − max), 0 if that sum is 0):
c<i>_out3d [T, Hq, D] uint16, and the segments' f32 results c<i>_segout [T, Hq, 16, D], c<i>_segmax / c<i>_segsum
[T, Hq, 16] (NaN where a segment is past the sequence; tests/data keeps the inputs and outputs, not these, which
served to try orders of the segment sum: every order gave the captured bf16 outputs). tests/python/test_attention_triton_capture.py reads it.
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
def tile_step(Q, M, L, acc, j, last, b, kvh, kc_ptr, vc_ptr, bt_ptr, k_scale, v_scale, scale, D: tl.constexpr,
              BS: tl.constexpr, HKV: tl.constexpr, MAXB: tl.constexpr, TILE: tl.constexpr):
    # one tile of TILE keys (keys >= last masked): dequantize K/V to bf16, S = scale·Q·K^T, the online-softmax update
    offs_d = tl.arange(0, D)
    kpos = j * TILE + tl.arange(0, TILE)
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
    acc += tl.dot(P.to(tl.bfloat16), V)
    return m_j, L, acc


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
    for j in range(0, num_tiles):
        M, L, acc = tile_step(Q, M, L, acc, j, last, b, kvh, kc_ptr, vc_ptr, bt_ptr, k_scale, v_scale, scale, D, BS,
                              HKV, MAXB, TILE)
    acc = acc / L[:, None]
    tl.store(out_ptr + (t * HQ + heads)[:, None] * D + offs_d[None, :], acc.to(tl.bfloat16), mask=row_ok[:, None])


@triton.jit
def attn3d_kernel(segout_ptr, segmax_ptr, segsum_ptr, q_ptr, kc_ptr, vc_ptr, bt_ptr, sl_ptr, tok_seq_ptr, k_scale,
                  v_scale, scale, HQ: tl.constexpr, G: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                  HKV: tl.constexpr, MAXB: tl.constexpr, TILE: tl.constexpr, BLOCK_M: tl.constexpr,
                  NSEG: tl.constexpr):
    # decode (one query per sequence, at its last position): segment `seg` of the sequence's tiles, as vLLM's 3D
    # kernel splits them: tiles_per_segment = cdiv(seq_len, NSEG * TILE); each segment from M = -inf, L = 1, acc = 0.
    t = tl.program_id(0)
    kvh = tl.program_id(1)
    seg = tl.program_id(2)
    b = tl.load(tok_seq_ptr + t)
    seq_len = tl.load(sl_ptr + b)
    tps = (seq_len + NSEG * TILE - 1) // (NSEG * TILE)
    rows = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    row_ok = rows < G
    heads = kvh * G + rows
    if seg * tps * TILE < seq_len:
        Q = tl.load(q_ptr + (t * HQ + heads)[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        M = tl.full([BLOCK_M], float("-inf"), tl.float32)
        L = tl.full([BLOCK_M], 1.0, tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        num_tiles = (seq_len + TILE - 1) // TILE
        for j in range(seg * tps, tl.minimum((seg + 1) * tps, num_tiles)):
            M, L, acc = tile_step(Q, M, L, acc, j, seq_len, b, kvh, kc_ptr, vc_ptr, bt_ptr, k_scale, v_scale, scale,
                                  D, BS, HKV, MAXB, TILE)
        o = (t * HQ + heads) * NSEG + seg
        tl.store(segout_ptr + o[:, None] * D + offs_d[None, :], acc, mask=row_ok[:, None])
        tl.store(segmax_ptr + o, M, mask=row_ok)
        tl.store(segsum_ptr + o, L, mask=row_ok)


@triton.jit
def reduce_kernel(out_ptr, segout_ptr, segmax_ptr, segsum_ptr, sl_ptr, tok_seq_ptr, HQ: tl.constexpr,
                  D: tl.constexpr, TILE: tl.constexpr, NSEG: tl.constexpr):
    # vLLM's reduce_segments: overall max, expsums and outputs rescaled by exp(segm_max - max), summed over segments
    t = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.load(tok_seq_ptr + t)
    seq_len = tl.load(sl_ptr + b)
    tps = (seq_len + NSEG * TILE - 1) // (NSEG * TILE)
    act = (seq_len + tps * TILE - 1) // (tps * TILE)
    segs = tl.arange(0, NSEG)
    smask = segs < act
    offs_d = tl.arange(0, D)
    o = (t * HQ + h) * NSEG + segs
    smax = tl.load(segmax_ptr + o, mask=smask, other=float("-inf"))
    mx = tl.max(smax)
    ssum = tl.load(segsum_ptr + o, mask=smask, other=0.0)
    ssum = ssum * tl.exp(smax - mx)
    total = tl.sum(ssum)
    sout = tl.load(segout_ptr + o[:, None] * D + offs_d[None, :], mask=smask[:, None], other=0.0)
    sout *= tl.exp(smax - mx)[:, None]
    accs = tl.sum(sout, axis=0)
    res = tl.where(total == 0.0, 0.0, accs / total)
    tl.store(out_ptr + (t * HQ + h) * D + offs_d, res.to(tl.bfloat16))


CASES = [  # seq_lens, q_lens, Hkv, Hq, D, block size
    ([300, 77, 1, 140], [1, 3, 1, 20], 2, 16, 128, 16),
    ([64, 200, 33], [1, 1, 33], 1, 8, 128, 16),
    ([500, 41], [1, 9], 2, 8, 64, 64),
    ([129, 95, 256], [1, 16, 1], 4, 16, 128, 16),
    # decode-only batches (vLLM's 3D kernel when q blocks x KV heads <= 128): out3d as well
    ([1000, 257, 31, 4096], [1, 1, 1, 1], 2, 16, 128, 16),
    ([2000, 600, 100], [1, 1, 1], 1, 8, 64, 64),
]
NSEG = 16

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
    if all(ql == 1 for ql in q_lens):
        segout = torch.zeros((T, hq, NSEG, d), dtype=torch.float32, device=dev)
        segmax = torch.full((T, hq, NSEG), float("nan"), dtype=torch.float32, device=dev)
        segsum = torch.full((T, hq, NSEG), float("nan"), dtype=torch.float32, device=dev)
        args = dict(HQ=hq, D=d, TILE=16, NSEG=NSEG)
        sl_d, ts_d = torch.tensor(seq_lens, dtype=torch.int32, device=dev), torch.from_numpy(tok_seq).to(dev)
        attn3d_kernel[(T, hkv, NSEG)](segout, segmax, segsum, q.to(dev), torch.from_numpy(kc).to(dev),
                                      torch.from_numpy(vc).to(dev), torch.from_numpy(bt).to(dev), sl_d, ts_d,
                                      float(ks[0]), float(vs[0]), float(scale), G=g, BS=bs, HKV=hkv, MAXB=maxb,
                                      BLOCK_M=max(16, triton.next_power_of_2(g)), **args)
        out = torch.empty((T, hq, d), dtype=torch.bfloat16, device=dev)
        reduce_kernel[(T, hq)](out, segout, segmax, segsum, sl_d, ts_d, **args)
        res[f"c{i}_out3d"] = out.cpu().view(torch.int16).numpy().view(np.uint16)
        res[f"c{i}_segout"] = segout.cpu().numpy()
        res[f"c{i}_segmax"] = segmax.cpu().numpy()
        res[f"c{i}_segsum"] = segsum.cpu().numpy()
        print(f"case {i}: 3D (16 segments) vs 2D tile 16 bit-equal {np.mean(res[f'c{i}_out3d'] == res[f'c{i}_out16']):.4f}")
    res.update({f"c{i}_q": q.view(torch.int16).numpy().view(np.uint16), f"c{i}_kc": kc, f"c{i}_vc": vc, f"c{i}_bt": bt,
                f"c{i}_sl": np.array(seq_lens, np.int32), f"c{i}_qsl": qsl, f"c{i}_ks": ks, f"c{i}_vs": vs})
    o16, o32 = res[f"c{i}_out16"], res[f"c{i}_out32"]
    print(f"case {i}: T={T} Hq={hq} Hkv={hkv} D={d} bs={bs}: tile 16 vs 32 bit-equal {np.mean(o16 == o32):.4f}",
          flush=True)

np.savez_compressed(os.path.join(out_dir, "triton_unified_attention.npz"), **res)
print("wrote", os.path.join(out_dir, "triton_unified_attention.npz"))

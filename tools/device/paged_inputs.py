"""Deterministic paged-attention decode inputs from a seed, in numpy alone (no torch, no FP8 cast), so that a GPU
capture can store only its outputs and the test regenerates the inputs bit for bit (capture_flashinfer_decode.py,
tests/python/test_attention_flashinfer_capture.py).

decode_case(seed, seq_lens, hkv, hq, d, page) -> dict of
  q [B, hq, d] uint16: bf16 bit patterns, random sign, exponent 2^-8 .. 2^0, random 7-bit mantissa;
  kc, vc [pages, page, hkv, d] uint8: e4m3fn codes, random sign, |value| <= 7.5 (codes 0x00 .. 0x4F, i.e. 2^-9 .. 7.5,
    zeros and subnormals included); every slot past a sequence 0x7F (a NaN code);
  indptr [B+1], indices [indptr[B]], last [B] int32: FlashInfer's CSR page table over shuffled pages (3 spare);
  ks, vs [1] float32: per-tensor scales 2^-k·(1 + f).
"""
import numpy as np


def decode_case(seed, seq_lens, hkv, hq, d, page):
    rng = np.random.Generator(np.random.PCG64(seed))
    B = len(seq_lens)
    need = [max((s + page - 1) // page, 1) for s in seq_lens]
    pages = sum(need) + 3
    indices_all = rng.permutation(pages).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(need)]).astype(np.int32)
    indices = indices_all[: indptr[-1]].copy()
    last = np.array([s - (n - 1) * page if s > 0 else 0 for s, n in zip(seq_lens, need)], np.int32)
    caches = []
    for _ in range(2):
        cache = np.full((pages, page, hkv, d), 0x7F, np.uint8)
        for b in range(B):
            codes = (rng.integers(0, 0x50, (seq_lens[b], hkv, d)) | (rng.integers(0, 2, (seq_lens[b], hkv, d)) << 7))
            for j in range(seq_lens[b]):
                cache[indices[indptr[b] + j // page], j % page] = codes[j].astype(np.uint8)
        caches.append(cache)
    sign = rng.integers(0, 2, (B, hq, d)).astype(np.uint16) << 15
    q = sign | (rng.integers(119, 128, (B, hq, d)).astype(np.uint16) << 7) | rng.integers(0, 128, (B, hq, d)).astype(
        np.uint16)
    ks = np.array([np.ldexp(1 + rng.integers(0, 256) / 256, -int(rng.integers(2, 5)))], np.float32)
    vs = np.array([np.ldexp(1 + rng.integers(0, 256) / 256, -int(rng.integers(2, 5)))], np.float32)
    return {"q": q, "kc": caches[0], "vc": caches[1], "indptr": indptr, "indices": indices, "last": last, "ks": ks,
            "vs": vs}

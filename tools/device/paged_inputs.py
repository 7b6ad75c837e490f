"""Deterministic paged-attention decode inputs from a seed, in numpy alone (no torch, no FP8 cast), so that a GPU
capture can store only its outputs and the test regenerates the inputs bit for bit (capture_flashinfer_decode.py,
capture_flashinfer_prefill.py, tests/python/test_attention_flashinfer_capture.py).

decode_case(seed, seq_lens, hkv, hq, d, page) -> dict of
  q [B, hq, d] uint16: bf16 bit patterns, random sign, exponent 2^-8 .. 2^0, random 7-bit mantissa;
  kc, vc [pages, page, hkv, d] uint8: e4m3fn codes, random sign, |value| <= 7.5 (codes 0x00 .. 0x4F, i.e. 2^-9 .. 7.5,
    zeros and subnormals included); every slot past a sequence 0x7F (a NaN code);
  indptr [B+1], indices [indptr[B]], last [B] int32: FlashInfer's CSR page table over shuffled pages (3 spare);
  ks, vs [1] float32: per-tensor scales 2^-k·(1 + f).

prefill_case(seed, seq_lens, q_lens, hkv, hq, d, page) -> the same dict for batch prefill / append
(capture_flashinfer_prefill.py): seq_lens are the KV lengths including each request's new chunk, q_lens the query
rows per request (1 <= q_len <= seq_len: causal, aligned bottom-right). Same draws in the same order as decode_case
(page permutation, K and V caches, q, k/v scales), only q has [qo_indptr[B], hq, d] rows (request b's rows are
qo_indptr[b] .. qo_indptr[b+1]-1, its last row the query of position seq_len - 1), and qo_indptr [B+1] int32 is
added. decode_case is prefill_case with one query a sequence (without qo_indptr).

dense_case(rng, seq_lens, q_lens, hkv, hq, d, bs, e4m3_codes, bf16_bits) -> the inputs of
capture_vllm_unified_attention.py (its draws, in its order): a dense block table bt [B, max pages + 4] over shuffled
pages (-1 past a sequence's), caches of e4m3_codes(normal(0, 3)) (unused slots 0x7F), q = bf16_bits(normal(0, 1))
[T, hq, d], qsl [B+1], ks, vs [1]. The casts are the caller's (torch on the device; ml_dtypes elsewhere: both RNE).
"""
import numpy as np


def decode_case(seed, seq_lens, hkv, hq, d, page):
    c = prefill_case(seed, seq_lens, [1] * len(seq_lens), hkv, hq, d, page)
    del c["qo_indptr"]
    return c


def prefill_case(seed, seq_lens, q_lens, hkv, hq, d, page):
    B = len(seq_lens)
    if len(q_lens) != B or any(not 1 <= q <= s for q, s in zip(q_lens, seq_lens)):
        raise ValueError("need 1 <= q_len <= seq_len for every request")
    rng = np.random.Generator(np.random.PCG64(seed))
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
            j = np.arange(seq_lens[b])
            cache[indices[indptr[b] + j // page], j % page] = codes.astype(np.uint8)
        caches.append(cache)
    qo_indptr = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    T = int(qo_indptr[-1])
    sign = rng.integers(0, 2, (T, hq, d)).astype(np.uint16) << 15
    q = sign | (rng.integers(119, 128, (T, hq, d)).astype(np.uint16) << 7) | rng.integers(0, 128, (T, hq, d)).astype(
        np.uint16)
    ks = np.array([np.ldexp(1 + rng.integers(0, 256) / 256, -int(rng.integers(2, 5)))], np.float32)
    vs = np.array([np.ldexp(1 + rng.integers(0, 256) / 256, -int(rng.integers(2, 5)))], np.float32)
    return {"q": q, "kc": caches[0], "vc": caches[1], "indptr": indptr, "indices": indices, "last": last, "ks": ks,
            "vs": vs, "qo_indptr": qo_indptr}


def dense_case(rng, seq_lens, q_lens, hkv, hq, d, bs, e4m3_codes, bf16_bits):
    B = len(seq_lens)
    need = [(s + bs - 1) // bs for s in seq_lens]
    nb = sum(need) + 3
    perm = rng.permutation(nb).astype(np.int32)
    starts = np.cumsum([0] + need)
    bt = np.full((B, max(need) + 4), -1, np.int32)  # (the kernels read entries up to a tile's end, past the pages)
    caches = [np.full((nb, bs, hkv, d), 0x7F, np.uint8) for _ in range(2)]
    for b in range(B):
        bt[b, :need[b]] = perm[starts[b]:starts[b + 1]]
        j = np.arange(seq_lens[b])
        for cache in caches:
            cache[bt[b, j // bs], j % bs] = e4m3_codes(rng.normal(0, 3, (seq_lens[b], hkv, d)))
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = bf16_bits(rng.normal(0, 1, (int(qsl[-1]), hq, d)))
    ks = np.array([np.ldexp(rng.uniform(1, 2), -int(rng.integers(3, 6)))], np.float32)
    vs = np.array([np.ldexp(rng.uniform(1, 2), -int(rng.integers(3, 6)))], np.float32)
    return {"q": q, "kc": caches[0], "vc": caches[1], "bt": bt, "qsl": qsl, "ks": ks, "vs": vs}

"""`fp8ref kv-cache-write` and `fp8ref paged-attention` against independent numpy + ml_dtypes oracles, written from
the step lists of include/fp8ref/attention.h and ../shared/research/paged-attention-conventions.md (not from the C++):

  kv-cache-write vllm-cuda  codes = RNE(clip(f32(x) / s, +-448)) (satfinite), via ml_dtypes — bit for bit
  kv-cache-write sglang     codes = ml_dtypes cast of bf16(f32(x) / s) (NaN past 464) — bit for bit
  paged-attention exact     dense softmax attention in float64 over the gathered cache — within 0.5 bf16 ulp
  paged-attention torch-sdpa-math against torch's CPU math SDPA, live, when `import torch` works — bit for bit
  paged-attention fast       NaN exactly in the rows where exact has NaN (a NaN query, a NaN code a row sees)
Bad input: out-of-range slots and block tables, wrong scale shapes: exit 2 and no output file.
"""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
E4 = ml_dtypes.float8_e4m3fn
BF16 = ml_dtypes.bfloat16


def bf16_bits(a):
    return np.asarray(a, dtype=np.float32).astype(BF16).view(np.uint16)


def from_bf16_bits(u):
    return u.view(BF16).astype(np.float32)


def random_cache(rng, nb, bs, h, d):
    codes = (rng.standard_normal((nb, bs, h, d)) * 3).astype(np.float32).astype(E4).view(np.uint8)
    return codes


@pytest.mark.parametrize("conv", ["vllm-cuda", "sglang"])
def test_kv_cache_write(fp8ref, tmp_path, conv):
    rng = np.random.default_rng(3)
    T, H, D, nb, bs = 12, 2, 32, 4, 8
    k = (rng.standard_normal((T, H, D)) * 4).astype(np.float32)
    k[0, 0, :4] = [300, -300, 1000, 1e-6]  # overflow under the scale below
    v = (rng.standard_normal((T, H, D)) * 4).astype(np.float32)
    kb, vb = bf16_bits(k), bf16_bits(v)
    slots = np.array([5, 0, -1, 31, 7, 8, 9, -1, 12, 1, 2, 3], dtype=np.int64)
    kc = random_cache(rng, nb, bs, H, D)
    vc = random_cache(rng, nb, bs, H, D)
    ks = np.array([0.5], dtype=np.float32)
    vs = np.array([0.125], dtype=np.float32)
    for name, arr in [("k", kb), ("v", vb), ("slots", slots), ("kc", kc), ("vc", vc), ("ks", ks), ("vs", vs)]:
        np.save(tmp_path / f"{name}.npy", arr)
    r = fp8ref("kv-cache-write", "--convention", conv, "--model", "bf16", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy",
               "--slot-mapping", tmp_path / "slots.npy", "--k-cache", tmp_path / "kc.npy", "--v-cache", tmp_path / "vc.npy",
               "--k-scale", tmp_path / "ks.npy", "--v-scale", tmp_path / "vs.npy",
               "--out-k-cache", tmp_path / "ok.npy", "--out-v-cache", tmp_path / "ov.npy")
    assert r.returncode == 0, r.stderr
    for x_bits, cache, s, out in [(kb, kc, ks[0], "ok"), (vb, vc, vs[0], "ov")]:
        want = cache.copy()
        x = from_bf16_bits(x_bits)
        q = x / np.float32(s)  # f32 IEEE division
        if conv == "vllm-cuda":
            codes = np.clip(q, -448, 448).astype(E4).view(np.uint8)
        else:
            codes = q.astype(BF16).astype(np.float32).astype(E4).view(np.uint8)  # ml_dtypes: NaN past 464
        for t, slot in enumerate(slots):
            if slot >= 0:
                want[slot // bs, slot % bs] = codes[t]
        got = np.load(tmp_path / f"{out}.npy")
        np.testing.assert_array_equal(got, want)


def attention_inputs(tmp_path, rng, seq_lens, q_lens, H, Hq, D, bs, md="bf16"):
    need = [(s + bs - 1) // bs for s in seq_lens]
    nb = sum(need) + 2
    perm = rng.permutation(nb).astype(np.int32)
    bt = -np.ones((len(seq_lens), max(need) + 1), dtype=np.int32)
    n = 0
    for b, k in enumerate(need):
        bt[b, :k] = perm[n:n + k]
        n += k
    kc = random_cache(rng, nb, bs, H, D)
    vc = random_cache(rng, nb, bs, H, D)
    T = sum(q_lens)
    q = (rng.standard_normal((T, Hq, D))).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    ks = np.array([0.0625], dtype=np.float32)
    vs = np.array([0.09375], dtype=np.float32)
    qarr = bf16_bits(q) if md == "bf16" else q
    files = dict(q=qarr, qsl=qsl, kc=kc, vc=vc, ks=ks, vs=vs, bt=bt, sl=np.array(seq_lens, dtype=np.int32))
    for name, arr in files.items():
        np.save(tmp_path / f"{name}.npy", arr)
    return files


def run_attention(fp8ref, tmp_path, conv, md="bf16", extra=()):
    return fp8ref("paged-attention", "--convention", conv, "--md", md, "--q", tmp_path / "q.npy",
                  "--query-start-loc", tmp_path / "qsl.npy", "--k-cache", tmp_path / "kc.npy", "--v-cache",
                  tmp_path / "vc.npy", "--k-scale", tmp_path / "ks.npy", "--v-scale", tmp_path / "vs.npy",
                  "--block-table", tmp_path / "bt.npy", "--seq-lens", tmp_path / "sl.npy", "-o", tmp_path / "out.npy",
                  *extra)


def gather(cache, bt_row, seq_len, bs):
    return np.stack([cache[bt_row[j // bs], j % bs] for j in range(seq_len)]) if seq_len else cache[:0, 0]


@pytest.mark.parametrize("unquantized_chunk", [False, True])
def test_paged_attention_exact_against_numpy(fp8ref, tmp_path, unquantized_chunk):
    rng = np.random.default_rng(5)
    seq_lens, q_lens, H, Hq, D, bs = [37, 20, 16], [1, 4, 16], 2, 8, 64, 16
    f = attention_inputs(tmp_path, rng, seq_lens, q_lens, H, Hq, D, bs)
    extra = ()
    if unquantized_chunk:  # the query rows' own K/V, bf16, used instead of the cache for the chunk's keys
        knew = bf16_bits(rng.standard_normal((sum(q_lens), H, D)) * 0.3)
        vnew = bf16_bits(rng.standard_normal((sum(q_lens), H, D)) * 0.3)
        np.save(tmp_path / "knew.npy", knew)
        np.save(tmp_path / "vnew.npy", vnew)
        extra = ("--k-new", tmp_path / "knew.npy", "--v-new", tmp_path / "vnew.npy")
    r = run_attention(fp8ref, tmp_path, "exact", extra=extra)
    assert r.returncode == 0, r.stderr
    got = from_bf16_bits(np.load(tmp_path / "out.npy")).astype(np.float64)
    q = from_bf16_bits(f["q"]).astype(np.float64)
    G = Hq // H
    sm = 1 / np.sqrt(D)
    row = 0
    for b, (S, L) in enumerate(zip(seq_lens, q_lens)):
        K = gather(f["kc"], f["bt"][b], S, bs).view(E4).astype(np.float64) * float(f["ks"][0])
        V = gather(f["vc"], f["bt"][b], S, bs).view(E4).astype(np.float64) * float(f["vs"][0])
        if unquantized_chunk and L:
            K[S - L:] = from_bf16_bits(knew[row:row + L])
            V[S - L:] = from_bf16_bits(vnew[row:row + L])
        for i in range(L):
            for h in range(Hq):
                kv = h // G
                vis = np.arange(S) <= S - L + i  # bottom-right causal
                logits = sm * (K[vis, kv] @ q[row + i, h])
                p = np.exp(logits - logits.max())
                o = (p @ V[vis, kv]) / p.sum()
                ulp = np.exp2(np.floor(np.log2(np.maximum(np.abs(o), 1e-30))) - 7)
                assert np.all(np.abs(got[row + i, h] - o) <= 0.5 * ulp + 1e-12), (b, i, h)
        row += L


@pytest.mark.parametrize("conv", ["vllm-paged-v1", "vllm-triton-unified", "flashinfer", "spyre"])
def test_paged_attention_cpu_equals_reference(fp8ref, tmp_path, conv):
    rng = np.random.default_rng(8)
    attention_inputs(tmp_path, rng, [45, 7, 16], [1, 7, 3], 2, 8, 64, 16)
    outs = []
    for backend in ["cpu", "reference"]:
        r = run_attention(fp8ref, tmp_path, conv, extra=("--backend", backend))
        assert r.returncode == 0, r.stderr
        outs.append(np.load(tmp_path / "out.npy"))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.isnan(from_bf16_bits(outs[0])).any()


def test_paged_attention_fast_nan_rows_as_exact(fp8ref, tmp_path):
    # The CPU fallback must not hide a NaN: a NaN query element or a NaN code in a key a row sees makes that row NaN,
    # as in exact (before the NaN policy, fast gave such a row as zeros); every other row stays finite.
    rng = np.random.default_rng(12)
    f = attention_inputs(tmp_path, rng, [40, 25], [1, 3], 2, 8, 64, 16)
    q = f["q"].copy()
    q[2, 5, 11] = 0x7FC0  # token 2 (sequence 1, position 23), q head 5 (KV head 1): NaN
    np.save(tmp_path / "q.npy", q)
    kc = f["kc"].copy()
    kc[f["bt"][0][33 // 16], 33 % 16, 0, 3] = 0x7F  # sequence 0, key 33, KV head 0: a NaN code
    np.save(tmp_path / "kc.npy", kc)
    outs = {}
    for conv in ["exact", "fast"]:
        r = run_attention(fp8ref, tmp_path, conv)
        assert r.returncode == 0, r.stderr
        outs[conv] = np.isnan(from_bf16_bits(np.load(tmp_path / "out.npy")))
    want = np.zeros((4, 8, 64), dtype=bool)
    want[2, 5] = True      # the NaN query's row
    want[0, 0:4] = True    # sequence 0's decode token sees key 33: q heads 0..3 of KV head 0
    np.testing.assert_array_equal(outs["exact"], want)
    np.testing.assert_array_equal(outs["fast"], want)


def test_paged_attention_torch_sdpa_math_live(fp8ref, tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    seq_lens, q_lens, H, Hq, D, bs = [29, 9], [5, 1], 1, 4, 64, 16
    f = attention_inputs(tmp_path, rng, seq_lens, q_lens, H, Hq, D, bs)
    lanes = 16 if torch.backends.cpu.get_cpu_capability() == "AVX512" else 8
    r = run_attention(fp8ref, tmp_path, "torch-sdpa-math", extra=("--torch-lanes", lanes))
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npy")
    torch.set_num_threads(1)
    q = torch.from_numpy(f["q"].view(np.int16)).view(torch.bfloat16)
    row = 0
    for b, (S, L) in enumerate(zip(seq_lens, q_lens)):
        kc = torch.from_numpy(gather(f["kc"], f["bt"][b], S, bs)).view(torch.float8_e4m3fn)
        vc = torch.from_numpy(gather(f["vc"], f["bt"][b], S, bs)).view(torch.float8_e4m3fn)
        K = (kc.to(torch.float32) * torch.tensor(float(f["ks"][0]))).to(torch.bfloat16)
        V = (vc.to(torch.float32) * torch.tensor(float(f["vs"][0]))).to(torch.bfloat16)
        Q4 = q[row:row + L].permute(1, 0, 2).unsqueeze(0)
        K4 = K.permute(1, 0, 2).repeat_interleave(Hq // H, dim=0).unsqueeze(0)
        V4 = V.permute(1, 0, 2).repeat_interleave(Hq // H, dim=0).unsqueeze(0)
        mask = torch.arange(S).unsqueeze(0) <= torch.arange(L).unsqueeze(1) + (S - L)
        fmask = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))
        out, _ = torch.ops.aten._scaled_dot_product_attention_math(Q4, K4, V4, attn_mask=fmask)
        want = out[0].permute(1, 0, 2).contiguous().view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(got[row:row + L], want)
        row += L


@pytest.mark.parametrize("option,value,needle", [
    ("--window-left", "nan", "whole number"), ("--window-left", "1e30", "whole number"),
    ("--window-left", "-5", "whole number"), ("--window-left", "1.5", "whole number"),
    ("--window-left", "99999999999999999999", "whole number"), ("--head-dim-v", "16.9", "whole number"),
    ("--head-dim-v", "0", "whole number"), ("--torch-lanes", "inf", "whole number"),
    ("--softcap", "nan", "--softcap"), ("--softcap", "-1", "--softcap"), ("--sm-scale", "inf", "--sm-scale"),
])
def test_bad_numeric_options_exit_2(fp8ref, tmp_path, option, value, needle):
    rng = np.random.default_rng(7)
    attention_inputs(tmp_path, rng, [20, 5], [1, 1], 2, 4, 32, 8)
    r = run_attention(fp8ref, tmp_path, "exact", extra=(option, value))
    assert r.returncode == 2 and needle in r.stderr and value in r.stderr, r.stderr
    assert not (tmp_path / "out.npy").exists()
    ok = run_attention(fp8ref, tmp_path, "exact", extra=("--window-left", "4"))
    assert ok.returncode == 0, ok.stderr


def assert_refused(fp8ref, tmp_path, refusals):
    """Each (convention, extra options, needle): exit 2, the needle in stderr, no output written."""
    for conv, extra, needle in refusals:
        r = run_attention(fp8ref, tmp_path, conv, extra=extra)
        assert r.returncode == 2 and needle in r.stderr, (conv, extra, r.stderr)
        assert not (tmp_path / "out.npy").exists()


def test_tile_option(fp8ref, tmp_path):
    """--tile: vllm-triton-unified defaults to 32 keys per softmax tile in a batch with a prefill (vLLM's 2D kernel),
    16 gives other bits; a tile that is not a multiple of 16 in [16, 256], segments that are not a power of two, or
    either for a convention without them, exit 2 writing nothing."""
    rng = np.random.default_rng(11)
    attention_inputs(tmp_path, rng, [300, 77], [1, 9], 2, 8, 64, 16)
    outs = {}
    for tile in (None, "32", "16", "0"):
        r = run_attention(fp8ref, tmp_path, "vllm-triton-unified", extra=("--tile", tile) if tile else ())
        assert r.returncode == 0, r.stderr
        outs[tile] = np.load(tmp_path / "out.npy")
    assert np.array_equal(outs[None], outs["32"]) and not np.array_equal(outs["16"], outs["32"])
    assert np.array_equal(outs[None], outs["0"])  # 0 and -1 name the defaults, as the messages say
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified", extra=("--segments", "-1"))
    assert r.returncode == 0 and np.array_equal(np.load(tmp_path / "out.npy"), outs[None]), r.stderr
    (tmp_path / "out.npy").unlink()
    refusals = (("vllm-triton-unified", ("--tile", "24"), "multiple of 16"),
                ("flashinfer", ("--tile", "512"), "multiple of 16"),
                ("exact", ("--tile", "32"), "has no tile size"),
                ("vllm-triton-unified", ("--segments", "3"), "power of two"),
                ("flashinfer", ("--segments", "16"), "has no segments"),
                ("flashinfer", ("--kv-chunk", "-2"), "--kv-chunk needs a whole number in [-1"),
                ("vllm-triton-unified", ("--kv-chunk", "128"), "has no split-KV chunk"),
                ("flashinfer", ("--cta-tile-q", "32"), "cta_tile_q must be 16, 64 or 128"),
                ("flashinfer", ("--fi-kernel", "both"), "--fi-kernel is auto, prefill or decode"),
                ("flashinfer", ("--prefill-kv-chunk", "-2"), "--prefill-kv-chunk needs a whole number in [-1"),
                ("vllm-triton-unified", ("--fi-kernel", "prefill"), "has no FlashInfer kernel choice"),
                ("exact", ("--cta-tile-q", "64"), "has no FlashInfer kernel choice"))
    assert_refused(fp8ref, tmp_path, refusals)


def test_fi_kernel_option(fp8ref, tmp_path):
    """flashinfer runs a sequence with a prefill chunk through FlashInfer's tensor-core prefill kernel by default
    (--fi-kernel auto) and a decode token through its CUDA-core decode kernel; prefill / decode force one kernel for
    every sequence. Where the prefill kernel does not exist (head dim 32 here), auto keeps the decode kernel's steps
    and prefill is refused (exit 2, nothing written)."""
    rng = np.random.default_rng(21)
    attention_inputs(tmp_path, rng, [300, 77, 150], [9, 1, 30], 2, 8, 64, 16)
    outs = {}
    for k in ("auto", "prefill", "decode"):
        r = run_attention(fp8ref, tmp_path, "flashinfer", extra=("--fi-kernel", k))
        assert r.returncode == 0, r.stderr
        outs[k] = np.load(tmp_path / "out.npy").reshape(40, 8, 64)
    rows = {"prefill": np.r_[0:9, 10:40], "decode": np.r_[9:10]}  # the sequences' rows in the output
    assert np.array_equal(outs["auto"][rows["decode"]], outs["decode"][rows["decode"]])
    # (the prefill kernel's plan covers the prefill sequences alone under auto, every sequence under prefill)
    assert np.mean(outs["auto"][rows["prefill"]] == outs["decode"][rows["prefill"]]) < 0.8
    assert np.mean(outs["prefill"][rows["decode"]] == outs["decode"][rows["decode"]]) < 0.8
    r = run_attention(fp8ref, tmp_path, "flashinfer")
    assert r.returncode == 0 and np.array_equal(np.load(tmp_path / "out.npy").reshape(40, 8, 64), outs["auto"])
    (tmp_path / "out.npy").unlink()
    attention_inputs(tmp_path, rng, [100, 40], [5, 1], 2, 4, 32, 16)
    auto = run_attention(fp8ref, tmp_path, "flashinfer")
    assert auto.returncode == 0, auto.stderr
    a = np.load(tmp_path / "out.npy")
    dec = run_attention(fp8ref, tmp_path, "flashinfer", extra=("--fi-kernel", "decode"))
    assert dec.returncode == 0 and np.array_equal(np.load(tmp_path / "out.npy"), a)
    (tmp_path / "out.npy").unlink()
    assert_refused(fp8ref, tmp_path, (("flashinfer", ("--fi-kernel", "prefill"), "prefill kernel takes head dims 64"),))


def test_segments_option_follows_vllms_launch(fp8ref, tmp_path):
    """vllm-triton-unified by default runs what vLLM would: a small decode-only batch in the 3D kernel (16 segments,
    tiles of 16), a batch with a prefill chunk in the 2D kernel (one pass, tiles of 32)."""
    rng = np.random.default_rng(12)
    for q_lens, want in (([1, 1, 1], ("--segments", "16")), ([1, 5, 1], ("--segments", "0"))):
        attention_inputs(tmp_path, rng, [1000, 300, 77], q_lens, 2, 8, 64, 16)
        outs = {}
        for extra in ((), ("--segments", "16"), ("--segments", "0")):
            r = run_attention(fp8ref, tmp_path, "vllm-triton-unified", extra=extra)
            assert r.returncode == 0, r.stderr
            outs[extra] = np.load(tmp_path / "out.npy")
        other = ("--segments", "0") if want[1] == "16" else ("--segments", "16")
        assert np.array_equal(outs[()], outs[want]) and not np.array_equal(outs[()], outs[other]), q_lens


def test_kv_chunk_option_follows_flashinfers_plan(fp8ref, tmp_path):
    """flashinfer by default splits the KV as FlashInfer's DecodePlan does on an H100/H200, over the sequences that
    run its decode kernel: a small batch of long decode sequences in chunks of 128 keys (also beside a prefill chunk,
    which runs the prefill kernel, as vLLM plans its two wrappers apart); a batch of short sequences in one pass, and
    so one whose prefill rows take the decode kernel's steps too (--fi-kernel decode)."""
    rng = np.random.default_rng(13)
    for seq_lens, q_lens, kernel, want in (([1000, 300, 77], [1, 1, 1], (), "128"),
                                           ([1000, 300, 77], [1, 5, 1], (), "128"),
                                           ([1000, 300, 77], [1, 5, 1], ("--fi-kernel", "decode"), "0"),
                                           ([100, 60, 7], [1, 1, 1], (), "0")):
        attention_inputs(tmp_path, rng, seq_lens, q_lens, 2, 8, 64, 16)
        outs = {}
        for extra in ((), ("--kv-chunk", "128"), ("--kv-chunk", "0"), ("--kv-chunk", "-1")):
            r = run_attention(fp8ref, tmp_path, "flashinfer", extra=(*kernel, *extra))
            assert r.returncode == 0, r.stderr
            outs[extra] = np.load(tmp_path / "out.npy")
        assert np.array_equal(outs[()], outs[("--kv-chunk", want)]), (seq_lens, q_lens)
        assert np.array_equal(outs[()], outs[("--kv-chunk", "-1")])
        if seq_lens[0] > 128:  # (a sequence of one chunk is the same either way)
            other = ("--kv-chunk", "0") if want == "128" else ("--kv-chunk", "128")
            assert not np.array_equal(outs[()], outs[other]), (seq_lens, q_lens)


def test_bad_input_exit_2_nothing_written(fp8ref, tmp_path):
    rng = np.random.default_rng(7)
    f = attention_inputs(tmp_path, rng, [20, 5], [1, 1], 2, 4, 32, 8)
    bt = f["bt"].copy()
    bt[0, 0] = 10_000  # past the cache
    np.save(tmp_path / "bt.npy", bt)
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified")
    assert r.returncode == 2 and "outside the cache" in r.stderr, r.stderr
    assert not (tmp_path / "out.npy").exists()
    np.save(tmp_path / "bt.npy", f["bt"])
    np.save(tmp_path / "sl.npy", np.array([2000, 5], dtype=np.int32))  # longer than the table covers
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified")
    assert r.returncode == 2 and "table covers" in r.stderr, r.stderr
    np.save(tmp_path / "sl.npy", f["sl"][:1])  # one entry for two sequences: both files named
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified")
    assert r.returncode == 2 and "seq_lens has 1 entries, expected B = 2 (B from" in r.stderr and "qsl.npy" in r.stderr, r.stderr
    np.save(tmp_path / "sl.npy", f["sl"])
    np.save(tmp_path / "ks.npy", np.array([1.0, 1.0], dtype=np.float32))  # wrong scale shape
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified")
    assert r.returncode == 2 and "k_scale" in r.stderr, r.stderr
    for bad in (0.0, -1.0, np.nan, np.inf):  # a scale that is not positive and finite
        np.save(tmp_path / "ks.npy", np.full_like(f["ks"], bad))
        r = run_attention(fp8ref, tmp_path, "exact")
        assert r.returncode == 2 and "k_scale[0]" in r.stderr and "positive and finite" in r.stderr, r.stderr
    np.save(tmp_path / "ks.npy", f["ks"])
    np.save(tmp_path / "q.npy", bf16_bits(rng.standard_normal((2, 3, 32))))  # Hq 3 not a multiple of Hkv 2
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified")
    assert r.returncode == 2 and "multiple" in r.stderr, r.stderr
    assert not (tmp_path / "out.npy").exists()
    # kv-cache-write: a slot past the cache
    np.save(tmp_path / "k.npy", bf16_bits(np.ones((2, 2, 32))))
    np.save(tmp_path / "slots.npy", np.array([0, 10_000], dtype=np.int64))
    r = fp8ref("kv-cache-write", "--convention", "vllm-cuda", "--model", "bf16", "--k", tmp_path / "k.npy",
               "--v", tmp_path / "k.npy", "--slot-mapping", tmp_path / "slots.npy", "--k-cache", tmp_path / "kc.npy",
               "--v-cache", tmp_path / "vc.npy", "--k-scale", tmp_path / "ks.npy", "--v-scale", tmp_path / "vs.npy",
               "--out-k-cache", tmp_path / "ok.npy", "--out-v-cache", tmp_path / "ov.npy")
    assert r.returncode == 2 and "past the cache" in r.stderr, r.stderr
    assert not (tmp_path / "ok.npy").exists() and not (tmp_path / "ov.npy").exists()
    # a --query-start-loc that does not cover the tokens, even where the scales are not per sequence
    np.save(tmp_path / "slots.npy", np.array([0, 1], dtype=np.int64))
    np.save(tmp_path / "qsl.npy", np.array([0, 1], dtype=np.int32))
    r = fp8ref("kv-cache-write", "--convention", "vllm-cuda", "--model", "bf16", "--k", tmp_path / "k.npy",
               "--v", tmp_path / "k.npy", "--slot-mapping", tmp_path / "slots.npy", "--k-cache", tmp_path / "kc.npy",
               "--v-cache", tmp_path / "vc.npy", "--k-scale", tmp_path / "ks.npy", "--v-scale", tmp_path / "vs.npy",
               "--query-start-loc", tmp_path / "qsl.npy", "--out-k-cache", tmp_path / "ok.npy", "--out-v-cache", tmp_path / "ov.npy")
    assert r.returncode == 2 and "query_start_loc" in r.stderr, r.stderr
    assert not (tmp_path / "ok.npy").exists()


def test_out_scale_option(fp8ref, tmp_path):
    """--out-scale: vllm-triton-unified's fused output quantization (vLLM's output_scale) writes e4m3fn codes, the
    f32 run's outputs quantized as Triton does (clamp(RN32(o·RN32(1/S)), ±448), RNE); other conventions, an out dtype
    other than e4m3fn, e4m3fn without a scale, or a scale that is not positive and finite exit 2 writing nothing."""
    import ml_dtypes
    rng = np.random.default_rng(12)
    attention_inputs(tmp_path, rng, [300, 77], [1, 9], 2, 8, 64, 16)
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified", extra=("--out-dtype", "f32"))
    assert r.returncode == 0, r.stderr
    o = np.load(tmp_path / "out.npy")
    scale = 0.0123
    r = run_attention(fp8ref, tmp_path, "vllm-triton-unified", extra=("--out-scale", str(scale)))
    assert r.returncode == 0, r.stderr
    got = np.load(tmp_path / "out.npy")
    assert got.dtype == np.uint8 and got.shape == o.shape
    inv = np.float32(1) / np.float32(scale)
    want = np.clip(o * inv, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(got, want)
    (tmp_path / "out.npy").unlink()
    refusals = (("flashinfer", ("--out-scale", "0.5"), "no fused output quantization"),
                ("vllm-triton-unified", ("--out-scale", "0.5", "--out-dtype", "bf16"), "e4m3fn"),
                ("vllm-triton-unified", ("--out-dtype", "e4m3fn"), "needs an out scale"),
                ("vllm-triton-unified", ("--out-scale", "-1"), "--out-scale"),
                ("vllm-triton-unified", ("--out-scale", "inf"), "--out-scale"))
    assert_refused(fp8ref, tmp_path, refusals)

"""`fp8ref quantize --scale-layout` / `dequantize --scale-layout` from the shell: each stored layout equals a numpy
transform of the row-major scales (col-major = transpose; tma-aligned = transpose with the rows padded to 16 bytes of
the scales' storage in the stack, pads 0; packed-ue8m0 = int32 words whose byte j is the E8M0 code of group 4p+j), static quantization
and dequantization read the layouts back, and bad scale files exit 2 writing nothing."""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")


def quantize(fp8ref, tmp_path, x, *extra, src="f32", check=True, out="s.npy"):
    np.save(tmp_path / "x.npy", x)
    r = fp8ref("quantize", "--from", src, "--to", "e4m3fn", *extra, tmp_path / "x.npy", tmp_path / "q.npy",
               tmp_path / out)
    if check:
        assert r.returncode == 0, r.stderr
        return np.load(tmp_path / "q.npy"), np.load(tmp_path / out)
    return r


def rows(M=30, K=512, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 20, size=(M, 1)))).astype(np.float32)


def pad_rows(a_t, align):
    """[C, R] -> [C, align(R)], zero pads."""
    C, R = a_t.shape
    out = np.zeros((C, -(-R // align) * align), dtype=a_t.dtype)
    out[:, :R] = a_t
    return out


@pytest.mark.parametrize("convention,extra", [("vllm-group", ()), ("exact", ("--scale-dtype", "bf16")),
                                              ("sglang-triton", ()), ("exact", ("--scale-dtype", "f16"))])
def test_col_major_and_tma_aligned_are_transposes(fp8ref, tmp_path, convention, extra):
    x = rows()
    q0, s0 = quantize(fp8ref, tmp_path, x, "--convention", convention, *extra, "--scale-layout", "row-major")
    q1, s1 = quantize(fp8ref, tmp_path, x, "--convention", convention, *extra, "--scale-layout", "col-major")
    q2, s2 = quantize(fp8ref, tmp_path, x, "--convention", convention, *extra, "--scale-layout", "tma-aligned")
    assert np.array_equal(q0, q1) and np.array_equal(q0, q2)
    assert s1.shape == (4, 30) and np.array_equal(s1.view(np.uint32), s0.T.view(np.uint32))
    align = 8 if "bf16" in extra or "f16" in extra else 4      # 16 bytes of the scale dtype
    assert s2.shape == (4, -(-30 // align) * align)
    assert np.array_equal(s2.view(np.uint32), pad_rows(s0.T.copy(), align).view(np.uint32))
    # static quantization reads the layout back
    np.save(tmp_path / "s_in.npy", s2)
    r = fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", convention, *extra,
               "--scale-layout", "tma-aligned", "--static", tmp_path / "s_in.npy", tmp_path / "x.npy", tmp_path / "q2.npy")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "q2.npy"), q0)


@pytest.mark.parametrize("convention,align", [("deepgemm", 4), ("vllm-group", 4), ("sgl-kernel", 16)])
@pytest.mark.parametrize("codes", [False, True])
def test_ue8m0_tma_aligned_pads_as_the_stack_stores_and_reads_back(fp8ref, tmp_path, convention, align, codes):
    # ue8m0 scales pad to 16 bytes of their storage in the stack: f32-held (DeepGEMM, vLLM) 4 rows, E8M0 bytes 16;
    # dequantize reads either padding without further flags, equal to the row-major round trip
    x = rows(M=5, K=256)
    flags = ("--convention", convention, "--scale-dtype", "ue8m0") + (("--scale-codes",) if codes else ())
    q0, s0 = quantize(fp8ref, tmp_path, x, *flags, "--scale-layout", "row-major", out="s0.npy")
    q1, s1 = quantize(fp8ref, tmp_path, x, *flags, "--scale-layout", "tma-aligned", out="s1.npy")
    assert np.array_equal(q0, q1)
    assert s1.shape == (2, -(-5 // align) * align) and s1.dtype == (np.uint8 if codes else np.float32)
    assert np.array_equal(s1[:, :5], s0.T) and np.all(s1[:, 5:] == 0)
    deq = ["dequantize", "--from", "e4m3fn", "--granularity", "group:128", "--scale-dtype", "ue8m0"]
    deq += ["--scale-codes"] if codes else []
    r0 = fp8ref(*deq, tmp_path / "q.npy", tmp_path / "s0.npy", tmp_path / "o0.npy")
    r1 = fp8ref(*deq, "--scale-layout", "tma-aligned", tmp_path / "q.npy", tmp_path / "s1.npy", tmp_path / "o1.npy")
    assert r0.returncode == 0 and r1.returncode == 0, r0.stderr + r1.stderr
    assert np.array_equal(np.load(tmp_path / "o0.npy"), np.load(tmp_path / "o1.npy"))


def test_bf16_scales_pad_to_8_rows(fp8ref, tmp_path):
    _, s = quantize(fp8ref, tmp_path, rows(M=10), "--convention", "exact", "--scale-dtype", "bf16",
                    "--scale-layout", "tma-aligned")
    assert s.shape == (4, 16)
    assert np.all(s[:, 10:] == 0)


def test_packed_ue8m0_words(fp8ref, tmp_path):
    x = rows(M=30, K=5 * 128)  # 5 groups: two words per row, the second holds one code
    _, codes = quantize(fp8ref, tmp_path, x, "--convention", "exact", "--scale-dtype", "ue8m0", "--scale-codes")
    _, words = quantize(fp8ref, tmp_path, x, "--convention", "exact", "--scale-dtype", "ue8m0",
                        "--scale-layout", "packed-ue8m0")
    assert words.dtype == np.int32 and words.shape == (2, 32)
    w = words.view(np.uint32)
    for p in range(2):
        for j in range(4):
            g = 4 * p + j
            want = codes[:, g].astype(np.uint32) if g < 5 else np.zeros(30, dtype=np.uint32)
            assert np.array_equal((w[p, :30] >> (8 * j)) & 0xFF, want), (p, j)
    assert np.all(w[:, 30:] == 0)
    # sgl-kernel writes packed words by default for ue8m0, sglang-triton-colmajor holds f32 powers of two: packed
    # from their exponent fields gives the same words
    _, w2 = quantize(fp8ref, tmp_path, x, "--convention", "sglang-triton-colmajor", "--scale-dtype", "ue8m0",
                     "--scale-layout", "packed-ue8m0")
    _, f = quantize(fp8ref, tmp_path, x, "--convention", "sglang-triton-colmajor", "--scale-dtype", "ue8m0",
                    "--scale-layout", "row-major")
    e = (f.view(np.uint32) >> 23) & 0xFF
    assert np.array_equal(w2.view(np.uint32)[0, :30] & 0xFF, e[:, 0])
    # static quantization reads the words (sgl-kernel ue8m0: packed by default, its multiplier built from the codes)
    q_dyn, w_dyn = quantize(fp8ref, tmp_path, x, "--convention", "sgl-kernel", "--scale-dtype", "ue8m0")
    np.save(tmp_path / "w_in.npy", w_dyn)
    r = fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", "sgl-kernel", "--scale-dtype", "ue8m0",
               "--static", tmp_path / "w_in.npy", tmp_path / "x.npy", tmp_path / "q_st.npy")
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "q_st.npy"), q_dyn)
    # dequantize reads the words
    np.save(tmp_path / "q1.npy", np.full(x.shape, 0x38, dtype=np.uint8))  # 1.0
    np.save(tmp_path / "w.npy", words)
    r = fp8ref("dequantize", "--from", "e4m3fn", "--granularity", "group:128", "--scale-dtype", "ue8m0",
               "--scale-layout", "packed-ue8m0", tmp_path / "q1.npy", tmp_path / "w.npy", tmp_path / "y.npy")
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy")
    assert np.array_equal(y[:, ::128], np.ldexp(1.0, codes.astype(np.int64) - 127).astype(np.float32))


def test_bad_scale_files_exit_2_and_write_nothing(fp8ref, tmp_path):
    x = rows()
    np.save(tmp_path / "x.npy", x)
    _, s_row = quantize(fp8ref, tmp_path, x, "--convention", "vllm-group")

    def static(scales, *extra):
        np.save(tmp_path / "s_in.npy", scales)
        out = tmp_path / "q_out.npy"
        r = fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", "vllm-group", *extra,
                   "--static", tmp_path / "s_in.npy", tmp_path / "x.npy", out)
        assert r.returncode == 2, (extra, r.returncode, r.stdout, r.stderr)
        assert not out.exists()
        return r.stderr

    # the logical row-major tensor where the layout is tma-aligned: names both shapes
    err = static(s_row, "--scale-layout", "tma-aligned")
    assert "(4, 32)" in err and "tma-aligned" in err and "(30, 4)" in err
    # transposed but not padded
    assert "(4, 32)" in static(s_row.T.copy(), "--scale-layout", "tma-aligned")
    # packed words must be int32, and need ue8m0 scales
    assert "int32" in static(np.zeros((1, 32), dtype=np.float32), "--scale-dtype", "ue8m0", "--scale-layout", "packed-ue8m0")
    assert "ue8m0" in static(np.zeros((1, 32), dtype=np.int32), "--scale-layout", "packed-ue8m0")
    assert "unknown scale-layout" in static(s_row, "--scale-layout", "column-major")
    # a layout on rank-1 data
    np.save(tmp_path / "x1.npy", x[0])
    r = fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", "vllm-group", "--scale-layout",
               "col-major", tmp_path / "x1.npy", tmp_path / "q1.npy", tmp_path / "s1.npy")
    assert r.returncode == 2 and "rank >= 2" in r.stderr
    assert not (tmp_path / "q1.npy").exists() and not (tmp_path / "s1.npy").exists()
    # --scale-codes with packed words
    r = quantize(fp8ref, tmp_path, x, "--convention", "sgl-kernel", "--scale-dtype", "ue8m0", "--scale-codes",
                 check=False, out="s2.npy")
    assert r.returncode == 2 and "int32 words" in r.stderr and not (tmp_path / "s2.npy").exists()


def test_empty_tensors_have_empty_stored_scales(fp8ref, tmp_path):
    x = np.zeros((0, 256), dtype=np.float32)
    q, s = quantize(fp8ref, tmp_path, x, "--convention", "sgl-kernel", "--scale-dtype", "ue8m0")
    assert q.shape == (0, 256) and s.shape == (1, 0) and s.dtype == np.int32
    _, s = quantize(fp8ref, tmp_path, x, "--convention", "sglang-triton-colmajor")
    assert s.shape == (2, 0) and s.dtype == np.float32


@pytest.mark.parametrize("convention", ["vllm-rmsnorm-quant", "aiter-rmsnorm-quant", "exact"])
def test_rmsnorm_quant_scale_layouts(fp8ref, tmp_path, convention):
    """rmsnorm-quant --scale-layout: the same codes, the scales stored as the numpy transform of the row-major ones
    (vLLM's is_scale_transposed = col-major; DeepGEMM's TMA-aligned); packed-ue8m0 needs ue8m0 scales: exit 2."""
    x = rows(M=30, K=384, seed=3)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", np.linspace(0.5, 1.5, 384, dtype=np.float32))

    def run(*extra, s="s.npy", check=True):
        r = fp8ref("rmsnorm-quant", "--from", "f32", "--to", "e4m3fn", "--convention", convention, *extra,
                   tmp_path / "x.npy", tmp_path / "w.npy", tmp_path / ("q" + s), tmp_path / s)
        if check:
            assert r.returncode == 0, r.stderr
            return np.load(tmp_path / ("q" + s)), np.load(tmp_path / s)
        return r

    q, s = run()
    assert s.shape == (30, 3)
    qc, sc = run("--scale-layout", "col-major", s="c.npy")
    qt, st = run("--scale-layout", "tma-aligned", s="t.npy")
    assert np.array_equal(q, qc) and np.array_equal(q, qt)
    assert np.array_equal(sc, s.T)
    assert np.array_equal(st, pad_rows(s.T, 4))
    bad = run("--scale-layout", "packed-ue8m0", s="p.npy", check=False)
    assert bad.returncode == 2 and "ue8m0" in bad.stderr and not (tmp_path / "p.npy").exists()

"""fp8ref quantize against per-token-group quantizers run on the H200, bit for bit: codes, and scales in the layout
each kernel writes (capture: tools/device/capture_quant_kernels.py + .cu, 2026-12-01, torch 2.11.0+cu130,
Triton 3.6.0, nvcc 13.0 sm_90; data tests/data/h200/quant_kernels_h200.npz).

  cuda_vllm_*    vLLM per_token_group_quant_8bit (smem kernel math, c10 cast)       --convention vllm-group
  cuda_sglk_*    sglang sgl-kernel per_token_group_quant_8bit                      --convention sgl-kernel
                 layout 0 row-major f32, 1 column-major TMA-aligned f32, 2 column-major packed ue8m0 (int32)
  cuda_jit_*     sglang JIT per_token_group_quant QuantTrait::run                   --convention sglang-jit
                 mode 0 row-major f32, 1 TMA-aligned f32, 2 packed ue8m0 (K = 512 and K = 384: 3 groups, tail byte 0)
  triton_row_*   sglang Triton _per_token_group_quant_8bit (f32 and ue8m0 scales)   --convention sglang-triton
  triton_col_*   sglang Triton _per_token_group_quant_8bit_colmajor, TMA-aligned     --convention sglang-triton-colmajor
The Triton kernels divide with div.full.f32: fp8ref's div=triton-nv (a control run with --div ieee must differ).

Inputs: [254, K] bf16/f16/f32 rows over many magnitudes with zero, tiny, NaN, Inf, all-NaN and all-Inf groups and
±448 rows; the file keeps the first 62 rows of inputs and codes and the kernels' whole scale buffers (254 rows,
TMA pad rows 254..255 left holding the sentinel 0x5A5A5A5A: the kernels do not write them). fp8ref runs on the 62
rows: its TMA-aligned and packed scales have 64 columns (pads at 62, 63 are zero) and must equal the kernel's
columns 0..61; and the kernel's whole 254-row buffers must equal fp8ref's layout of the kernel's own row-major
scales (the layout transform alone, at the real M).
"""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

R = 62          # rows kept in the file
M_FULL = 254    # rows of the capture
SRC_NP = {"bf16": np.uint16, "f16": np.float16, "f32": np.float32}


@pytest.fixture(scope="module")
def cap(test_data):
    path = test_data / "h200" / "quant_kernels_h200.npz"
    if not path.exists():
        pytest.skip(f"no H200 capture at {path}")
    return np.load(path)


def src_array(cap, src, k=512):
    return np.ascontiguousarray(cap["x_" + src].view(SRC_NP[src])[:, :k])


def quantize(fp8ref, tmp_path, x, src, convention, *extra, check=True):
    inp, q, s = tmp_path / "x.npy", tmp_path / "q.npy", tmp_path / "s.npy"
    np.save(inp, x)
    r = fp8ref("quantize", "--from", src, "--to", "e4m3fn", "--convention", convention, *extra, inp, q, s)
    if check:
        assert r.returncode == 0, r.stderr
    return np.load(q), np.load(s)


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def assert_codes(name, got, want):
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{name}: {len(bad)} codes differ, first at {tuple(bad[0])}: fp8ref {got[tuple(bad[0])]:#04x}, " \
                          f"H200 {want[tuple(bad[0])]:#04x}"


def assert_scales(name, got, want_full, layout):
    """got: fp8ref's scales for R rows in `layout`; want_full: the kernel's buffer for 254 rows (same layout)."""
    g, w = bits(got), bits(want_full)
    if layout == "row-major":
        w = w[:R]
        assert g.shape == w.shape, (name, g.shape, w.shape)
    else:  # [C, Ra]: rows are the last axis
        assert g.shape[-1] == 64 and g.shape[:-1] == w.shape[:-1], (name, g.shape, w.shape)
        assert np.all(g[..., R:] == 0), f"{name}: fp8ref's pad entries must be zero"
        g, w = g[..., :R], w[..., :R]
    bad = np.argwhere(g != w)
    assert bad.size == 0, f"{name}: {len(bad)} scale words differ, first at {tuple(bad[0])}: fp8ref " \
                          f"{g[tuple(bad[0])]:#010x}, H200 {w[tuple(bad[0])]:#010x}"


CUDA_CASES = [  # (name, convention, capture key, src, K, extra args, layout)
    *[(f"vllm {s} {d}", "vllm-group", f"cuda_vllm_{s}_{u}", s, 512, ex, "row-major")
      for s in ("bf16", "f16", "f32") for u, d, ex in ((0, "f32", ()), (1, "ue8m0", ("--scale-dtype", "ue8m0")))],
    *[(f"sgl-kernel {s} {lay}", "sgl-kernel", f"cuda_sglk_{s}_{i}", s, 512, ex, lay)
      for s in ("bf16", "f16")
      for i, lay, ex in ((0, "row-major", ()), (1, "tma-aligned", ("--scale-layout", "tma-aligned")),
                         (2, "packed-ue8m0", ("--scale-dtype", "ue8m0")))],
    *[(f"sglang-jit {s} {lay} K={k}", "sglang-jit", f"cuda_jit_{s}_{i}_{k}", s, k, ex, lay)
      for s in ("bf16", "f16")
      for i, lay, ex, ks in ((0, "row-major", (), (512,)), (1, "tma-aligned", ("--scale-layout", "tma-aligned"), (512,)),
                             (2, "packed-ue8m0", ("--scale-dtype", "ue8m0"), (512, 384)))
      for k in ks],
    *[(f"sglang-triton {s} {d}", "sglang-triton", f"triton_row_{s}_{u}", s, 512, ex, "row-major")
      for s in ("bf16", "f16", "f32") for u, d, ex in ((0, "f32", ()), (1, "ue8m0", ("--scale-dtype", "ue8m0")))],
    *[(f"sglang-triton-colmajor {s} {d}", "sglang-triton-colmajor", f"triton_col_{s}_{u}", s, 512, ex, "tma-aligned")
      for s in ("bf16", "f16", "f32") for u, d, ex in ((0, "f32", ()), (1, "ue8m0", ("--scale-dtype", "ue8m0")))],
]


@pytest.mark.parametrize("name,convention,key,src,k,extra,layout", CUDA_CASES, ids=[c[0] for c in CUDA_CASES])
def test_bit_exact_with_the_h200(fp8ref, tmp_path, cap, name, convention, key, src, k, extra, layout):
    q, s = quantize(fp8ref, tmp_path, src_array(cap, src, k), src, convention, *extra)
    assert_codes(name, q, cap[key + "_q"])
    assert_scales(name, s, cap[key + "_s"], layout)


def test_the_layouts_of_the_kernels_at_full_m(fp8ref, tmp_path, cap):
    """The kernels' own row-major scales, laid out by fp8ref at M = 254 (dequantize reads --scale-layout, so a
    round trip through the CLI checks the transform): equal to the kernels' column-major / packed buffers."""
    np.save(tmp_path / "q1.npy", np.full((M_FULL, 512), 0x38, dtype=np.uint8))  # code 0x38 = 1.0
    for key, row_key in (("cuda_sglk_bf16_1_s", "cuda_sglk_bf16_0_s"), ("triton_col_bf16_0_s", "triton_row_bf16_0_s")):
        row = cap[row_key].view(np.float32)  # [254, 4]
        stored = cap[key].view(np.float32).copy()  # [4, 256]; the pad columns hold the sentinel
        np.save(tmp_path / "s.npy", stored)
        # dequantize reads the stored layout (pads ignored): x = 1.0 * the logical scale of each group
        layout = "tma-aligned"
        fp8ref("dequantize", "--from", "e4m3fn", "--granularity", "group:128", "--scale-layout", layout,
               tmp_path / "q1.npy", tmp_path / "s.npy", tmp_path / "x.npy", check=True)
        x = np.load(tmp_path / "x.npy")
        assert np.array_equal(bits(x[:, ::128]), bits(row)), key
    # packed ue8m0: the kernel's int32 words, read back, give its codes (row-major codes from the JIT kernel's words
    # must equal the sgl-kernel's: both kernels compute the same E8M0 scale)
    np.save(tmp_path / "s.npy", cap["cuda_sglk_bf16_2_s"].view(np.int32))  # pads: the sentinel, ignored
    fp8ref("dequantize", "--from", "e4m3fn", "--granularity", "group:128", "--scale-dtype", "ue8m0",
           "--scale-layout", "packed-ue8m0", tmp_path / "q1.npy", tmp_path / "s.npy", tmp_path / "x.npy", check=True)
    x = np.load(tmp_path / "x.npy")
    codes = (bits(x[:, ::128]) >> 23) & 0xFF
    w = cap["cuda_sglk_bf16_2_s"][0, :M_FULL]
    want = np.stack([(w >> (8 * j)) & 0xFF for j in range(4)], axis=1)
    assert np.array_equal(codes, want)


def test_controls_the_modelled_details_matter(fp8ref, tmp_path, cap):
    """Each modelled detail changes bits on these inputs: IEEE division instead of Triton's, the f32 multiply instead
    of sglang JIT's 16-bit one (f16 groups under 448 * 2^-15 overflow its multiplier), x/s instead of sgl-kernel's
    x * (448 / amax)."""
    x = src_array(cap, "bf16")
    q, s = quantize(fp8ref, tmp_path, x, "bf16", "sglang-triton", "--div", "ieee")
    assert np.any(bits(s) != bits(cap["triton_row_bf16_0_s"][:R]))
    xf = src_array(cap, "f16")
    q, _ = quantize(fp8ref, tmp_path, xf, "f16", "sglang-jit", "--scale-dtype", "ue8m0", "--formula", "x*rcp-bits(s)")
    assert np.any(q != cap["cuda_jit_f16_2_512_q"])
    q, _ = quantize(fp8ref, tmp_path, x, "bf16", "sgl-kernel", "--formula", "x/s")
    assert np.any(q != cap["cuda_sglk_bf16_0_q"])


def test_inf_groups_use_the_bit_built_multiplier(cap):
    """sgl-kernel and sglang JIT build 2^-e from exponent bits: an Inf in a group gives code 0xFF and multiplier -Inf,
    so finite positive elements become -448 (0xFE) and zeros NaN — the capture shows it (row 12, group 1 is all
    +Inf; row 5 holds one +Inf at k = 130)."""
    q = cap["cuda_sglk_bf16_2_q"]
    assert np.all(q[12, 128:256] == 0xFE)
    words = cap["cuda_sglk_bf16_2_s"][0]
    assert (words[12] >> 8) & 0xFF == 0xFF

"""An independent oracle for `fp8ref quantize`: numpy + ml_dtypes implementations of three real quantizers,
written from the step lists of ../shared/research/quant-conventions.md and the sources they cite (not from
fp8ref's C++), run through the CLI and compared bit for bit — codes, and scales as f32 bit patterns (NaN included).

  vllm-group          research §3.5  vllm csrc/quantization/w8a8/fp8/per_token_group_quant.cu
  deepseek-act-quant  research §3.6  DeepSeek-V3 inference/kernel.py act_quant_kernel; its `/` is Triton's
                                     div.full.f32, modelled here from the sm_90 SASS (triton_div below) with the
                                     reciprocal table captured on the H200 (reference/data/triton_nv_rcp_sm90.zlib)
  vllm-per-tensor     research §4.1  vllm csrc/quantization/w8a8/fp8/common.cu scaled_fp8_quant per tensor
  sgl-kernel          research §3.3  sgl-kernel per_token_group_quant_8bit (ue8m0: codes packed 4 per int32)
  sglang-jit          research §3.4  sglang JIT per_token_group_quant (ue8m0: the multiply in the 16-bit type)
  deepgemm            research §3.7  DeepGEMM deep_gemm/utils/math.py per_token_cast_to_fp8 (+ one correction:
                                     a CUDA tensor divided by a Python scalar is multiplied by the f32 reciprocal,
                                     ATen BinaryDivTrueKernel.cu div_true_kernel_cuda, is_cpu_scalar(2) branch)

The stacks run on NVIDIA GPUs, so the oracle follows their arithmetic, not numpy's host arithmetic:
  * every f32 operation is IEEE RNE (numpy float32), and every NaN it produces is the canonical +NaN 0x7FFFFFFF
    (x86 would produce -NaN for Inf*0, which ml_dtypes would then encode as 0xFF);
  * casts are the stack's real cast, not ml_dtypes' (ml_dtypes overflows to NaN): vLLM clamps, then c10 casts
    (no overflow left, so ml_dtypes' RNE is exact there); Triton's cast saturates and keeps NaN as 0x7F;
    torch 2.11's CUDA cast is the c10 conversion, which overflows to NaN with the sign kept = ml_dtypes.
Inputs: random rows over many magnitudes (f32, bf16, f16 sources), rows of zeros, tiny groups under the guard,
NaN/Inf inside a group, values at +-max and just above a power of two, group tails (deepgemm pads), and static
scales placing quotients at the e4m3 overflow thresholds (448, 464, 464+ulp, 480).
"""
import pathlib
import zlib

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn


# ---- the GPU arithmetic model ---------------------------------------------------------------------------------


def gpu(a):
    """An f32 result as a GPU holds it: NaN -> the canonical +NaN 0x7FFFFFFF."""
    a = np.array(a, dtype=F32, copy=True)
    a.view(np.uint32)[np.isnan(a)] = 0x7FFFFFFF
    return a


def pow2_ceil(s):
    """exp2(ceil(log2(s))) computed exactly: the smallest power of two >= s (research A4: on the GPU this equals
    the bit trick exp + (mantissa != 0) for normal s); Inf stays Inf, NaN stays NaN."""
    s = np.asarray(s, dtype=F32)
    m, e = np.frexp(s.astype(np.float64))
    out = np.where(m == 0.5, s.astype(np.float64), np.ldexp(1.0, e))
    out = np.where(np.isfinite(s), out, s)
    return gpu(out.astype(F32))


def cast_c10(v):
    """c10::Float8_e4m3fn(float) / torch 2.11 .to(float8_e4m3fn): RNE, overflow -> NaN with the sign kept;
    ml_dtypes' f32 -> float8_e4m3fn conversion is the same function."""
    return np.asarray(v, dtype=F32).astype(E4M3).view(np.uint8)


def cast_triton_sat(v):
    """Triton `.to(tl.float8e4nv)` on sm_90 (research C4, §11): RNE, saturating (|v| > 448 and +-Inf -> +-448),
    NaN -> 0x7F."""
    v = np.asarray(v, dtype=F32)
    codes = np.clip(v, F32(-448), F32(448)).astype(E4M3).view(np.uint8).copy()
    codes[np.isnan(v)] = 0x7F
    return codes


_RCP = {}


def triton_rcp_table():
    """T(m) = MUFU.RCP(1 + m 2^-23) for every mantissa m: RN(1/m) plus the captured difference in ulps."""
    if "T" not in _RCP:
        path = pathlib.Path(__file__).resolve().parents[2] / "reference" / "data" / "triton_nv_rcp_sm90.zlib"
        d = np.frombuffer(zlib.decompress(path.read_bytes()), dtype=np.int8).astype(np.int64)
        y = (np.arange(1 << 23, dtype=np.uint32) | np.uint32(0x3F800000)).view(F32)
        _RCP["T"] = ((F32(1) / y).view(np.uint32).astype(np.int64) + d).astype(np.uint32).view(F32)
    return _RCP["T"]


def triton_div(x, y):
    """Triton fp32 x / y on sm_90 (div.full.f32 -> SASS): |y| > 2^126: both * 0.25; |y| < 2^-126: both * 2^24;
    then RN(x * MUFU.RCP(y)), MUFU.RCP(y) = T(mantissa) * 2^(127 - exponent) for the (now normal) y."""
    x, y = np.broadcast_arrays(np.asarray(x, dtype=F32), np.asarray(y, dtype=F32))
    big = np.abs(y) > F32(2.0 ** 126)
    small = ~(np.abs(y) >= F32(2.0 ** -126)) & ~np.isnan(y)
    x = np.where(big, x * F32(0.25), np.where(small, x * F32(2.0 ** 24), x))
    y = np.where(big, y * F32(0.25), np.where(small, y * F32(2.0 ** 24), y))
    yb = y.view(np.uint32)
    e = ((yb >> 23) & 0xFF).astype(np.int64)
    r = np.ldexp(triton_rcp_table()[yb & 0x7FFFFF].astype(np.float64), 127 - e)
    r = np.where(yb >> 31 == 1, -r, r)
    r = np.where(y == 0, np.copysign(np.inf, y), np.where(np.isinf(y), np.copysign(0.0, y), r))
    r = np.where(np.isnan(y), np.nan, r).astype(F32)
    return gpu(x * r)


# ---- the three quantizers, step by step -----------------------------------------------------------------------


def vllm_group(x, group=128, ue8m0=False, scales=None):
    """research §3.5; per_token_group_quant.cu ComputeGroupScale / QuantizeGroup (eps = 1e-10, max = 448)."""
    M, K = x.shape
    y = x.astype(F32).reshape(M, K // group, group)                         # static_cast<float>(src)
    if scales is None:
        eps = F32(1e-10)
        amax = np.fmax.reduce(np.abs(y), axis=2, initial=eps)               # local_absmax = eps; fmaxf(...)
        y_s = gpu(amax / F32(448))                                          # local_absmax / max_8bit
        if ue8m0:
            y_s = pow2_ceil(np.fmax(np.abs(y_s), F32(1e-10)))               # exp2f(ceilf(log2f(fmaxf(|y_s|, 1e-10f))))
    else:
        y_s = scales.astype(F32)
    q = gpu(y / y_s[:, :, None])                                            # src / y_s
    q = np.fmin(np.fmax(q, F32(-448)), F32(448))                            # fminf(fmaxf(q, min_8bit), max_8bit)
    return cast_c10(q).reshape(M, K), y_s                                   # DST_DTYPE(q)


def deepseek_act_quant(x, ue8m0=False, scales=None):
    """research §3.6; DeepSeek-V3 inference/kernel.py act_quant_kernel, BLOCK_SIZE = 128."""
    M, K = x.shape
    xs = x.astype(F32).reshape(M, K // 128, 128)                             # tl.load(...).to(tl.float32)
    if scales is None:
        amax = np.fmax.reduce(np.abs(xs), axis=2)                           # tl.max(tl.abs(x)): maxnum, NaN skipped
        amax = np.fmax(amax, F32(1e-4))                                     # tl.maximum(amax, 1e-4)
        s = triton_div(amax, F32(448))                                      # amax / 448. (Triton `/`)
        if ue8m0:
            s = pow2_ceil(s)                                                # exp2(ceil(log2(s)))
    else:
        s = scales.astype(F32)
    y = triton_div(xs, s[:, :, None])                                       # x / s (Triton `/`)
    return cast_triton_sat(y).reshape(M, K), s                              # y.to(float8_e4m3fn), no clamp


def ceil_to_ue8m0(sf):
    """DeepGEMM: bits = x.abs().float().view(int); exp = ((bits >> 23) & 0xFF) + (bits & 0x7FFFFF).bool();
    (exp.clamp(1, 254) << 23).view(float)."""
    bits = np.abs(sf).astype(F32).view(np.uint32).astype(np.int64)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    return (np.clip(exp, 1, 254).astype(np.uint32) << 23).view(F32)


def deepgemm(x, ue8m0=False, gran_k=128, scales=None):
    """research §3.7; DeepGEMM deep_gemm/utils/math.py per_token_cast_to_fp8, on CUDA tensors."""
    M, N = x.shape
    padded = -(-N // gran_k) * gran_k
    xp = np.zeros((M, padded), dtype=x.dtype)                               # torch.empty(...).fill_(0)
    xp[:, :N] = x
    xv = xp.reshape(M, padded // gran_k, gran_k)
    if scales is None:
        amax = np.max(np.abs(xv).astype(F32), axis=2)                       # .abs().float().amax(dim=2): NaN wins
        amax = np.maximum(amax, F32(1e-4))                                  # .clamp(1e-4): NaN kept
        sf = gpu(amax * F32(1.0 / 448.0))                                   # x_amax / 448.0 -> a * RN(1/448) on CUDA
        if ue8m0:
            sf = ceil_to_ue8m0(sf)
    else:
        sf = scales.astype(F32)
    rcp = gpu(F32(1.0) / sf)                                                # 1.0 / sf = sf.reciprocal() * 1.0
    v = gpu(xv.astype(F32) * rcp[:, :, None])                               # bf16 x f32 -> f32 product
    q = cast_c10(v).reshape(M, padded)[:, :N]                               # .to(torch.float8_e4m3fn)
    return np.ascontiguousarray(q), sf


def ue8m0_code(s):
    """exp field + (mantissa != 0) of an f32 scale, no clamp (sgl-kernel fast_log2_ceil + 127, sglang JIT
    cast_to_ue8m0): 255 for +Inf."""
    b = np.asarray(s, dtype=F32).view(np.uint32)
    return ((b >> 23) & 0xFF) + ((b & 0x7FFFFF) != 0)


def rcp_from_code(code):
    """sgl-kernel fast_pow2(-e) / sglang JIT inv_scale_ue8m0: the f32 with bits (254 - code) << 23, in uint32
    arithmetic (code 255 -> 0xFF800000 = -Inf)."""
    return (((np.uint32(254) - code.astype(np.uint32)) & np.uint32(0x1FF)) << np.uint32(23)).astype(np.uint32).view(F32)


def pack_ue8m0(codes):
    """[M, G] codes -> int32 [ceil(G/4), align4(M)]: byte j of word [p, m] = codes[m, 4p + j], the rest 0
    (DeepGEMM transpose_and_pack_fp32_into_ue8m0; sgl-kernel / sglang JIT column-major byte stores)."""
    M, G = codes.shape
    words = np.zeros(((G + 3) // 4, -(-M // 4) * 4), dtype=np.uint32)
    for g in range(G):
        words[g // 4, :M] |= codes[:, g].astype(np.uint32) << np.uint32(8 * (g % 4))
    return words.view(np.int32)


def sgl_kernel(x, ue8m0=False, scales=None):
    """research §3.3; sgl-kernel/csrc/gemm/per_token_group_quant_8bit.cu per_token_group_quant_8bit_kernel."""
    M, K = x.shape
    y = x.astype(F32).reshape(M, K // 128, 128)
    amax = np.fmax.reduce(np.abs(y), axis=2, initial=F32(1e-10))           # fmaxf from LOCAL_ABSMAX_ABS
    raw = gpu(amax * (F32(1.0) / F32(448)))                                 # amax * MAX_8BIT_INV
    if ue8m0:
        code = ue8m0_code(raw)                                              # fast_log2_ceil(...) + 127
        v = gpu(y * rcp_from_code(code)[:, :, None])                        # x * fast_pow2(-e)
        s = pack_ue8m0(code)                                                # the column-major packed store
    else:
        v = gpu(y * gpu(F32(448) / amax)[:, :, None])                      # x * (448 / amax)
        s = raw
    return cast_triton_sat(v).reshape(M, K), s                             # SATFINITE cvt, no clamp


def sglang_jit(x, ue8m0=False, scales=None):
    """research §3.4; sglang jit_kernel/csrc/gemm/per_token_group_quant.cuh QuantTrait::run (16-bit sources; an f32
    source is multiplied in f32)."""
    M, K = x.shape
    y = x.astype(F32).reshape(M, K // 128, 128)
    amax = np.fmax(np.fmax.reduce(np.abs(y), axis=2), F32(1e-10))           # __hmax2 (NaN loses), max(., 1e-10f)
    raw = gpu(amax * (F32(1.0) / F32(448)))                                 # amax * kMaxValueInv
    if ue8m0:
        code = ue8m0_code(raw)                                              # cast_to_ue8m0
        r = rcp_from_code(code)[:, :, None]                                 # inv_scale_ue8m0
        if x.dtype in (np.float16, ml_dtypes.bfloat16):
            t = x.dtype
            p = gpu(y * r.astype(t).astype(F32))                            # __hmul2(in, T2(quant_scale)):
            v = gpu(p.astype(t).astype(F32))                                # the product rounded to the 16-bit type
        else:
            v = gpu(y * r)
        s = pack_ue8m0(code)
    else:
        v = gpu(y * gpu(F32(448) * gpu(F32(1.0) / amax))[:, :, None])      # x * (448 * __frcp_rn(amax))
        s = raw
    return cast_triton_sat(v).reshape(M, K), s


def vllm_per_tensor(x, scale=None):
    """research §4.1; vllm common.cu dynamic_scaled_fp8_quant_kernel / static_scaled_fp8_quant_kernel,
    scaled_fp8_conversion<true> (max = 448)."""
    y = x.astype(F32)
    if scale is None:
        amax = np.fmax.reduce(np.abs(y), axis=None, initial=F32(0))       # fmaxf block max (NaN skipped), memset 0
        s = gpu(F32(amax) / F32(448))                                       # atomicMaxFloat(scale, block_max / qmax)
    else:
        s = F32(scale)
    inv = gpu(F32(1) / s)                                                   # inverted_scale = 1.0f / scale
    q = gpu(y * inv)                                                        # x * inverted_scale (0 * Inf = NaN)
    q = np.fmax(F32(-448), np.fmin(q, F32(448)))                            # fmaxf(-qmax, fminf(., qmax)): NaN -> +448
    return cast_c10(q), np.array(s, dtype=F32).reshape((1,) * x.ndim)      # __NV_SATFINITE: nothing left to saturate


ORACLES = {"vllm-group": vllm_group, "deepseek-act-quant": deepseek_act_quant, "deepgemm": deepgemm,
           "sgl-kernel": sgl_kernel, "sglang-jit": sglang_jit}


# ---- inputs ---------------------------------------------------------------------------------------------------


def to_source(x, src):
    """(array for the CLI, the same values as the oracle sees them)."""
    if src == "f32":
        a = x.astype(F32)
        return a, a
    if src == "f16":
        a = x.astype(np.float16)
        return a, a
    b = x.astype(F32).astype(ml_dtypes.bfloat16)
    return b.view(np.uint16), b


def adversarial(rng, M, K, src):
    """Random rows over many magnitudes, then the special rows."""
    lo, hi = (-12, 10) if src == "f16" else (-40, 40)
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(lo, hi, size=(M, 1)))
    x[0] = 0.0                                               # a row of zeros
    x[1] = -0.0
    x[2] = rng.standard_normal(K) * (2.0 ** -24 if src == "f16" else 1e-12)   # under every amax floor
    x[3] = rng.standard_normal(K) * 1e-6                     # under deepseek/deepgemm's 1e-4, above vLLM's 1e-10
    x[4, 5] = np.nan                                         # NaN inside a group
    x[5, 130] = np.inf                                       # Inf inside a group
    x[6, 7] = -np.inf
    x[6, 200 % K] = np.nan
    x[7, ::2], x[7, 1::2] = 448.0, -448.0                    # +-max at scale 1
    x[8, 0] = 448.0 * 2.0 ** -5 * (1 + 2.0 ** -7)            # amax just above a power of two (bf16-exact)
    x[9, 0] = 448.0 * 2.0 ** 3                               # amax exactly max * 2^3: s = 8
    x[9, 1:] = rng.integers(-448, 449, size=K - 1) * 4.0    # integers: exact quotients, ties
    x[10] = rng.standard_normal(K) * np.exp2(rng.integers(-30, 30, size=K))    # magnitudes mixed inside groups
    # quotients within a few f32 ulps of e4m3 midpoints: where x/s, x*(1/s) and the scale formula disagree
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float64)))
    mids = (grid[:-1] + grid[1:])[np.isfinite(grid[1:])] / 2
    for r in (11, 12):
        a = 448.0 * (1 + rng.random()) * 2.0 ** int(rng.integers(-8, 4))
        s = float(F32(a) / F32(448))
        m = rng.choice(mids[mids < 448], size=K) * s * (1 + rng.integers(-3, 4, size=K) * 2.0 ** -24)
        x[r] = m * rng.choice([-1.0, 1.0], size=K)
        x[r, ::128] = a
    if src == "f16":
        x = np.clip(x, -60000, 60000)
    return x


def run_cli(fp8ref, tmp_path, arr, src, convention, *extra):
    inp, q, s = tmp_path / "x.npy", tmp_path / "q.npy", tmp_path / "s.npy"
    np.save(inp, arr)
    fp8ref("quantize", "--from", src, "--to", "e4m3fn", "--convention", convention, *extra, inp, q, s, check=True)
    return np.load(q), np.load(s)


def assert_same(name, got_q, want_q, got_s, want_s, x):
    assert got_q.dtype == np.uint8 and got_q.shape == want_q.shape
    assert got_s.shape == want_s.shape, (got_s.shape, want_s.shape)
    if want_s.dtype == np.int32:  # packed ue8m0 words
        assert got_s.dtype == np.int32
        sb_got, sb_want = got_s.view(np.uint32), want_s.view(np.uint32)
    else:
        sb_got, sb_want = got_s.astype(F32).view(np.uint32), want_s.astype(F32).view(np.uint32)
    bad_s = np.argwhere(sb_got != sb_want)
    assert bad_s.size == 0, (f"{name}: {len(bad_s)} scales differ, first at {tuple(bad_s[0])}: fp8ref "
                             f"{got_s[tuple(bad_s[0])]!r} ({sb_got[tuple(bad_s[0])]:#010x}), oracle "
                             f"{want_s[tuple(bad_s[0])]!r} ({sb_want[tuple(bad_s[0])]:#010x})")
    bad = np.argwhere(got_q != want_q)
    assert bad.size == 0, (f"{name}: {len(bad)} codes differ, first at {tuple(bad[0])}: x = "
                           f"{float(x[tuple(bad[0])])!r}, fp8ref {got_q[tuple(bad[0])]:#04x}, "
                           f"oracle {want_q[tuple(bad[0])]:#04x}")


# ---- the tests ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("convention", sorted(ORACLES))
@pytest.mark.parametrize("src", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("ue8m0", [False, True], ids=["f32-scales", "ue8m0"])
def test_dynamic_bit_equal(fp8ref, tmp_path, convention, src, ue8m0):
    rng = np.random.default_rng(zlib.crc32(f"{convention} {src} {ue8m0}".encode()))
    M, K = 64, 512
    arr, xs = to_source(adversarial(rng, M, K, src), src)
    extra = ("--scale-dtype", "ue8m0") if ue8m0 else ()
    got_q, got_s = run_cli(fp8ref, tmp_path, arr, src, convention, *extra)
    want_q, want_s = ORACLES[convention](xs, ue8m0=ue8m0)
    assert_same(f"{convention} {src}", got_q, want_q, got_s, want_s, xs)
    # the adversarial rows really are what they claim (a weak oracle would pass vacuously)
    codes = want_q.reshape(M, -1)
    if convention == "sglang-jit" and ue8m0 and src == "f16":
        # amax floored at 1e-10: the multiplier 2^(127-e) overflows f16 to Inf, and 0 * Inf is NaN (research §3.4)
        assert np.all(codes[0] == 0x7F) and np.all(codes[1] == 0x7F)
    else:
        assert np.all(codes[0] == 0) and np.all(codes[1] == 0x80)
    assert np.all(codes[7, ::2] == 0x7E) and np.all(codes[7, 1::2] == 0xFE)


@pytest.mark.parametrize("src", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("rows", ["finite", "adversarial"])
def test_vllm_per_tensor_bit_equal(fp8ref, tmp_path, src, rows):
    """vLLM scaled_fp8_quant per tensor: dynamic (scale = amax/448 with no floor, x·(1/s), NaN -> +448), static with a
    given scale, and the all-zero tensor (scale 0, 1/0 = Inf, 0·Inf = NaN: every code +448)."""
    rng = np.random.default_rng(zlib.crc32(f"per-tensor {src} {rows}".encode()))
    x = adversarial(rng, 64, 512, src)
    if rows == "finite":  # (the adversarial rows put an Inf in the tensor's amax: then every finite code is 0)
        x = x[np.isfinite(x).all(axis=1)]
    arr, xs = to_source(x, src)
    got_q, got_s = run_cli(fp8ref, tmp_path, arr, src, "vllm-per-tensor")
    want_q, want_s = vllm_per_tensor(xs)
    assert got_s.shape == (1, 1)
    assert_same(f"vllm-per-tensor {src}", got_q, want_q, got_s, want_s, xs)
    for scale in (F32(7.0), F32(want_s[0, 0]) * F32(1.5), F32(2.0 ** -20)):  # static: x * RN(1/scale)
        np.save(tmp_path / "st.npy", np.full((1, 1), scale, dtype=F32))
        fp8ref("quantize", "--from", src, "--to", "e4m3fn", "--convention", "vllm-per-tensor", "--static",
               tmp_path / "st.npy", tmp_path / "x.npy", tmp_path / "q.npy", check=True)
        want_q, _ = vllm_per_tensor(xs, scale=scale)
        assert_same(f"vllm-per-tensor static {scale}", np.load(tmp_path / "q.npy"), want_q, want_s, want_s, xs)
    zq, zs = run_cli(fp8ref, tmp_path, np.zeros_like(arr), src, "vllm-per-tensor")
    assert np.all(zq == 0x7E) and zs.view(np.uint32)[0, 0] == 0


def test_the_special_cases_differ_between_conventions(fp8ref, tmp_path):
    """The conventions disagree exactly where the sources say: NaN inside a group is -448 for vLLM (fmaxf first),
    NaN (0x7F) for the unclamped Triton cast, and poisons DeepGEMM's whole group through torch's amax."""
    x = np.zeros((2, 128), dtype=F32)
    x[0, :4] = [1.0, np.nan, -2.0, 3.0]
    x[1, :3] = [np.inf, 1.0, -1.0]
    got = {c: run_cli(fp8ref, tmp_path, x, "f32", c) for c in ORACLES}
    for c, (q, s) in got.items():
        want_q, want_s = ORACLES[c](x)
        assert_same(c, q, want_q, s, want_s, x)
    assert got["vllm-group"][0][0, 1] == 0xFE
    assert got["deepseek-act-quant"][0][0, 1] == 0x7F
    assert np.all(got["deepgemm"][0][0] == 0x7F) and np.isnan(got["deepgemm"][1][0, 0])
    # Inf: the scale is Inf, finite elements quantize to +-0, Inf/Inf is NaN -> -448 (vLLM clamp) or 0x7F
    assert got["vllm-group"][0][1, 0] == 0xFE and got["vllm-group"][0][1, 1] == 0x00
    assert got["deepseek-act-quant"][0][1, 0] == 0x7F and got["deepseek-act-quant"][0][1, 2] == 0x80


def test_deepgemm_scale_multiplies_by_the_reciprocal(fp8ref, tmp_path):
    """amax * RN(1/448) differs from RN(amax/448) for some amax: pick rows where they differ."""
    rng = np.random.default_rng(7)
    a = (rng.random(200000) + 1).astype(F32) * F32(3.0)
    a = a[(a * F32(1.0 / 448.0)) != (a / F32(448))][:16]
    assert a.size == 16
    x = np.zeros((16, 128), dtype=F32)
    x[:, 0] = a
    q, s = run_cli(fp8ref, tmp_path, x, "f32", "deepgemm")
    assert np.array_equal(s[:, 0].view(np.uint32), (a * F32(1.0 / 448.0)).view(np.uint32))
    assert not np.array_equal(s[:, 0], a / F32(448))


@pytest.mark.parametrize("K", [200, 300, 64])
def test_deepgemm_group_tail_is_zero_padding(fp8ref, tmp_path, K):
    rng = np.random.default_rng(K)
    x = adversarial(rng, 16, max(K, 256), "bf16")[:, :K]
    arr, xs = to_source(x, "bf16")
    for ue8m0 in (False, True):
        extra = ("--scale-dtype", "ue8m0") if ue8m0 else ()
        got_q, got_s = run_cli(fp8ref, tmp_path, arr, "bf16", "deepgemm", *extra)
        want_q, want_s = deepgemm(xs, ue8m0=ue8m0)
        assert got_s.shape == (16, -(-K // 128))
        assert_same(f"deepgemm K={K}", got_q, want_q, got_s, want_s, xs)


def test_ue8m0_scale_codes(fp8ref, tmp_path):
    """--scale-codes writes the E8M0 byte of each power-of-two scale: DeepGEMM's pack_ue8m0_to_int takes bits >> 23."""
    rng = np.random.default_rng(11)
    arr, xs = to_source(adversarial(rng, 32, 256, "bf16"), "bf16")
    inp, q, s = tmp_path / "x.npy", tmp_path / "q.npy", tmp_path / "s.npy"
    np.save(inp, arr)
    fp8ref("quantize", "--from", "bf16", "--to", "e4m3fn", "--convention", "deepgemm", "--scale-dtype", "ue8m0",
           "--scale-codes", inp, q, s, check=True)
    codes = np.load(s)
    _, want_s = deepgemm(xs, ue8m0=True)
    assert codes.dtype == np.uint8
    assert np.array_equal(codes, (want_s.view(np.uint32) >> 23).astype(np.uint8))


@pytest.mark.parametrize("convention", ["deepgemm", "deepseek-act-quant", "vllm-group"])  # the CUDA group kernels: dynamic only
def test_static_scales_at_the_overflow_thresholds(fp8ref, tmp_path, convention):
    """Static scales: quotients at 448, 464 (the tie to 448), 464+ulp, 480, beyond, +-Inf, NaN, subnormals — where
    the clamp and the cast decide."""
    vals = np.array([448, 464, np.nextafter(F32(464), F32(1e9)), 480, -500, 1e6, np.inf, -np.inf, np.nan, 0.0, -0.0,
                     2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -9, 2.0 ** -6, 1.0625, -1.1875, 57344], dtype=F32)
    x = np.tile(np.resize(vals, 128), (3, 2)).astype(F32)
    scales = np.array([[1.0, 1.0], [0.5, 2.0], [2.0 ** -20, 2.0 ** 20]], dtype=F32)
    inp, q, sp = tmp_path / "x.npy", tmp_path / "q.npy", tmp_path / "s.npy"
    np.save(inp, x)
    np.save(sp, scales)
    fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", convention, "--static", sp, inp, q, check=True)
    got = np.load(q)
    want, _ = ORACLES[convention](x, scales=scales)
    assert_same(f"{convention} static", got, want, scales, scales, x)
    # the rows hit both policies: vLLM clamps 480 to 448, torch's cast (deepgemm) makes it NaN
    if convention == "vllm-group":
        assert got[0, 3] == 0x7E and got[0, 8] == 0xFE
    if convention == "deepgemm":
        assert got[0, 3] == 0x7F and got[0, 1] == 0x7E


def test_bad_input_exits_2_and_writes_nothing(fp8ref, tmp_path):
    x = np.zeros((4, 300), dtype=F32)
    inp, q, s = tmp_path / "x.npy", tmp_path / "q.npy", tmp_path / "s.npy"
    np.save(inp, x)

    def fails(*args, needle):
        p = fp8ref("quantize", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert needle in p.stderr, (needle, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1
        assert not q.exists() and not s.exists()

    base = ("--from", "f32", "--to", "e4m3fn")
    fails(*base, "--convention", "vllm-group", inp, q, s, needle="not a multiple of 128")
    fails(*base, "--convention", "vllm", inp, q, s, needle="unknown quant convention 'vllm'")
    fails("--from", "f32", "--to", "e5m2", "--convention", "deepgemm", inp, q, s, needle="e4m3fn")
    fails(*base, "--convention", "exact", "--granularity", "group:0", inp, q, s, needle="granularity")
    fails(*base, "--convention", "vllm-group", "--scale-codes", "--tail", "partial", inp, q, s, needle="ue8m0")
    np.save(tmp_path / "x16.npy", x.astype(np.float16))
    fails(*base, "--convention", "exact", "--tail", "partial", tmp_path / "x16.npy", q, s, needle="float16")
    # static scales of the wrong shape or dtype, or not representable in the scale dtype
    np.save(tmp_path / "bad_shape.npy", np.ones((4, 2), dtype=F32))
    fails(*base, "--convention", "exact", "--tail", "partial", "--static", tmp_path / "bad_shape.npy", inp, q,
          needle="needs scales of shape (4, 3)")
    np.save(tmp_path / "bad_dtype.npy", np.ones((4, 3), dtype=np.float64))
    fails(*base, "--convention", "exact", "--tail", "partial", "--static", tmp_path / "bad_dtype.npy", inp, q,
          needle="float64")
    np.save(tmp_path / "not_pow2.npy", np.full((4, 3), 3.0, dtype=F32))
    fails(*base, "--convention", "exact", "--tail", "partial", "--scale-dtype", "ue8m0", "--static",
          tmp_path / "not_pow2.npy", inp, q, needle="power of two")
    np.save(tmp_path / "not_bf16.npy", np.full((4, 3), 1.0 + 2.0 ** -20, dtype=F32))
    fails(*base, "--convention", "exact", "--tail", "partial", "--scale-dtype", "bf16", "--static",
          tmp_path / "not_bf16.npy", inp, q, needle="not exactly representable in bf16")
    p = fp8ref("quantize", *base, "--convention", "exact", "--formula", "x/y", inp, q, s)
    assert p.returncode == 2 and "unknown formula" in p.stderr
    p = fp8ref("quantize", *base, "--convention", "exact", inp, q)
    assert p.returncode == 2 and "missing SCALES" in p.stderr


def test_dequantize_round_trip_and_rounding(fp8ref, tmp_path):
    """dequantize = one f32 multiply of the code's value and the scale (then bf16 RNE for --to bf16)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((8, 256)) * 10).astype(F32)
    q, s = run_cli(fp8ref, tmp_path, x, "f32", "vllm-group")
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "s.npy", s)
    fp8ref("dequantize", "--from", "e4m3fn", "--granularity", "group:128", tmp_path / "q.npy", tmp_path / "s.npy",
           tmp_path / "y.npy", check=True)
    y = np.load(tmp_path / "y.npy")
    vq = q.view(E4M3).astype(F32).reshape(8, 2, 128)
    want = gpu(vq * s[:, :, None]).reshape(8, 256)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    fp8ref("dequantize", "--from", "e4m3fn", "--granularity", "group:128", "--to", "bf16", tmp_path / "q.npy",
           tmp_path / "s.npy", tmp_path / "yb.npy", check=True)
    yb = np.load(tmp_path / "yb.npy")
    assert yb.dtype == np.uint16
    assert np.array_equal(yb, want.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.max(np.abs(y - x)) <= np.max(np.abs(x)) / 16


def test_h200_capture(fp8ref, tmp_path, test_data):
    """Against a capture from the H200 (torch 2.11.0+cu130, Triton 3.6.0): DeepGEMM's per_token_cast_to_fp8 run
    as torch on CUDA, DeepSeek-V3's act_quant_kernel and sglang's _per_token_group_quant_8bit as Triton kernels,
    on bf16 [256, 512] holding the special rows of `adversarial` (capture script: tools/device/h200_quant_probe.py;
    data tests/data/h200/h200_quant_capture.npz). Every code and scale must match bit for bit — the Triton kernels
    through div=triton-nv (with IEEE division instead, 41% of their f32 scales differ, checked as a control)."""
    path = test_data / "h200" / "h200_quant_capture.npz"
    if not path.exists():
        pytest.skip(f"no H200 capture at {path}")
    c = np.load(path)
    x = c["x_bf16"]
    for u in (0, 1):
        for n in (512, 300):
            extra = ("--scale-dtype", "ue8m0") if u else ()
            q, s = run_cli(fp8ref, tmp_path, np.ascontiguousarray(x[:, :n]), "bf16", "deepgemm", *extra)
            assert_same(f"deepgemm ue8m0={u} K={n}", q, c[f"deepgemm_{u}_{n}_q"], s, c[f"deepgemm_{u}_{n}_s"], x)
    q, s = run_cli(fp8ref, tmp_path, x, "bf16", "deepseek-act-quant", "--scale-dtype", "ue8m0")
    assert_same("deepseek ue8m0", q, c["deepseek_ue8m0_q"], s, c["deepseek_ue8m0_s"], x)
    for conv, key in (("deepseek-act-quant", "deepseek_none"), ("sglang-triton", "sglang")):
        q, s = run_cli(fp8ref, tmp_path, x, "bf16", conv)
        assert_same(conv, q, c[key + "_q"], s, c[key + "_s"], x)
        _, s_ieee = run_cli(fp8ref, tmp_path, x, "bf16", conv, "--div", "ieee")
        assert np.mean(s_ieee.view(np.uint32) != c[key + "_s"].view(np.uint32)) > 0.3, conv

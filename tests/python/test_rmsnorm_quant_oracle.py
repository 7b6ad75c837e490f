"""An independent oracle for `fp8ref rmsnorm-quant`: numpy + ml_dtypes implementations of the fused RMSNorm + FP8
group-quant conventions, written from the step lists of ../shared/research/quant-conventions.md §7 and the kernel
sources cited there (not from fp8ref's C++), plus the exact contract in exact rational arithmetic (fractions /
Python integers), run through the CLI and compared bit for bit — codes, scales (f32 bit patterns) and the updated
residual.

  aiter-rmsnorm-quant  research §7.1  aiter _fused_rms_fp8_group_quant_kernel: f32 residual sum, y = x*r*w in f32,
                       m = max(amax, 1e-10), s = m/MAX, q = clamp(y*(1/s)); the variance stand-in is exact (the
                       device's Triton-on-ROCm tree order is not modelled) and rsqrt is correctly rounded
  vllm-rmsnorm-quant   research §7.2  vLLM rms_norm_per_block_quant: the cub order (per-thread fma chains over vec4s,
                       warp shuffle trees, warps in sequence), y = bf16(bf16(x*r)*w), s = max(amax/448, 1/(448*512)),
                       q = clamp(y/s), NaN -> +448; r = CUDA rsqrtf from the table captured on the H200
                       (reference/data/cuda_rsqrtf_sm90.zlib: MUFU.RSQ over [1, 4), scaled by 4^k; subnormals
                       prescaled by 2^24 — the SASS nvcc emits), implemented here from the capture's description
  deepseek-rmsnorm     research §7.3: bf16 residual add, exact mean (fp8ref's stand-in for torch's), rsqrtf,
                       y = bf16(w*(z*r)), then act_quant with Triton's division (test_quant_oracle.deepseek_act_quant)
  exact                every step rounded once: Σx² exact, correctly rounded rsqrt, s = amax/max and q = y/s each
                       rounded once from the exact rational
Plus: the vLLM port captured on the H200 (tests/data/h200/rmsnorm_vllm_h200.npz), bit for bit including each row's r.

The GPU arithmetic model: every f32 operation is IEEE RNE (numpy float32); every NaN it produces is +NaN 0x7FFFFFFF.
fma(a, a, c) is computed exactly (fractions) and rounded once. Inputs: random rows over many magnitudes (bf16, f32,
f16 sources), rows of zeros, tiny rows (squares below f32), rows at ±max (squares overflow), NaN/Inf inside a row,
with and without a residual.
"""
import math
import pathlib
import zlib
from fractions import Fraction

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

F32 = np.float32
BF16 = ml_dtypes.bfloat16
E4M3 = ml_dtypes.float8_e4m3fn
EPS = F32(1e-6)


def gpu(a):
    a = np.array(a, dtype=F32, copy=True)
    a.view(np.uint32)[np.isnan(a)] = 0x7FFFFFFF
    return a


# ---- exact rounding helpers ----------------------------------------------------------------------------------


def rn32(q):
    """RNE of a non-negative Fraction to f32 (overflow -> +Inf)."""
    if q == 0:
        return F32(0)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    if Fraction(2) ** e > q:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    n, rem = divmod(q, quantum)
    n = int(n)
    if rem * 2 > quantum or (rem * 2 == quantum and n % 2 == 1):
        n += 1
    v = n * quantum
    if v >= Fraction(2) ** 128:
        return F32(np.inf)
    return F32(float(v))


def fma32(a, b, c):
    """fmaf: a*b + c rounded once."""
    a, b, c = F32(a), F32(b), F32(c)
    if not (np.isfinite(a) and np.isfinite(b) and np.isfinite(c)):
        return gpu(a * b + c)[()]
    t = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    return rn32(t) if t >= 0 else -rn32(-t)


def mean_square_exact(z):
    if np.isnan(z).any():
        return F32(np.nan)
    if np.isinf(z).any():
        return F32(np.inf)
    return rn32(sum(Fraction(float(v)) ** 2 for v in z) / len(z))


RSQRT_TABLE = None


def rsqrt_cuda(u):
    """CUDA rsqrtf on sm_90: u = 4^k·u0 (u0 in [1, 4)) -> 2^-k · R(u0), R(u0) = f32(1/sqrt(f64 u0)) + table ulps;
    subnormal u: rsqrtf(u·2^24)·2^12; NaN/negative -> NaN, ±0 -> ±Inf, +Inf -> +0."""
    global RSQRT_TABLE
    if RSQRT_TABLE is None:
        path = pathlib.Path(__file__).resolve().parents[2] / "reference" / "data" / "cuda_rsqrtf_sm90.zlib"
        RSQRT_TABLE = np.frombuffer(zlib.decompress(path.read_bytes()), dtype=np.int8)
    u = F32(u)
    b = int(np.array(u).view(np.uint32))
    if np.isnan(u) or (b >> 31 and b != 0x80000000):
        return F32(np.nan)
    if b in (0, 0x80000000):
        return F32(np.inf) if b == 0 else F32(-np.inf)
    if np.isinf(u):
        return F32(0)
    scale = 0
    if b >> 23 == 0:
        b = int(np.array(F32(float(u) * 2.0 ** 24)).view(np.uint32))
        scale = 12
    e, m = b >> 23, b & 0x7FFFFF
    p = (e - 127) & 1
    k = (e - 127 - p) // 2
    u0 = np.array(((127 + p) << 23) | m, dtype=np.uint32).view(F32)
    r0 = int(np.array(F32(1.0 / math.sqrt(float(u0)))).view(np.uint32)) + int(RSQRT_TABLE[(p << 23) | m])
    return np.array(r0 + ((scale - k) << 23), dtype=np.uint32).view(F32)[()]


def rsqrt_rn(u):
    """The correctly rounded f32 of 1/sqrt(u): the candidate whose rounding interval holds it, by exact squares."""
    u = F32(u)
    if np.isnan(u):
        return F32(np.nan)
    if u == 0:
        return F32(np.inf)
    if np.isinf(u):
        return F32(0)
    c0 = F32(1 / math.sqrt(float(u)))
    U = Fraction(float(u))
    for c in (c0, np.nextafter(c0, F32(0)), np.nextafter(c0, F32(np.inf))):
        lo = (Fraction(float(np.nextafter(c, F32(0)))) + Fraction(float(c))) / 2
        hi = (Fraction(float(np.nextafter(c, F32(np.inf)))) + Fraction(float(c))) / 2
        if lo * lo * U < 1 < hi * hi * U:
            return F32(c)
    raise AssertionError("no rsqrt candidate")


E4M3_POS = sorted({Fraction(float(v)) for v in np.arange(0, 0x7F, dtype=np.uint8).view(E4M3).astype(np.float64)})
E4M3_CODE = {v: c for c, v in zip(range(0x7F), [Fraction(float(v)) for v in np.arange(0, 0x7F, dtype=np.uint8)
                                                   .view(E4M3).astype(np.float64)])}


def e4m3_exact(t):
    """RNE of a Fraction to e4m3fn (the `exact` cast: overflow -> NaN 0x7F/0xFF), sign applied after."""
    neg = t < 0
    a = -t if neg else t
    if a > Fraction(464):
        return 0xFF if neg else 0x7F
    lo = max(v for v in E4M3_POS if v <= a)
    i = E4M3_POS.index(lo)
    if lo == a or i + 1 == len(E4M3_POS):
        pick = lo
    else:
        hi = E4M3_POS[i + 1]
        d1, d2 = a - lo, hi - a
        pick = lo if d1 < d2 else hi if d2 < d1 else (lo if E4M3_CODE[lo] % 2 == 0 else hi)
    # (448, 464]: nearest to 448 or a tie with the overflow neighbour 480 (odd code 0x7F): 448, code 0x7E
    code = E4M3_CODE[pick]
    return code | 0x80 if neg else code


# ---- the conventions -------------------------------------------------------------------------------------------


def residual_sum(x32, r32, dtype):
    """z = f32(x) + f32(r) in f32; the returned residual is z rounded to the input dtype."""
    z = gpu(x32 + r32)
    out = z.astype(dtype)
    if dtype != F32:  # CUDA __float2bfloat16 / __float2half turn a NaN into 0x7FFF (ml_dtypes: 0x7FC0 / 0x7E00)
        out.view(np.uint16)[np.isnan(z)] = 0x7FFF
    return z, out


def cub_mean_square(z, threads):
    """vLLM vectorized::compute_rms + cub::BlockReduce (WARP_REDUCTIONS): see the module docstring."""
    K = len(z)
    nvec = K // 4
    part = []
    for t in range(threads):
        a = F32(0)
        for i in range(t, nvec, threads):
            for j in range(4):
                a = fma32(z[4 * i + j], z[4 * i + j], a)
        part.append(F32(a))
    total = None
    for w0 in range(0, threads, 32):
        lane = part[w0:w0 + 32]
        o = 1
        while o < 32:
            lane = [gpu(lane[i] + lane[i + o])[()] if i + o < len(lane) else lane[i] for i in range(len(lane))]
            o *= 2
        total = lane[0] if total is None else gpu(total + lane[0])[()]
    return gpu(F32(total) / F32(K))[()]


def normed_rows(x32, w32, variance, weight, dtype, rsqrt=None):
    M, K = x32.shape
    y = np.empty((M, K), dtype=F32)
    for m in range(M):
        z = x32[m]
        v = variance(z)
        r = (rsqrt or rsqrt_rn)(gpu(F32(v) + EPS)[()])
        a = gpu(z * r)
        if weight == "f32":
            y[m] = gpu(a * w32)
        else:  # bf16(bf16(x*r) * w): the product of two bf16 is exact in f32, then one bf16 rounding
            y[m] = gpu(a.astype(dtype).astype(F32) * w32).astype(dtype).astype(F32)
    return y


def quant_aiter(y, G):
    M, K = y.shape
    yg = y.reshape(M, K // G, G)
    m = np.fmax(np.fmax.reduce(np.abs(yg), axis=2, initial=F32(0)), F32(1e-10))     # max(max|y|, 1e-10)
    s = gpu(m / F32(448))                                                          # m / DTYPE_MAX
    v = gpu(yg * gpu(F32(1) / s)[:, :, None])                                      # y * (1/s)
    v = np.fmin(np.fmax(v, F32(-448)), F32(448))                                   # tl.clamp: NaN -> -448
    return v.astype(E4M3).view(np.uint8).reshape(M, K), s


def quant_vllm(y, G):
    M, K = y.shape
    yg = y.reshape(M, K // G, G)
    amax = np.fmax.reduce(np.abs(yg), axis=2, initial=F32(0))                      # fmaxf from 0
    s = np.fmax(gpu(amax / F32(448)), F32(1) / (F32(448) * F32(512)))              # max(amax/qmax, min_scaling)
    v = gpu(yg / s[:, :, None])                                                    # x / scale (no inversion)
    v = np.fmax(F32(-448), np.fmin(v, F32(448)))                                   # fmaxf(-qmax, fminf(v, qmax))
    return v.astype(E4M3).view(np.uint8).reshape(M, K), s


def quant_exact(y, G):
    M, K = y.shape
    q = np.zeros((M, K), dtype=np.uint8)
    s = np.zeros((M, K // G), dtype=F32)
    for m in range(M):
        for g in range(K // G):
            grp = y[m, g * G:(g + 1) * G]
            finite = [abs(Fraction(float(v))) for v in grp if not np.isnan(v)]
            amax = max(finite, default=Fraction(0))
            sg = rn32(amax / 448)
            s[m, g] = sg
            for k, v in enumerate(grp):
                if np.isnan(v):
                    q[m, g * G + k] = 0x7F
                elif sg == 0:
                    q[m, g * G + k] = 0x80 if math.copysign(1, v) < 0 else 0x00
                else:
                    q[m, g * G + k] = e4m3_exact(Fraction(float(v)) / Fraction(float(sg)))
    return q, s


def oracle(convention, x32, w32, r32, dtype, threads=None, G=128):
    res_out = None
    if r32 is not None:
        x32, res_out = residual_sum(x32, r32, dtype)
    if convention == "aiter-rmsnorm-quant":
        y = normed_rows(x32, w32, mean_square_exact, "f32", dtype)
        q, s = quant_aiter(y, G)
    elif convention == "vllm-rmsnorm-quant":
        y = normed_rows(x32, w32, lambda z: cub_mean_square(z, threads), "dtype-twice", dtype, rsqrt_cuda)
        q, s = quant_vllm(y, G)
    else:
        y = normed_rows(x32, w32, mean_square_exact, "f32", dtype)
        q, s = quant_exact(y, G)
    return q, s, res_out


# ---- inputs and the CLI ----------------------------------------------------------------------------------------


def source(a, src):
    """(array for the CLI, its f32 values, the dtype used for rounding)."""
    if src == "f32":
        v = a.astype(F32)
        return v, v, F32
    if src == "f16":
        v = a.astype(np.float16)
        return v, v.astype(F32), np.float16
    b = a.astype(F32).astype(BF16)
    return b.view(np.uint16), b.astype(F32), BF16


def rows(rng, M, K, src):
    lo, hi = (-6, 6) if src == "f16" else (-50, 50)
    x = rng.standard_normal((M, K)) * np.exp2(rng.integers(lo, hi, size=(M, 1)))
    big = {"f16": 65504.0, "bf16": float(ml_dtypes.finfo(BF16).max), "f32": float(np.finfo(F32).max)}[src]
    x[0] = 0.0                                                     # a zero row: var 0, r = rsqrt(eps)
    x[1, ::3] = big                                                # squares overflow f32: var = Inf, r = 0
    x[2] = rng.standard_normal(K) * (2.0 ** -20 if src == "f16" else 2.0 ** -120)   # squares below f32's range
    x[3, 5] = np.nan                                               # NaN inside a row
    x[4, 17] = -np.inf
    x[5] = rng.standard_normal(K) * np.exp2(rng.integers(-20 if src != "f16" else -6, 20 if src != "f16" else 6,
                                                           size=K))  # magnitudes mixed inside a row
    return x


def run_cli(fp8ref, tmp_path, convention, src, x, w, r, *extra):
    paths = {n: tmp_path / f"{n}.npy" for n in ("x", "w", "q", "s", "r", "r2")}
    np.save(paths["x"], x)
    np.save(paths["w"], w)
    args = ["rmsnorm-quant", "--from", src, "--to", "e4m3fn", "--convention", convention, *extra]
    if r is not None:
        np.save(paths["r"], r)
        args += ["--residual", paths["r"], "--residual-out", paths["r2"]]
    fp8ref(*args, paths["x"], paths["w"], paths["q"], paths["s"], check=True)
    return np.load(paths["q"]), np.load(paths["s"]), (np.load(paths["r2"]) if r is not None else None)


def assert_same(what, got_q, want_q, got_s, want_s, got_r, want_r):
    sb_got, sb_want = got_s.astype(F32).view(np.uint32), np.asarray(want_s, F32).view(np.uint32)
    bad = np.argwhere(sb_got != sb_want)
    assert bad.size == 0, f"{what}: {len(bad)} scales differ, first at {tuple(bad[0])}: {got_s[tuple(bad[0])]!r} vs " \
                          f"{np.asarray(want_s)[tuple(bad[0])]!r}"
    bad = np.argwhere(got_q != want_q)
    assert bad.size == 0, f"{what}: {len(bad)} codes differ, first at {tuple(bad[0])}: {got_q[tuple(bad[0])]:#04x} vs " \
                          f"{want_q[tuple(bad[0])]:#04x}"
    if want_r is not None:
        assert np.array_equal(got_r.view(np.uint8), np.ascontiguousarray(want_r).view(np.uint8)), f"{what}: residual"


@pytest.mark.parametrize("src", ["bf16", "f32", "f16"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("convention,extra,threads", [
    ("aiter-rmsnorm-quant", (), None),
    ("vllm-rmsnorm-quant", (), 256),                               # M <= 256: T = min(K, 512) = K = 256
    ("vllm-rmsnorm-quant", ("--variance", "cub:32"), 32),          # long per-thread chains
    ("vllm-rmsnorm-quant", ("--variance", "cub:40"), 40),          # a partial second warp
])
def test_convention_bit_equal(fp8ref, tmp_path, src, with_residual, convention, extra, threads):
    rng = np.random.default_rng(zlib.crc32(repr((src, with_residual, convention, extra)).encode()))
    M, K = 8, 256
    x, x32, dt = source(rows(rng, M, K, src), src)
    w, w32, _ = source(rng.standard_normal(K) * 1.5, src)
    r, r32 = None, None
    if with_residual:
        r, r32, _ = source(rows(rng, M, K, src)[::-1].copy(), src)
    want_q, want_s, want_r = oracle(convention, x32, w32, r32, dt, threads)
    for backend in ("cpu", "reference"):
        got_q, got_s, got_r = run_cli(fp8ref, tmp_path, convention, src, x, w, r, "--backend", backend, *extra)
        if want_r is not None and src == "bf16":
            want_r = want_r.view(np.uint16)
        assert_same(f"{convention} {src} residual={with_residual} {backend}", got_q, want_q, got_s, want_s, got_r,
                    want_r)


@pytest.mark.parametrize("threads", [544, 1024])
def test_cub_many_warps(fp8ref, tmp_path, threads):
    """bf16 rows long enough that every thread has data, with 17 and 32 full warps: the AVX-512 warp trees
    (CubFullWarps) take warps 16 at a time, so these cross that boundary, with a partial last group at 17."""
    rng = np.random.default_rng(threads)
    M, K = 8, 4352 if threads == 544 else 4096  # (rows(): zero, overflowing, tiny, NaN and -Inf rows among them)
    x, x32, dt = source(rows(rng, M, K, "bf16"), "bf16")
    w, w32, _ = source(rng.standard_normal(K) * 1.5, "bf16")
    want_q, want_s, _ = oracle("vllm-rmsnorm-quant", x32, w32, None, dt, threads)
    for backend in ("cpu", "reference"):
        got_q, got_s, _ = run_cli(fp8ref, tmp_path, "vllm-rmsnorm-quant", "bf16", x, w, None, "--backend", backend,
                                  "--variance", f"cub:{threads}")
        assert_same(f"cub:{threads} {backend}", got_q, want_q, got_s, want_s, None, None)


@pytest.mark.parametrize("src", ["bf16", "f32"])
def test_exact_contract_in_rationals(fp8ref, tmp_path, src):
    rng = np.random.default_rng(5)
    M, K = 6, 128
    x, x32, dt = source(rows(rng, M, K, src), src)
    w, w32, _ = source(rng.standard_normal(K), src)
    want_q, want_s, _ = oracle("exact", x32, w32, None, dt)
    got_q, got_s, _ = run_cli(fp8ref, tmp_path, "exact", src, x, w, None)
    assert_same(f"exact {src}", got_q, want_q, got_s, want_s, None, None)


def test_cub_order_matters(fp8ref, tmp_path):
    """A row whose f32 sum of squares depends on the order: the oracle's cub order and fp8ref agree, and the
    sequential order gives other codes — the test can fail if the order were ignored."""
    K = 1024
    x32 = np.full((1, K), 2.0 ** -13, dtype=F32)
    x32[0, 0] = 1.0
    w32 = np.ones(K, dtype=F32)
    want_q, want_s, _ = oracle("vllm-rmsnorm-quant", x32, w32, None, F32, 512)
    got_q, got_s, _ = run_cli(fp8ref, tmp_path, "vllm-rmsnorm-quant", "f32", x32, w32, None)
    assert_same("cub order", got_q, want_q, got_s, want_s, None, None)
    seq_q, seq_s, _ = run_cli(fp8ref, tmp_path, "vllm-rmsnorm-quant", "f32", x32, w32, None, "--variance", "f32-seq")
    assert not np.array_equal(seq_s.view(np.uint32), np.asarray(want_s, F32).view(np.uint32)) or \
        not np.array_equal(seq_q, want_q)


def test_bad_input(fp8ref, tmp_path):
    x = np.zeros((4, 256), dtype=np.uint16)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", np.zeros(255, dtype=np.uint16))
    np.save(tmp_path / "w2.npy", np.zeros(256, dtype=np.uint16))
    np.save(tmp_path / "xf.npy", x.astype(F32))
    base = ["rmsnorm-quant", "--from", "bf16", "--to", "e4m3fn"]
    out = [tmp_path / "q.npy", tmp_path / "s.npy"]
    cases = [
        (base + ["--convention", "vllm-rmsnorm-quant", tmp_path / "x.npy", tmp_path / "w.npy", *out], "weight"),
        (base + ["--convention", "nope", tmp_path / "x.npy", tmp_path / "w2.npy", *out], "unknown"),
        (base + ["--convention", "exact", tmp_path / "xf.npy", tmp_path / "w2.npy", *out], "dtype"),
        (base + ["--convention", "exact", "--group", "100", tmp_path / "x.npy", tmp_path / "w2.npy", *out],
         "multiple"),
        (base + ["--convention", "exact", "--residual", tmp_path / "x.npy", tmp_path / "x.npy", tmp_path / "w2.npy",
                 *out], "residual-out"),
        (base + ["--convention", "exact", "--eps", "-1", tmp_path / "x.npy", tmp_path / "w2.npy", *out], "eps"),
        (base + ["--convention", "exact", tmp_path / "x.npy", tmp_path / "w2.npy", tmp_path / "q.npy"], "missing"),
    ]
    for args, word in cases:
        proc = fp8ref(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert word in proc.stderr, (word, proc.stderr)
        assert not (tmp_path / "q.npy").exists() and not (tmp_path / "s.npy").exists()
    assert fp8ref("rmsnorm-quant", "--help").returncode == 0


def test_normed_exact_and_rank3(fp8ref, tmp_path):
    """--normed writes y (what the quantizer sees), --exact y/s; a rank-3 input is [B, M, K] rows; --verbose."""
    rng = np.random.default_rng(9)
    B, M, K = 2, 3, 256
    xf = rows(rng, B * M, K, "bf16")
    x, x32, dt = source(xf, "bf16")
    w, w32, _ = source(rng.standard_normal(K), "bf16")
    y = normed_rows(x32, w32, lambda z: cub_mean_square(z, 256), "dtype-twice", dt, rsqrt_cuda)
    want_q, want_s = quant_vllm(y, 128)
    p = {n: tmp_path / f"{n}.npy" for n in ("x", "w", "q", "s", "y", "e")}
    np.save(p["x"], x.reshape(B, M, K))
    np.save(p["w"], w)
    proc = fp8ref("rmsnorm-quant", "--from", "bf16", "--to", "e4m3fn", "--convention", "vllm-rmsnorm-quant",
                  "--normed", p["y"], "--exact", p["e"], "--verbose", p["x"], p["w"], p["q"], p["s"], check=True)
    assert "variance=cub:auto" in proc.stdout and "(2, 3, 2)" in proc.stdout
    q, s, yn, e = np.load(p["q"]), np.load(p["s"]), np.load(p["y"]), np.load(p["e"])
    assert q.shape == (B, M, K) and s.shape == (B, M, 2) and yn.dtype == F32 and e.dtype == np.float64
    yn2 = yn.reshape(B * M, K)
    assert np.array_equal(np.isnan(yn2), np.isnan(y))  # NaN bits: fp8ref 0x7FFF0000 (CUDA's bf16 NaN), ml_dtypes 0x7FC0
    assert np.array_equal(yn2.view(np.uint32)[~np.isnan(y)], y.view(np.uint32)[~np.isnan(y)])
    assert_same("rank 3", q.reshape(B * M, K), want_q, s.reshape(B * M, 2), want_s, None, None)
    sv = np.repeat(s.reshape(B * M, 2).astype(np.float64), 128, axis=1)
    fin = np.isfinite(y)
    assert np.array_equal(e.reshape(B * M, K)[fin], (y.astype(np.float64) / sv)[fin])


def test_rsqrtf_matters(fp8ref, tmp_path):
    """On f32 rows y = RN32(RN32(z*r)*w) shows r directly: the default (cuda-rsqrtf) equals the oracle's table model,
    and --rsqrt rn gives other values on some rows — so the rsqrt model is tested, not absorbed."""
    rng = np.random.default_rng(77)
    M, K = 64, 128
    x32 = (rng.standard_normal((M, K)) * np.exp2(rng.integers(-20, 20, size=(M, 1)))).astype(F32)
    w32 = rng.standard_normal(K).astype(F32)
    y = normed_rows(x32, w32, lambda z: cub_mean_square(z, 128), "dtype-twice", F32, rsqrt_cuda)
    p = {n: tmp_path / f"{n}.npy" for n in ("x", "w", "q", "s", "y", "y2")}
    np.save(p["x"], x32)
    np.save(p["w"], w32)
    base = ["rmsnorm-quant", "--from", "f32", "--to", "e4m3fn", "--convention", "vllm-rmsnorm-quant"]
    fp8ref(*base, "--normed", p["y"], p["x"], p["w"], p["q"], p["s"], check=True)
    fp8ref(*base, "--rsqrt", "rn", "--normed", p["y2"], p["x"], p["w"], p["q"], p["s"], check=True)
    assert np.array_equal(np.load(p["y"]).view(np.uint32), y.view(np.uint32))
    differ = (np.load(p["y2"]).view(np.uint32) != y.view(np.uint32)).any(axis=1).sum()
    assert differ > 0


H200_CASES = ["m64_k1024", "m64_k1024_res", "m300_k2048_res", "m8_k7168"]


@pytest.mark.parametrize("name", H200_CASES)
def test_vllm_port_captured_on_h200(fp8ref, tmp_path, test_data, name):
    """tests/data/h200/rmsnorm_vllm_h200.npz (tools/device/capture_rmsnorm_quant.py): vLLM's rms_norm_per_block_quant
    arithmetic compiled with nvcc for sm_90 and the real cub::BlockReduce + rsqrtf, run on the H200 — codes, scales,
    residual and each row's rms bit for bit. The m300 case (blockDim 256) keeps its first 48 rows: rows are
    independent, so fp8ref runs them with --variance cub:256 (its auto rule would pick 512 for 48 rows). The test
    also shows the capture discriminates: a sequential sum or a correctly rounded rsqrt changes some rms."""
    d = np.load(test_data / "h200" / "rmsnorm_vllm_h200.npz")
    p = {n: tmp_path / f"{n}.npy" for n in ("x", "w", "r", "r2", "q", "s", "rms")}
    np.save(p["x"], d[f"{name}.x"])
    np.save(p["w"], d[f"{name}.w"])
    args = ["rmsnorm-quant", "--from", "bf16", "--to", "e4m3fn", "--convention", "vllm-rmsnorm-quant",
            "--rms", p["rms"]]
    if name == "m300_k2048_res":
        args += ["--variance", "cub:256"]
    res = f"{name}.residual" in d
    if res:
        np.save(p["r"], d[f"{name}.residual"])
        args += ["--residual", p["r"], "--residual-out", p["r2"]]

    def run(*extra):
        fp8ref(*args, *extra, p["x"], p["w"], p["q"], p["s"], check=True)
        return np.load(p["q"]), np.load(p["s"]), np.load(p["rms"])

    q, s, rms = run()
    assert np.array_equal(q, d[f"{name}.q"])
    assert np.array_equal(s.view(np.uint32), d[f"{name}.scale"].view(np.uint32))
    dev_rms = d[f"{name}.rms"]
    fin = ~np.isnan(dev_rms)
    assert np.array_equal(np.isnan(rms), ~fin)
    assert np.array_equal(rms.view(np.uint32)[fin], dev_rms.view(np.uint32)[fin])
    if res:
        assert np.array_equal(np.load(p["r2"]), d[f"{name}.residual_out"])
    if name == "m64_k1024":
        _, _, rms_seq = run("--variance", "f32-seq")
        _, _, rms_rn = run("--rsqrt", "rn")
        assert (rms_seq.view(np.uint32) != dev_rms.view(np.uint32))[fin].any()
        assert (rms_rn.view(np.uint32) != dev_rms.view(np.uint32))[fin].any()


@pytest.mark.parametrize("with_residual", [False, True])
def test_deepseek_rmsnorm_bit_equal(fp8ref, tmp_path, with_residual):
    """deepseek-rmsnorm: z = bf16(x + r) (the caller's bf16 add; CUDA's NaN 0x7FFF), v = the exact mean (fp8ref's
    stand-in for torch's), r = CUDA rsqrtf (the captured table: torch.rsqrt), y = bf16(w * (z * r)), then DeepSeek's
    act_quant with Triton's division — the quant oracle of tests/python/test_quant_oracle.py (deepseek_act_quant)."""
    from test_quant_oracle import deepseek_act_quant
    rng = np.random.default_rng(21 + with_residual)
    M, K = 8, 256
    x, x32, dt = source(rows(rng, M, K, "bf16"), "bf16")
    w, w32, _ = source(rng.standard_normal(K), "bf16")
    r, want_r = None, None
    z = x32
    if with_residual:
        r, r32, _ = source(rows(rng, M, K, "bf16")[::-1].copy(), "bf16")
        z, res = residual_sum(x32, r32, BF16)
        z = res.astype(F32)                                          # residual-sum=dtype: the norm sees bf16(x + r)
        want_r = res.view(np.uint16)
    y = np.empty((M, K), dtype=F32)
    for m in range(M):
        rr = rsqrt_cuda(gpu(mean_square_exact(z[m]) + EPS)[()])
        yb = gpu(w32 * gpu(z[m] * rr)).astype(BF16)                   # (self.weight * x).to(bf16)
        yb.view(np.uint16)[np.isnan(yb)] = 0x7FFF
        y[m] = yb.astype(F32)
    want_q, want_s = deepseek_act_quant(y)
    got_q, got_s, got_r = run_cli(fp8ref, tmp_path, "deepseek-rmsnorm", "bf16", x, w, r)
    assert_same(f"deepseek-rmsnorm residual={with_residual}", got_q, want_q, got_s, want_s, got_r, want_r)


@pytest.mark.parametrize("with_residual", [False, True])
def test_deepseek_rmsnorm_ue8m0_scales(fp8ref, tmp_path, with_residual):
    """deepseek-rmsnorm --scale-dtype ue8m0: DeepSeek-V3.1+'s act_quant with scale_fmt="ue8m0" (s = exp2(ceil(log2(
    amax/448)))) after the same RMSNorm — bit-equal with the oracle as float32 values, as E8M0 codes (--scale-codes),
    and as DeepGEMM's packed int32 words (4 codes a word, MN-major); both backends."""
    from test_quant_oracle import deepseek_act_quant
    rng = np.random.default_rng(33 + with_residual)
    M, K = 6, 640                                                     # 5 groups: the second packed word holds one
    x, x32, _ = source(rows(rng, M, K, "bf16"), "bf16")
    w, w32, _ = source(rng.standard_normal(K), "bf16")
    r, want_r, z = None, None, x32
    if with_residual:
        r, r32, _ = source(rows(rng, M, K, "bf16")[::-1].copy(), "bf16")
        _, res = residual_sum(x32, r32, BF16)
        z, want_r = res.astype(F32), res.view(np.uint16)
    y = np.empty((M, K), dtype=F32)
    for m in range(M):
        rr = rsqrt_cuda(gpu(mean_square_exact(z[m]) + EPS)[()])
        yb = gpu(w32 * gpu(z[m] * rr)).astype(BF16)
        yb.view(np.uint16)[np.isnan(yb)] = 0x7FFF
        y[m] = yb.astype(F32)
    want_q, want_s = deepseek_act_quant(y, ue8m0=True)
    for backend in ("cpu", "reference"):
        got_q, got_s, got_r = run_cli(fp8ref, tmp_path, "deepseek-rmsnorm", "bf16", x, w, r, "--scale-dtype", "ue8m0",
                                      "--backend", backend)
        assert_same(f"deepseek-rmsnorm ue8m0 {backend} residual={with_residual}", got_q, want_q, got_s, want_s, got_r,
                    want_r)
    want_codes = (want_s.view(np.uint32) >> 23).astype(np.uint8)      # powers of two: the exponent field
    _, codes, _ = run_cli(fp8ref, tmp_path, "deepseek-rmsnorm", "bf16", x, w, r, "--scale-dtype", "ue8m0",
                          "--scale-codes")
    assert codes.dtype == np.uint8 and np.array_equal(codes, want_codes)
    _, words, _ = run_cli(fp8ref, tmp_path, "deepseek-rmsnorm", "bf16", x, w, r, "--scale-dtype", "ue8m0",
                          "--scale-layout", "packed-ue8m0")
    assert words.dtype == np.int32 and words.shape == (2, 8)          # [ceil(5/4), align4(M)]
    wu = words.view(np.uint32)
    for p in range(2):
        for j in range(4):
            g = 4 * p + j
            want = want_codes[:, g].astype(np.uint32) if g < 5 else np.zeros(M, dtype=np.uint32)
            assert np.array_equal((wu[p, :M] >> (8 * j)) & 0xFF, want), (p, j)


def test_scale_dtype_errors(fp8ref, tmp_path):
    """A scale dtype the convention's quant does not write, --scale-codes without ue8m0 scales, codes with packed
    words: exit 2 naming the problem, nothing written."""
    rng = np.random.default_rng(5)
    x, _, _ = source(rows(rng, 6, 256, "bf16"), "bf16")
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", np.ones(256, dtype=np.float32).astype(BF16).view(np.uint16))

    def run(*extra):
        r = fp8ref("rmsnorm-quant", "--from", "bf16", "--to", "e4m3fn", *extra, tmp_path / "x.npy", tmp_path / "w.npy",
                   tmp_path / "q.npy", tmp_path / "s.npy")
        assert r.returncode == 2, (extra, r.stdout, r.stderr)
        assert not (tmp_path / "q.npy").exists() and not (tmp_path / "s.npy").exists()
        return r.stderr

    err = run("--convention", "vllm-rmsnorm-quant", "--scale-dtype", "bf16")
    assert "vllm-rmsnorm-quant" in err and "f32 scales, not bf16" in err
    assert "unknown --scale-dtype" in run("--convention", "exact", "--scale-dtype", "e8m0x")
    assert "needs ue8m0 scales, not f32" in run("--convention", "exact", "--scale-codes")
    assert "int32 words" in run("--convention", "exact", "--scale-dtype", "ue8m0", "--scale-codes",
                                "--scale-layout", "packed-ue8m0")


@pytest.mark.parametrize("dt", ["bf16", "f16", "ue8m0"])
def test_exact_scale_dtypes_match_quantize(fp8ref, tmp_path, dt):
    """exact with any scale dtype: the fused op's codes and scales equal `fp8ref quantize --convention exact` with the
    same scale dtype on the normed rows it writes (--normed), on both backends."""
    rng = np.random.default_rng(8)
    x, _, _ = source(rows(rng, 8, 384, "f32"), "f32")
    w = np.linspace(0.25, 2.0, 384, dtype=F32)
    for backend in ("cpu", "reference"):
        q, s, _ = run_cli(fp8ref, tmp_path, "exact", "f32", x, w, None, "--scale-dtype", dt, "--backend", backend,
                          "--normed", tmp_path / "y.npy")
        fin = s[np.isfinite(s)]
        exact_in = {"bf16": fin.astype(BF16).astype(F32), "f16": fin.astype(np.float16).astype(F32),
                    "ue8m0": np.exp2(np.ceil(np.log2(fin))).astype(F32)}[dt]
        assert fin.size and np.array_equal(fin, exact_in), (dt, backend)   # the scales are values of the dtype
        fp8ref("quantize", "--from", "f32", "--to", "e4m3fn", "--convention", "exact", "--granularity", "group:128",
               "--scale-dtype", dt, tmp_path / "y.npy", tmp_path / "q2.npy", tmp_path / "s2.npy", check=True)
        assert np.array_equal(q, np.load(tmp_path / "q2.npy")), (dt, backend)
        assert np.array_equal(s.view(np.uint32), np.load(tmp_path / "s2.npy").view(np.uint32)), (dt, backend)


def test_vllm_weights_of_every_magnitude(fp8ref, tmp_path):
    """vllm-rmsnorm-quant at group 128 under bf16 weights over 80 binades (±0 among them) and rows of tiny z·r: the
    products a1·w that underflow keep their sign (−0: code 0x80) — session 37's AVX2 split lost it (+0: 0x00), which
    the cases above, with N(0, 1.5) weights, never reached. Both backends against the numpy oracle."""
    rng = np.random.default_rng(38)
    M, K = 8, 512                                                    # M <= 256: T = min(K, 512) = 512
    e = rng.integers(-40, 41, K)
    w32 = rng.standard_normal(K) * np.exp2(e)
    w32[rng.integers(0, K, 20)] = -0.0
    w, w32, _ = source(w32, "bf16")
    xs = rng.standard_normal((M, K))
    scale = np.exp2(np.array([-128, -130, -127, -60, -20, 0, -128, -129], dtype=np.float64))[:, None]
    x32 = xs * scale
    x32[6, 100] = 3.0                                                # one large value among tiny ones: z·r subnormal
    x32[7, ::7] = 1e-3
    x, x32, dt = source(x32, "bf16")
    want_q, want_s, _ = oracle("vllm-rmsnorm-quant", x32, w32, None, dt, 512)
    assert np.count_nonzero(want_q == 0x80) > 100                  # −0 codes: the sign of underflowed products
    for backend in ("cpu", "reference"):
        got_q, got_s, _ = run_cli(fp8ref, tmp_path, "vllm-rmsnorm-quant", "bf16", x, w, None, "--backend", backend)
        assert_same(f"vllm wide weights {backend}", got_q, want_q, got_s, want_s, None, None)

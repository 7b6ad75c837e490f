"""`fp8ref scaled-mm` against an independent oracle written here with exact rational arithmetic (fractions.Fraction):
the models exact, f32-kblock (both promotion arithmetics) and hopper-tc, as the contract in include/fp8ref/gemm.h
states them, on small random cases — both backends (reference and cpu), every scaling, e4m3fn / e5m2 / mixed,
f32 / bf16 / f16 outputs, bias before and after the rounding, K not a multiple of 128 (or 32). Shares no code with
the C++ (decoding by ml_dtypes, every rounding by integer arithmetic on Fractions).
"""
import itertools
import math
from fractions import Fraction as Fr

import ml_dtypes
import numpy as np
import pytest

DT = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
EMIN = {"e4m3fn": -6, "e5m2": -14}
# p (significand bits), emin, emax, bias, total bits
OUT = {"f32": (24, -126, 127, 127, 32), "bf16": (8, -126, 127, 127, 16), "f16": (11, -14, 15, 15, 16)}


def floor_log2(x):
    """floor(log2 x) for a positive Fraction."""
    e = x.numerator.bit_length() - x.denominator.bit_length()
    while Fr(2) ** e > x:
        e -= 1
    while Fr(2) ** (e + 1) <= x:
        e += 1
    return e


def round_bits(x, fmt):
    """RNE of the exact Fraction x to fmt's bit pattern (subnormals, overflow to Inf); 0 -> +0."""
    p, emin, emax, bias, total = OUT[fmt]
    if x == 0:
        return 0
    sign = (1 << (total - 1)) if x < 0 else 0
    a = abs(x)
    qe = max(floor_log2(a) - p + 1, emin - p + 1)
    r = a / Fr(2) ** qe
    n = math.floor(r)
    rem = r - n
    if rem > Fr(1, 2) or (rem == Fr(1, 2) and n % 2 == 1):
        n += 1
    if n == 2 ** p:
        n //= 2
        qe += 1
    if n == 0:
        return sign
    if n < 2 ** (p - 1):
        return sign | n
    e = qe + p - 1
    if e > emax:
        return sign | (((1 << (total - p)) - 1) << (p - 1))
    return sign | ((e + bias) << (p - 1)) | (n - 2 ** (p - 1))


def bits_value(bits, fmt):
    """The exact value of a bit pattern (finite only)."""
    if fmt == "f32":
        return Fr(float(np.array([bits], np.uint32).view(np.float32)[0]))
    if fmt == "bf16":
        return Fr(float(np.array([bits], np.uint16).view(ml_dtypes.bfloat16)[0]))
    return Fr(float(np.array([bits], np.uint16).view(np.float16)[0]))


def rn32(x):
    return bits_value(round_bits(x, "f32"), "f32")


def fp8_values(codes, fmt):
    return [Fr(float(v)) for v in codes.view(DT[fmt]).astype(np.float64).ravel()]


def nominal_exp(v, fmt):
    a = abs(v)
    return EMIN[fmt] if a < Fr(2) ** EMIN[fmt] else floor_log2(a)


def trunc(x, g):
    """x truncated toward zero to a multiple of 2^g."""
    q = Fr(2) ** g
    n = math.floor(abs(x) / q)
    return n * q if x >= 0 else -n * q


class Case:
    def __init__(self, rng, fa, fb, scaling, M, N, K):
        self.fa, self.fb, self.scaling, self.M, self.N, self.K = fa, fb, scaling, M, N, K

        def codes(shape, fmt):
            c = rng.integers(0, 256, size=shape, dtype=np.uint8)
            if fmt == "e4m3fn":
                c[(c & 0x7F) == 0x7F] ^= 1
            else:
                bad = (c & 0x7C) == 0x7C
                c[bad] = (c[bad] & 0x80) | 0x7B
            c[rng.random(shape) < 0.1] = 0  # some zeros
            return c

        self.a, self.b = codes((M, K), fa), codes((N, K), fb)
        KB, K32 = -(-K // 128), -(-K // 32)
        if scaling == "mx":
            self.sa = np.ldexp(1.0, rng.integers(-6, 6, size=(M, K32))).astype(np.float32)
            self.sb = np.ldexp(1.0, rng.integers(-6, 6, size=(N, K32))).astype(np.float32)
        else:
            shp = {"tensor": ((1,), (1,)), "rowwise": ((M,), (N,)), "blockwise": ((M, KB), (-(-N // 128), KB)),
                   "group": ((M, KB), (N, KB))}[scaling]
            self.sa = (2.0 ** rng.uniform(-4, 4, size=shp[0])).astype(np.float32)
            self.sb = (2.0 ** rng.uniform(-4, 4, size=shp[1])).astype(np.float32)
        self.bias = (rng.standard_normal(N) * 50).astype(np.float32)
        self.av = [fp8_values(self.a[m], fa) for m in range(M)]
        self.bv = [fp8_values(self.b[n], fb) for n in range(N)]

    def group(self):
        return {"tensor": self.K or 1, "rowwise": self.K or 1, "mx": 32}.get(self.scaling, 128)

    def scales(self, m, n, k):
        s = self.scaling
        if s == "tensor":
            return Fr(float(self.sa[0])), Fr(float(self.sb[0]))
        if s == "rowwise":
            return Fr(float(self.sa[m])), Fr(float(self.sb[n]))
        if s == "mx":
            return Fr(float(self.sa[m, k // 32])), Fr(float(self.sb[n, k // 32]))
        sb = self.sb[n // 128, k // 128] if s == "blockwise" else self.sb[n, k // 128]
        return Fr(float(self.sa[m, k // 128])), Fr(float(sb))

    def dot(self, m, n, k0, k1):
        return sum((self.av[m][k] * self.bv[n][k] for k in range(k0, k1)), Fr(0))

    # ---- the models, one element, returning the exact f32-domain value before the output rounding ----
    def exact(self, m, n, bias_f32):
        g = self.group()
        s = Fr(0)
        for k0 in range(0, self.K, g):
            sa, sb = self.scales(m, n, k0)
            s += self.dot(m, n, k0, min(self.K, k0 + g)) * sa * sb
        return s + (Fr(float(self.bias[n])) if bias_f32 else 0)

    def kblock(self, m, n, kb, arith):
        acc = Fr(0)
        for k0 in range(0, self.K, kb):
            p = rn32(self.dot(m, n, k0, min(self.K, k0 + kb)))
            sa, sb = self.scales(m, n, k0)
            if arith == "mul-mul-add":
                acc = rn32(rn32(rn32(p * sa) * sb) + acc)
            else:
                acc = rn32(rn32(sa * sb) * p + acc)  # fma: one rounding
        return acc

    def hopper(self, m, n, never, split):
        def step(T, k0, k1):
            es = [nominal_exp(self.av[m][k], self.fa) + nominal_exp(self.bv[n][k], self.fb)
                  for k in range(k0, k1) if self.av[m][k] != 0 and self.bv[n][k] != 0]
            if T != 0:
                es.append(floor_log2(abs(T)))
            if not es:
                return T
            g = max(es) - 13
            S = sum((trunc(self.av[m][k] * self.bv[n][k], g) for k in range(k0, k1)), Fr(0)) + trunc(T, g)
            return trunc(S, floor_log2(abs(S)) - 13) if S != 0 else Fr(0)

        blocked = self.scaling in ("blockwise", "group")
        tiles = -(-self.K // 128)
        per = -(-tiles // split)
        acc = None
        for part in range(split):
            A, T = Fr(0), Fr(0)
            for t in range(part * per, min(tiles, (part + 1) * per)):
                kt0, kt1 = t * 128, min(self.K, t * 128 + 128)
                if blocked:
                    T = Fr(0)
                for c0 in range(kt0, kt1, 32):
                    T = step(T, c0, min(kt1, c0 + 32))
                if blocked:
                    sa, sb = self.scales(m, n, kt0)
                    A = rn32(rn32(sa * sb) * T + A)
                elif not never:
                    A, T = rn32(A + T), Fr(0)
            r = T if (never and not blocked) else A
            acc = r if acc is None else rn32(acc + r)
        sa, sb = self.scales(m, n, 0)
        if self.scaling == "tensor":
            return rn32(acc * rn32(sa * sb))
        if self.scaling == "rowwise":
            return rn32(rn32(acc * sb) * sa)
        return acc


def is_inf(bits, out):
    return (bits & 0x7FFFFFFF) == 0x7F800000 if out == "f32" else (bits & 0x7FFF) == (0x7C00 if out == "f16" else 0x7F80)


def expected(case, model, out, bias_mode, cols, kb=128, arith="mul-mul-add", never=False, split=1):
    res = np.zeros((case.M, len(cols)), np.uint32 if out == "f32" else np.uint16)
    for m, (j, n) in itertools.product(range(case.M), enumerate(cols)):
        if model == "exact":
            bits = round_bits(case.exact(m, n, bias_mode == "f32"), out)
        else:
            v = case.kblock(m, n, kb, arith) if model == "f32-kblock" else case.hopper(m, n, never, split)
            if bias_mode == "f32":
                v = rn32(v + Fr(float(case.bias[n])))
            bits = round_bits(v, out)
        if bias_mode == "out" and not is_inf(bits, out):
            bo = bits_value(round_bits(Fr(float(case.bias[n])), out), out)
            bits = round_bits(rn32(bits_value(bits, out) + bo), out)
        res[m, j] = bits
    return res


def run_cli(fp8ref, tmp_path, case, model, out, backend, bias_mode=None, extra=()):
    np.save(tmp_path / "a.npy", case.a)
    np.save(tmp_path / "bt.npy", case.b)
    np.save(tmp_path / "sa.npy", case.sa)
    np.save(tmp_path / "sb.npy", case.sb)
    np.save(tmp_path / "bias.npy", case.bias)
    fmt = case.fa if case.fa == case.fb else f"{case.fa},{case.fb}"
    args = ["scaled-mm", "--format", fmt, "--scaling", case.scaling, "--model", model, "--out-dtype", out,
            "--backend", backend, *extra]
    if bias_mode:
        args += ["--bias", tmp_path / "bias.npy", "--bias-mode", bias_mode]
    out_path = tmp_path / f"out_{backend}.npy"
    fp8ref(*args, tmp_path / "a.npy", tmp_path / "bt.npy", tmp_path / "sa.npy", tmp_path / "sb.npy", out_path,
           check=True)
    got = np.load(out_path)
    want = {"f32": np.float32, "bf16": np.uint16, "f16": np.float16}[out]  # '<f2' for f16, bf16 as bit patterns
    assert got.dtype == want, (out, got.dtype)
    return got.view(np.uint32) if out == "f32" else got.view(np.uint16)


FORMATS = [("e4m3fn", "e4m3fn"), ("e5m2", "e5m2"), ("e4m3fn", "e5m2")]
SCALINGS = ["tensor", "rowwise", "blockwise", "group", "mx"]
OUTS = ["f32", "bf16", "f16"]


def combos():
    i = 0
    for (fa, fb), scaling in itertools.product(FORMATS, SCALINGS):
        for model in ("exact", "f32-kblock", "hopper-tc"):
            if model == "hopper-tc" and scaling == "mx":
                continue
            out = OUTS[i % 3]
            bias = [None, "f32", "out"][(i // 3) % 3]
            K = [40, 300, 200][i % 3] if model != "hopper-tc" else [300, 144, 520][i % 3]
            yield pytest.param(fa, fb, scaling, model, out, bias, K, i, id=f"{fa}-{fb}-{scaling}-{model}-{out}-{bias}-K{K}")
            i += 1


@pytest.mark.parametrize("fa,fb,scaling,model,out,bias,K,seed", list(combos()))
def test_models_against_fraction_oracle(fp8ref, tmp_path, fa, fb, scaling, model, out, bias, K, seed):
    case = Case(np.random.default_rng(seed), fa, fb, scaling, 2, 3 if scaling != "blockwise" else 130, K)
    if scaling == "blockwise":  # two n-blocks; keep the oracle cheap by checking a few columns of each
        cols = [0, 1, 128, 129]
    else:
        cols = list(range(case.N))
    extra = []
    kw = {}
    if model == "f32-kblock" and seed % 2:
        extra, kw = ["--promote-arith", "fma"], {"arith": "fma"}
    if model == "hopper-tc":
        never = seed % 2 == 1 and scaling in ("tensor", "rowwise")
        split = 2 if seed % 4 == 0 else 1
        extra = ["--split-k", str(split)] + (["--promote", "never"] if never else [])
        kw = {"never": never, "split": split}
    if model == "f32-kblock" and scaling == "mx":
        kw["kb"] = 32
    want = expected(case, model, out, bias, cols, **kw)
    for backend in ("reference", "cpu"):
        got = run_cli(fp8ref, tmp_path, case, model, out, backend, bias, extra)
        assert np.array_equal(got[:, cols], want), (backend, got[:, cols], want)


def test_f32_kblock_smaller_blocks(fp8ref, tmp_path):
    case = Case(np.random.default_rng(7), "e4m3fn", "e4m3fn", "group", 2, 3, 200)
    for backend in ("reference", "cpu"):
        got = run_cli(fp8ref, tmp_path, case, "f32-kblock:64", "f32", backend, None, ["--promote-arith", "fma"])
        assert np.array_equal(got, expected(case, "f32-kblock", "f32", None, [0, 1, 2], kb=64, arith="fma"))


def test_exact_rounds_once_where_f32_then_bf16_rounds_twice(fp8ref, tmp_path):
    """Group scaling, K = 256: group 0 sums to 1 + 2^-8 (scales 1), group 1 to 2^-18 (scales 2^-12 each), so the exact
    result is 1 + 2^-8 + 2^-42. bf16 RNE of it is 1 + 2^-7 (above the midpoint); f32 first loses the 2^-42 and leaves
    the bf16 midpoint 1 + 2^-8, which rounds to even: 1.0."""
    a = np.zeros((1, 256), np.uint8)
    b = np.zeros((1, 256), np.uint8)
    a[0, 0], b[0, 0] = 0x38, 0x38  # 1 · 1
    a[0, 1], b[0, 1] = 0x38, 0x02  # 1 · 2^-8 (e4m3fn subnormal 2 · 2^-9)
    a[0, 128], b[0, 128] = 0x01, 0x01  # 2^-9 · 2^-9
    case = Case.__new__(Case)
    case.a, case.b, case.fa, case.fb, case.scaling = a, b, "e4m3fn", "e4m3fn", "group"
    case.sa = np.array([[1.0, 2.0 ** -12]], np.float32)
    case.sb = np.array([[1.0, 2.0 ** -12]], np.float32)
    case.bias = np.zeros(1, np.float32)
    assert round_bits(Fr(1) + Fr(2) ** -8 + Fr(2) ** -42, "bf16") == 0x3F81
    for backend in ("reference", "cpu"):
        assert run_cli(fp8ref, tmp_path, case, "exact", "bf16", backend)[0, 0] == 0x3F81
        assert run_cli(fp8ref, tmp_path, case, "f32-kblock", "bf16", backend)[0, 0] == 0x3F80

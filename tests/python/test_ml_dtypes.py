"""The independent oracle: `fp8ref convert --convention ml_dtypes` against ml_dtypes (numpy astype), bit for bit.

The convention follows the installed ml_dtypes: `ml_dtypes` models 0.7 (f64 arrays rounded once; e8m0 from f32
subnormals by value), `ml_dtypes-0.6` models 0.5 and 0.6 (f64 arrays via f32; e8m0 rounds f32 subnormals above
2^-127 up to 0x01). Each was checked against its own release with this file.

Encode, for e4m3fn, e5m2, e4m3fnuz, e5m2fnuz and ue8m0 (ml_dtypes.float8_e8m0fnu):
  * all 65536 f16 inputs and all 65536 bf16 inputs (bit patterns),
  * >= 10^7 f32 inputs: every representable value and every midpoint between neighbours of every target
    (0 and the smallest subnormal, max and the first value past it included), both signs, each with its
    f32 neighbours +-1 and +-2 ulps; the specials (zeros, infinities, NaNs with payloads); 4M uniformly random
    bit patterns (NaNs and Infs included) and 6M random values spread over the FP8 exponent ranges,
  * f64 inputs (ml_dtypes <= 0.6 rounds them via f32, 0.7 once): midpoints and values +- 1, 2 f64 ulps, the f32 ties around the
    midpoints (double-rounding cases), widened f32 inputs and random f64 patterns.
Decode: all 256 codes of each format to f32 and to f64.
NaN outputs are compared bitwise too. A mismatch lists the inputs, what ml_dtypes gives and what fp8ref gives.
"""
import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

_VERSION = tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2] if p.isdigit())
CONVENTION = "ml_dtypes" if _VERSION >= (0, 7) else "ml_dtypes-0.6"

TARGETS = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
    "ue8m0": ml_dtypes.float8_e8m0fnu,
}
MAN_BITS = {"e4m3fn": 3, "e5m2": 2, "e4m3fnuz": 3, "e5m2fnuz": 2, "ue8m0": 0}
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---- helpers -------------------------------------------------------------------------------------------------


def run_convert(fp8ref, tmp_path, src, arr, to, backend="cpu", tag=""):
    inp = tmp_path / f"in_{src}{tag}.npy"
    out = tmp_path / f"out_{src}_{to}_{backend}{tag}.npy"
    if not inp.exists():
        np.save(inp, arr)
    fp8ref("convert", "--from", src, "--to", to, "--convention", CONVENTION, "--backend", backend, inp, out,
           check=True)
    codes = np.load(out)
    assert codes.dtype == np.uint8 and codes.shape == arr.shape
    return codes


def value_repr(bits, source):
    if source == "bf16":
        return repr(float(np.array([bits], np.uint16).view(ml_dtypes.bfloat16)[0]))
    dt = {"f16": np.float16, "f32": np.float32, "f64": np.float64}[source]
    return repr(float(np.array([bits], UINT[np.dtype(dt).itemsize]).view(dt)[0]))


def assert_bitwise(fmt, source, in_bits, expected, ours, width, what="input"):
    """expected/ours: unsigned integer arrays of output bit patterns; in_bits: the input bit patterns."""
    bad = np.flatnonzero(expected != ours)
    if bad.size == 0:
        return
    out_w = expected.dtype.itemsize * 2
    lines = [f"{fmt} from {source}: {bad.size} of {expected.size} outputs differ from ml_dtypes"]
    # Summary by (ml_dtypes, fp8ref) output pair, then the first few inputs.
    pairs, counts = np.unique(np.stack([expected[bad], ours[bad]]).astype(np.uint64), axis=1, return_counts=True)
    for (e, o), c in sorted(zip(pairs.T.tolist(), counts.tolist()), key=lambda t: -t[1])[:12]:
        idx = bad[(expected[bad] == e) & (ours[bad] == o)]
        ex = ", ".join(f"0x{int(in_bits[i]):0{width}x}" for i in idx[:4])
        lines.append(f"  ml_dtypes 0x{e:0{out_w}x} vs fp8ref 0x{o:0{out_w}x}: {c} {what}s, e.g. {ex}")
    for i in bad[:16]:
        b = int(in_bits[i])
        lines.append(f"  {what} 0x{b:0{width}x} ({value_repr(b, source) if what == 'input' else 'code'}): "
                     f"ml_dtypes 0x{int(expected[i]):0{out_w}x}, fp8ref 0x{int(ours[i]):0{out_w}x}")
    pytest.fail("\n".join(lines), pytrace=False)


def ml_encode(values, fmt):
    with np.errstate(all="ignore"):
        return values.astype(TARGETS[fmt]).view(np.uint8)


def finite_values(fmt):
    """The non-negative finite values of a target, ascending, as float64 (0 included even for ue8m0)."""
    v = np.arange(256, dtype=np.uint8).view(TARGETS[fmt]).astype(np.float64)
    v = v[np.isfinite(v) & (v >= 0)]
    return np.unique(np.concatenate([[0.0], v]))


def boundary_points(fmt):
    """Values, midpoints between neighbours (0 and the smallest value included) and the overflow midpoint."""
    v = finite_values(fmt)
    top = v[-1]
    past = top + 2.0 ** (np.floor(np.log2(top)) - MAN_BITS[fmt])  # the first value past max, with one more exponent
    v = np.concatenate([v, [past]])
    mids = (v[:-1] + v[1:]) / 2
    return v, mids


# ---- inputs --------------------------------------------------------------------------------------------------


def f32_neighbours(points64):
    """f32 bit patterns of +-points and their f32 neighbours +-1, +-2 ulps."""
    b = np.abs(points64).astype(np.float32).view(np.uint32).astype(np.int64)
    out = [b + d for d in (-2, -1, 0, 1, 2)]
    out = np.concatenate(out)
    out = out[(out >= 0) & (out <= 0x7F800000)]
    out = out.astype(np.uint32)
    return np.concatenate([out, out | np.uint32(0x80000000)])


F32_SPECIALS = np.array(
    [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF,
     0xFFFFFFFF, 0x7FA00000, 0xFFA00000, 0x7FE00000, 0x7FD00000, 0xFFF00000, 0x7F900000, 0x00000001, 0x80000001,
     0x007FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000], dtype=np.uint32)


@pytest.fixture(scope="module")
def f32_structured():
    pts = []
    for fmt in TARGETS:
        v, mids = boundary_points(fmt)
        pts += [v, mids]
    return np.unique(np.concatenate([f32_neighbours(np.concatenate(pts)), F32_SPECIALS]))


@pytest.fixture(scope="module")
def f32_inputs(f32_structured):
    rng = np.random.default_rng(20260101)
    uniform = rng.integers(0, 2**32, 4_000_000, dtype=np.uint64).astype(np.uint32)
    n = 6_000_000
    sign = rng.integers(0, 2, n, dtype=np.uint32) << np.uint32(31)
    exp = rng.integers(127 - 30, 127 + 18, n, dtype=np.uint32) << np.uint32(23)
    man = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    ranged = sign | exp | man
    bits = np.concatenate([f32_structured, uniform, ranged])
    assert bits.size >= 10_000_000
    return bits


@pytest.fixture(scope="module")
def f64_inputs(f32_structured):
    rng = np.random.default_rng(64)
    pts = []
    for fmt in TARGETS:
        v, mids = boundary_points(fmt)
        p = np.concatenate([v, mids])
        p = p[p > 0]
        pts.append(p)
        # The f32 ties around each midpoint (x = m +- ulp32(m)/2): f64 -> f32 rounds them to even first.
        half_ulp32 = np.spacing(p.astype(np.float32)).astype(np.float64) / 2
        pts += [p + half_ulp32, p - half_ulp32]
    p = np.concatenate(pts)
    around = [p]
    for k in (1, 2):
        up, down = p.copy(), p.copy()
        for _ in range(k):
            up = np.nextafter(up, np.inf)
            down = np.nextafter(down, 0)
        around += [up, down]
    p = np.concatenate(around + [[1.0625 + 2.0**-40, 1.0625 - 2.0**-40, 464.0 + 2.0**-30, 61440.0 - 2.0**-30]])
    structured = np.concatenate([p, -p]).view(np.uint64)
    widened = f32_structured.view(np.float32).astype(np.float64).view(np.uint64)
    uniform = rng.integers(0, 2**64, 1_000_000, dtype=np.uint64)
    n = 1_000_000
    sign = rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63)
    exp = rng.integers(1023 - 140, 1023 + 130, n, dtype=np.uint64) << np.uint64(52)
    man = rng.integers(0, 1 << 52, n, dtype=np.uint64)
    specials = np.array([0x7FF0000000000001, 0xFFF8000000000000, 0x7FF8000000000001, 0x7FF4000000000000,
                         0xFFFFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000, 0x8000000000000000, 0,
                         0x0000000000000001, 0x47EFFFFFE0000000, 0x47EFFFFFF0000000], dtype=np.uint64)
    return np.unique(np.concatenate([structured, widened, uniform, sign | exp | man, specials]))


# ---- encode --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("fmt", TARGETS)
def test_all_f16(fp8ref, tmp_path, fmt, backend):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    x = bits.view(np.float16)
    ours = run_convert(fp8ref, tmp_path, "f16", x, fmt, backend)
    assert_bitwise(fmt, "f16", bits, ml_encode(x, fmt), ours, 4)


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("fmt", TARGETS)
def test_all_bf16(fp8ref, tmp_path, fmt, backend):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ours = run_convert(fp8ref, tmp_path, "bf16", bits, fmt, backend)
    assert_bitwise(fmt, "bf16", bits, ml_encode(bits.view(ml_dtypes.bfloat16), fmt), ours, 4)


@pytest.mark.parametrize("fmt", TARGETS)
def test_f32(fp8ref, tmp_path_factory, f32_inputs, fmt):
    tmp = tmp_path_factory.getbasetemp() / "f32"
    tmp.mkdir(exist_ok=True)
    x = f32_inputs.view(np.float32)
    ours = run_convert(fp8ref, tmp, "f32", x, fmt)
    assert_bitwise(fmt, "f32", f32_inputs, ml_encode(x, fmt), ours, 8)


@pytest.mark.parametrize("fmt", TARGETS)
def test_f32_midpoints_reference_backend(fp8ref, tmp_path, f32_structured, fmt):
    x = f32_structured.view(np.float32)
    ours = run_convert(fp8ref, tmp_path, "f32", x, fmt, "reference")
    assert_bitwise(fmt, "f32", f32_structured, ml_encode(x, fmt), ours, 8)


def test_midpoints_are_covered(f32_structured):
    # Every midpoint of every target is in the f32 set, exactly, with both signs.
    s = set(f32_structured.tolist())
    for fmt in TARGETS:
        _, mids = boundary_points(fmt)
        m = mids.astype(np.float32)
        assert np.all(m.astype(np.float64) == mids), fmt  # exact in f32
        for b in m.view(np.uint32).tolist():
            assert {b, b - 1, b + 1, b - 2, b + 2, b | 0x80000000} <= s


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("fmt", TARGETS)
def test_f64(fp8ref, tmp_path_factory, f64_inputs, fmt, backend):
    tmp = tmp_path_factory.getbasetemp() / "f64"
    tmp.mkdir(exist_ok=True)
    x = f64_inputs.view(np.float64)
    ours = run_convert(fp8ref, tmp, "f64", x, fmt, backend)
    assert_bitwise(fmt, "f64", f64_inputs, ml_encode(x, fmt), ours, 16)


# ---- decode --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("container", ["f32", "f64"])
@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("fmt", TARGETS)
def test_decode_all_codes(fp8ref, tmp_path, fmt, backend, container):
    codes = np.arange(256, dtype=np.uint32).astype(np.uint8)
    inp, out = tmp_path / "codes.npy", tmp_path / "decoded.npy"
    np.save(inp, codes)
    fp8ref("convert", "--decode", "--from", fmt, "--convention", CONVENTION, "--to-container", container,
           "--backend", backend, inp, out, check=True)
    dt = np.float32 if container == "f32" else np.float64
    ours = np.load(out)
    assert ours.dtype == dt and ours.shape == (256,)
    utype = UINT[np.dtype(dt).itemsize]
    expected = codes.view(TARGETS[fmt]).astype(dt).view(utype)
    assert_bitwise(fmt, f"decode to {container}", codes, expected, ours.view(utype), 2, what="code")

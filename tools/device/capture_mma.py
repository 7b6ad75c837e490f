#!/usr/bin/env python3
"""Capture FP8 mma.sync.m16n8k32 tiles on an H200 (sm_90) for the `mma-sync-sm90` model (NUMERICS.md §5,
research/h200-mma-fp8-model.md).

Builds tools/device/capture_mma.cu with nvcc (-O2 -arch=sm_90), generates tiles with numpy (seeded), runs them
and writes, per format pair, into OUTDIR/mma_sm90/<fa>_<fb>/ the raw-array files
  A.npy [T,16,32] u1 codes, BT.npy [T,8,32] u1 codes (B transposed), C.npy [T,16,8] f4, D.npy [T,16,8] f4,
  kind.npy [T] u1 (tile category, KINDS below)
plus OUTDIR/mma_sm90/README.txt (provenance) and OUTDIR/mma_sm90_sass.txt (cuobjdump of the probe).
Then packs OUTDIR/mma_sm90 into --tar (to unpack under tests/data/h200/).

Tile categories (per pure format; mixed pairs get narrow/wide/spread only):
  narrow   codes 0x30..0x47 with random signs (exact products on a coarse grid: D must be RNE(exact))
  wide     all finite codes
  cancel   k-pairs with A[:,k'] = A[:,k], B[k',:] = -B[k,:] (k' = k^16, k^2, k^1, k^4 or k^8) plus small residues
  spread   a few large entries among tiny ones (subnormals included): long alignment shifts
  subnorm  mostly subnormal codes; for e5m2 a probe where a subnormal input's product is its block's maximum
  special  NaN / Inf codes (Inf x 0 too), C NaN / Inf
  cspecial C in {+-0, +-FLT_MAX, f32 subnormals, -(exact sum)}
  zerosign +-0 codes, exact cancellations, C in {+0, -0}
"""
import argparse
import datetime
import os
import shutil
import subprocess
import sys
import tarfile

import numpy as np

KINDS = ["narrow", "wide", "cancel", "spread", "subnorm", "special", "cspecial", "zerosign"]
HERE = os.path.dirname(os.path.abspath(__file__))


def decode(fmt, codes):
    """Exact f64 values of FP8 codes (NaN for NaN codes, +-Inf for e5m2 Inf)."""
    c = codes.astype(np.int64)
    s = np.where(c & 0x80, -1.0, 1.0)
    if fmt == "e4m3":
        e, m, bias, mb = (c >> 3) & 0xF, c & 7, 7, 3
    else:
        e, m, bias, mb = (c >> 2) & 0x1F, c & 3, 15, 2
    v = np.where(e == 0, m * 2.0 ** (1 - bias - mb), (1 + m / 2.0 ** mb) * 2.0 ** (e - bias))
    v = s * v
    if fmt == "e4m3":
        v = np.where((c & 0x7F) == 0x7F, np.nan, v)
    else:
        v = np.where((c & 0x7F) == 0x7C, s * np.inf, v)
        v = np.where((c & 0x7F) > 0x7C, np.nan, v)
    return v


def finite_codes(fmt):
    c = np.arange(256)
    v = decode(fmt, c.astype(np.uint8))
    return c[np.isfinite(v)].astype(np.uint8)


def codes_with_exp(fmt, lo, hi):
    """Finite codes whose |value| lies in [2^lo, 2^(hi+1)) (subnormals by their value)."""
    c = finite_codes(fmt)
    v = np.abs(decode(fmt, c))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(v > 0, v, 1e-300)))
    return c[(v > 0) & (e >= lo) & (e <= hi)]


def rand_f32(rng, shape, elo, ehi, zero_frac=0.25):
    sign = rng.integers(0, 2, shape, dtype=np.uint32) << 31
    e = rng.integers(elo, ehi + 1, shape).astype(np.int64) + 127
    man = rng.integers(0, 1 << 23, shape, dtype=np.uint32)
    bits = sign | (e.astype(np.uint32) << 23) | man
    bits = np.where(rng.random(shape) < zero_frac, 0, bits).astype(np.uint32)
    return bits.view(np.float32)


def exact_sum(fa, fb, A, BT):
    a, b = decode(fa, A), decode(fb, BT)
    with np.errstate(invalid="ignore"):
        return np.einsum("tmk,tnk->tmn", a, b)  # exact for finite inputs: <= 32 products on a 2^-32 grid


def gen_tiles(rng, fa, fb, kind, T):
    A = np.zeros((T, 16, 32), np.uint8)
    BT = np.zeros((T, 8, 32), np.uint8)
    C = np.zeros((T, 16, 8), np.float32)
    cr = (-30, 30) if "e5m2" not in (fa, fb) else (-40, 40)
    for t in range(T):
        a = rng.choice(finite_codes(fa), (16, 32))
        b = rng.choice(finite_codes(fb), (8, 32))
        c = rand_f32(rng, (16, 8), *cr)
        if kind == "narrow":
            sg = lambda n: (rng.integers(0, 2, n) << 7).astype(np.uint8)  # noqa: E731
            a = rng.integers(0x30, 0x48, (16, 32)).astype(np.uint8) | sg((16, 32))
            b = rng.integers(0x30, 0x48, (8, 32)).astype(np.uint8) | sg((8, 32))
            c = rand_f32(rng, (16, 8), -12, 8)
        elif kind == "cancel":
            mid_a, mid_b = codes_with_exp(fa, -3, 6), codes_with_exp(fb, -3, 6)
            a, b = rng.choice(mid_a, (16, 32)), rng.choice(mid_b, (8, 32))
            x = [16, 2, 1, 4, 8][t % 5]
            ks = [k for k in range(32) if not k & x]
            rng.shuffle(ks)
            for k in ks[:12]:
                a[:, k ^ x] = a[:, k]
                b[:, k ^ x] = b[:, k] ^ 0x80
            for k in ks[12:]:  # residues: small terms, same-ish magnitude as the truncation grid
                a[:, k] = rng.choice(codes_with_exp(fa, -9, -4), 16)
                a[:, k ^ x] = rng.choice(codes_with_exp(fa, -9, 0), 16)
            c = np.where(rng.random((16, 8)) < 0.5, 0, rand_f32(rng, (16, 8), -20, -5)).astype(np.float32)
        elif kind == "spread":
            a = rng.choice(codes_with_exp(fa, -20, -3), (16, 32))
            b = rng.choice(codes_with_exp(fb, -20, -3), (8, 32))
            big_a, big_b = codes_with_exp(fa, 5, 16), codes_with_exp(fb, 5, 16)
            for r in range(16):
                ks = rng.choice(32, rng.integers(1, 4), replace=False)
                a[r, ks] = rng.choice(big_a, len(ks))
            for r in range(8):
                ks = rng.choice(32, rng.integers(1, 4), replace=False)
                b[r, ks] = rng.choice(big_b, len(ks))
            a ^= (rng.integers(0, 2, a.shape) << 7).astype(np.uint8)
            b ^= (rng.integers(0, 2, b.shape) << 7).astype(np.uint8)
        elif kind == "subnorm":
            sub_a = finite_codes(fa)[(finite_codes(fa) & 0x7F) < (8 if fa == "e4m3" else 4)]
            sub_b = finite_codes(fb)[(finite_codes(fb) & 0x7F) < (8 if fb == "e4m3" else 4)]
            if fa == "e5m2" and t % 2 == 0:
                # probe: k0 (and k2) = subnormal x large; all other products far smaller (2^-28 .. 2^-20)
                a = rng.choice(codes_with_exp(fa, -14, -10), (16, 32))
                b = rng.choice(codes_with_exp(fb, -14, -10), (8, 32))
                for k in (0, 2):
                    a[:, k] = rng.choice(sub_a[(sub_a & 0x7F) != 0], 16)
                    b[:, k] = rng.choice(codes_with_exp(fb, 8, 15), 8)
                a ^= (rng.integers(0, 2, a.shape) << 7).astype(np.uint8)
                c = np.zeros((16, 8), np.float32)
            else:
                small_a, small_b = codes_with_exp(fa, -9, 2), codes_with_exp(fb, -9, 2)
                a = np.where(rng.random((16, 32)) < 0.7, rng.choice(sub_a, (16, 32)), rng.choice(small_a, (16, 32)))
                b = np.where(rng.random((8, 32)) < 0.7, rng.choice(sub_b, (8, 32)), rng.choice(small_b, (8, 32)))
                c = np.where(rng.random((16, 8)) < 0.5, 0, rand_f32(rng, (16, 8), -40, -10)).astype(np.float32)
        elif kind == "special":
            nan_a = [0x7F, 0xFF] if fa == "e4m3" else [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
            nan_b = [0x7F, 0xFF] if fb == "e4m3" else [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF]
            inf_a = [] if fa == "e4m3" else [0x7C, 0xFC]
            inf_b = [] if fb == "e4m3" else [0x7C, 0xFC]
            for _ in range(rng.integers(1, 4)):
                r, k = rng.integers(16), rng.integers(32)
                a[r, k] = rng.choice(nan_a + inf_a * 2)
            for _ in range(rng.integers(1, 4)):
                r, k = rng.integers(8), rng.integers(32)
                b[r, k] = rng.choice(nan_b + inf_b * 2)
                if rng.random() < 0.3:
                    a[rng.integers(16), k] = rng.choice([0x00, 0x80])  # Inf x 0
            m = rng.random((16, 8))
            c = np.where(m < 0.1, np.float32(np.nan), c)
            c = np.where((m >= 0.1) & (m < 0.2), np.float32(np.inf), c)
            c = np.where((m >= 0.2) & (m < 0.3), np.float32(-np.inf), c)
            c = c.astype(np.float32)
            if t % 4 == 0:  # a NaN payload and a negative NaN in C
                cb = c.view(np.uint32)
                cb[0, 0], cb[1, 1] = 0x7FA12345, 0xFFC00001
        elif kind == "cspecial":
            s = exact_sum(fa, fb, a[None], b[None])[0]
            choice = rng.integers(0, 6, (16, 8))
            fmax = np.float32(3.4028234663852886e38)
            sub = rand_f32(rng, (16, 8), -127, -127, 0.0).view(np.uint32) & np.uint32(0x807FFFFF)
            c = np.select([choice == 0, choice == 1, choice == 2, choice == 3, choice == 4],
                          [np.where(rng.random((16, 8)) < 0.5, np.float32(0.0), np.float32(-0.0)),
                           np.where(rng.random((16, 8)) < 0.5, fmax, -fmax),
                           sub.view(np.float32),
                           (-s).astype(np.float32),
                           (-s * (1 + 2.0 ** -20)).astype(np.float32)], c).astype(np.float32)
        elif kind == "zerosign":
            a = np.where(rng.random((16, 32)) < 0.6, rng.choice([0x00, 0x80], (16, 32)), a).astype(np.uint8)
            b = np.where(rng.random((8, 32)) < 0.6, rng.choice([0x00, 0x80], (8, 32)), b).astype(np.uint8)
            if t % 2:
                for k in range(0, 32, 2):  # exact cancellation in pairs (k, k^1: the same block)
                    a[:, k ^ 1] = a[:, k]
                    b[:, k ^ 1] = b[:, k] ^ 0x80
            c = rng.choice(np.array([0.0, -0.0], np.float32), (16, 8))
        A[t], BT[t], C[t] = a, b, c
    return A, BT, C


def run_pair(exe, work, fa, fb, A, BT, C):
    T = A.shape[0]
    paths = [os.path.join(work, n) for n in ("A.bin", "BT.bin", "C.bin", "D.bin")]
    A.tofile(paths[0])
    BT.tofile(paths[1])
    C.view(np.uint32).tofile(paths[2])
    subprocess.run([exe, fa, fb, str(T), *paths], check=True)
    return np.fromfile(paths[3], np.uint32).view(np.float32).reshape(T, 16, 8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tar")
    ap.add_argument("--seed", type=int, default=20261201)
    args = ap.parse_args()
    out = os.path.join(args.out, "mma_sm90")
    os.makedirs(out, exist_ok=True)
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "capture_mma")
    src = os.path.join(HERE, "capture_mma.cu")
    subprocess.run(["nvcc", "-O2", "-std=c++17", "-arch=sm_90", "-o", exe, src], check=True)
    sass = subprocess.run(["cuobjdump", "--dump-sass", exe], capture_output=True, text=True).stdout
    with open(os.path.join(args.out, "mma_sm90_sass.txt"), "w") as f:
        f.write(sass)
    ops = sorted({ln.split()[1].split(".")[0] for ln in sass.splitlines() if "MMA" in ln or "F2FP" in ln
                  if len(ln.split()) > 1})
    nvcc_v = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    print("nvcc:", nvcc_v, "| gpu:", gpu)
    print("SASS ops with MMA/F2FP:", ops, "| HMMA.16816.F32 count:", sass.count("HMMA.16816.F32"),
          "| QMMA/HGMMA:", sass.count("QMMA") + sass.count("GMMA"))
    pure = {"narrow": 96, "wide": 256, "cancel": 64, "spread": 64, "subnorm": 64, "special": 32,
            "cspecial": 32, "zerosign": 32}
    mixed = {"narrow": 16, "wide": 64, "spread": 32}
    rng = np.random.default_rng(args.seed)
    summary = []
    for fa, fb in [("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e4m3", "e5m2"), ("e5m2", "e4m3")]:
        plan = pure if fa == fb else mixed
        parts = [gen_tiles(rng, fa, fb, k, n) for k, n in plan.items()]
        A = np.concatenate([p[0] for p in parts])
        BT = np.concatenate([p[1] for p in parts])
        C = np.concatenate([p[2] for p in parts])
        kind = np.concatenate([np.full(n, KINDS.index(k), np.uint8) for k, n in plan.items()])
        D = run_pair(exe, work, fa, fb, A, BT, C)
        D2 = run_pair(exe, work, fa, fb, A, BT, C)  # determinism
        assert np.array_equal(D.view(np.uint32), D2.view(np.uint32)), "nondeterministic output"
        # layout / sanity check: narrow tiles are exact up to the final RNE add of C
        nar = kind == KINDS.index("narrow")
        ex = exact_sum(fa, fb, A[nar], BT[nar]) + C[nar].astype(np.float64)
        ok = (ex.astype(np.float32).view(np.uint32) == D[nar].view(np.uint32)).mean()
        fin = np.isfinite(D).mean()
        nan_bits = sorted({hex(x) for x in D.view(np.uint32)[np.isnan(D)].ravel().tolist()})
        line = (f"{fa}x{fb}: T={len(kind)} narrow RNE(exact) match {ok:.4f}, finite {fin:.4f}, "
                f"NaN patterns {nan_bits}")
        print(line)
        summary.append(line)
        d = os.path.join(out, f"{fa}_{fb}".replace("e4m3", "e4m3fn"))
        os.makedirs(d, exist_ok=True)
        for name, arr in (("A", A), ("BT", BT), ("C", C), ("D", D), ("kind", kind)):
            np.save(os.path.join(d, f"{name}.npy"), arr)
    with open(os.path.join(out, "README.txt"), "w") as f:
        f.write("FP8 mma.sync.aligned.m16n8k32.row.col.f32.<fa>.<fb>.f32 tiles captured on the device\n")
        f.write(f"made by tools/device/capture_mma.py (seed {args.seed}) on {datetime.date.today()}\n")
        f.write(f"gpu: {gpu}\nnvcc: {nvcc_v} (-O2 -arch=sm_90)\n")
        f.write(f"SASS ops: {ops}\n")
        f.write("kind codes: " + ", ".join(f"{i}={k}" for i, k in enumerate(KINDS)) + "\n")
        f.write("\n".join(summary) + "\n")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tf:
            tf.add(out, arcname="mma_sm90")
    shutil.rmtree(work)
    print("done")


if __name__ == "__main__":
    sys.exit(main())

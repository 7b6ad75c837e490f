#!/usr/bin/env python3
"""PTX ex2.approx.ftz.f32 (MUFU.EX2) on sm_90 for x <= 0, the exp2 of FlashInfer's decode (math::ptx_exp2), captured
for fp8ref's model ref::mufu_ex2 (include/fp8ref/attention.h).

capture_mufu_ex2.cu checks on the GPU, over every f32 x in [-150, 0), that ex2(x) = 2^-n·T[trunc(f·2^23)] with
x = -(n + f), n = floor(-x), f in [0, 1), flushed to 0 below 2^-126, where T[k] = ex2(-k·2^-23) (k = 0 .. 2^23; for
x in [-1, 0) it also counts the misses of the other two roundings of f to the grid, nearest and away from zero), and
writes T; with --pos it checks over every f32 in (0, 128) that ex2(n + f) = 2^n·P[trunc(f·2^23)] and writes
P[k] = ex2(k·2^-23) (a table of its own: P[k] is 2·T[2^23 - k] for only 8.6 % of k). This script keeps T and P as the
int8 steps between the bit patterns of consecutive entries (T[0] = P[0] = 1.0; T's steps -3 .. 0, P's 0 .. 3), T's
then P's, zlib-compressed: $OUT/mufu_ex2_sm90.zlib -> reference/data/. And 65,536 test pairs (x, ex2 x): the edges
(0, -0, ±2^-149, -1, -126, -126.5, -149, -150, ±inf, 127.99999, 128, the grid's ends), every negative binade's ends
down to -2^-149, random x in [-1, 0], [0, 1], [0, 128] and [-150, 0]: $OUT/mufu_ex2_pairs.npy uint32 [N, 2] ->
tests/data/h200/.
"""
import os
import subprocess
import sys
import zlib

import numpy as np

out = os.environ.get("OUT", "mufu_capture")
os.makedirs(out, exist_ok=True)
here = os.path.dirname(os.path.abspath(__file__))
exe = "/tmp/capture_mufu_ex2"
subprocess.run(["nvcc", "-O3", "-std=c++17", "-arch=sm_90", "-o", exe, os.path.join(here, "capture_mufu_ex2.cu")],
               check=True)
run = subprocess.run([exe, "/tmp/ex2_table.bin"], capture_output=True, text=True, check=True)
print(run.stdout.strip(), flush=True)
if " toward zero 0," not in run.stdout or "scaling misses 0" not in run.stdout:
    sys.exit("the model does not hold on this GPU")
pos = subprocess.run([exe, "--pos", "/tmp/ex2_pos.bin"], capture_output=True, text=True, check=True)
print(pos.stdout.strip(), flush=True)
if "(0, 128): 0;" not in pos.stdout:
    sys.exit("the positive model does not hold on this GPU")
t = np.fromfile("/tmp/ex2_table.bin", np.float32).view(np.uint32).astype(np.int64)
p = np.fromfile("/tmp/ex2_pos.bin", np.float32).view(np.uint32).astype(np.int64)
assert t[0] == 0x3F800000 and p[0] == 0x3F800000
steps = np.concatenate([np.diff(t), np.diff(p)])
assert steps.min() >= -128 and steps.max() <= 127
open(os.path.join(out, "mufu_ex2_sm90.zlib"), "wb").write(zlib.compress(steps.astype(np.int8).tobytes(), 9))
print("steps", np.bincount(steps - steps.min()), "from", steps.min(), flush=True)

rng = np.random.default_rng(20261206)
edges = [0.0, -0.0, -2.0 ** -149, -2.0 ** -24, -2.0 ** -23, -1.0, -1.0 + 2.0 ** -24, -126.0, -126.5, -149.0, -150.0,
         -np.inf]
binades = [-(2.0 ** e) for e in range(-149, 8)] + [-np.nextafter(np.float32(2.0 ** e), np.float32(0)) for e in
                                                    range(-148, 8)]
pos_edges = [2.0 ** -149, 2.0 ** -23, 1.0, 1.0 - 2.0 ** -24, 127.0, 127.99999, 128.0, np.inf]
x = np.concatenate([np.array(edges + binades + pos_edges, np.float32),
                    -rng.uniform(0, 1, 16384).astype(np.float32), rng.uniform(0, 1, 8192).astype(np.float32),
                    rng.uniform(0, 128, 8192).astype(np.float32),
                    -rng.uniform(0, 150, 65536 - len(edges) - len(binades) - len(pos_edges) - 32768).astype(
                        np.float32)])
x.tofile("/tmp/ex2_in.bin")
subprocess.run([exe, "--apply", "/tmp/ex2_in.bin", "/tmp/ex2_out.bin"], check=True)
y = np.fromfile("/tmp/ex2_out.bin", np.float32)
np.save(os.path.join(out, "mufu_ex2_pairs.npy"), np.stack([x.view(np.uint32), y.view(np.uint32)], axis=1))
print("pairs", len(x), flush=True)

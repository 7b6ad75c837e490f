#!/usr/bin/env bash
# bench_gemm_fast (the `fast` scaled_mm vs oneDNN bf16 in the same run) and, where torch is importable, the torch CPU
# _scaled_mm anchor (tensorwise; bench/anchor_torch_scaled_mm.py, given the same options) right after it. torch is no
# project dependency: point TORCH_PYTHON at an interpreter that has it (e.g. a venv with `pip install torch`).
# Usage: BUILD=build-NAME bash bench/run_gemm_fast.sh [--reps R] [--shape M,N,K ...]
exec bash "$(dirname "$0")/run_with_torch_anchor.sh" bench_gemm_fast anchor_torch_scaled_mm.py "$*" "$@"

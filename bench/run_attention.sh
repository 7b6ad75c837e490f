#!/usr/bin/env bash
# bench_attention (paged decode over an FP8 cache vs a read pass over the cache, same run) and, where torch is
# importable, the torch CPU SDPA anchor on the same problem (bench/anchor_torch_sdpa.py) right after it. torch is no
# project dependency: point TORCH_PYTHON at an interpreter that has it (e.g. a venv with `pip install torch`).
# Usage: BUILD=build-NAME bash bench/run_attention.sh [bench_attention options, e.g. --reps 5]
exec bash "$(dirname "$0")/run_with_torch_anchor.sh" bench_attention anchor_torch_sdpa.py "" "$@"

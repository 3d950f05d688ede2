#!/usr/bin/env bash
# cuBLAS against cuBLASLt at the verify step's row counts in one device call (<= 6 minutes),
# from the repository root (issue 38 item 4; docs/benchmarks.md section 10): both libraries at
# Qwen2.5-1.5B's projection shapes and 1 to 224 rows, Inductor's autotuned choice at 16 rows,
# then the CUDA tests of this session's builds (the bench's, training over the draft
# vocabulary). Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/blas_rows.sh "$OUT"
. scripts/device/timed_steps.sh

step libraries 120 python "$bench/bench_blas_rows.py" --rows 1 16 32 64 112 224 \
  --out "$out/blas_rows.json"
step autotune 170 python "$bench/bench_blas_rows.py" --autotune --rows 16 \
  --shapes qkv o_proj gate_up down --out "$out/blas_rows_autotune.json"
step tests 150 python -m pytest -q test/registered/layers/test_bench_blas_rows.py \
  test/registered/speculative/test_train_dflash_cuda.py
cat "$out/status.txt"

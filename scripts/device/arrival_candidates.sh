#!/usr/bin/env bash
# What an arrival costs a served step at 32 requests, in one device call from the repository
# root (issue 39; docs/benchmarks.md section 9e): the packed extend attention's CUDA tests and
# the fixed narrower-widths test, the extend attention per layer call (per query head against
# GQA-packed, each at fixed splits), the mixed graph against the verify / decode and prefill
# graphs it replaces with its kernel table (the Qwen2.5-1.5B shapes at the static schedule's
# width 8 at 32 requests), then served traffic at 32 requests with rows to spare, mixed steps
# with and without the prefill delayer gathering arrivals (at most 530 s by the steps'
# limits). Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/arrival_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 100 python -m pytest -q -x -s \
  test/registered/attention/test_triton_backend_cuda.py -k "extend or narrower" \
  "test/registered/speculative/test_dflash_worker_draft_len_cuda.py::test_static_narrower_widths_with_cuda_graphs"
step extend 55 python "$bench/bench_extend_attention.py" --splits 1 2 4 --iters 50 \
  --out "$out/extend_attention.json"
step mixed 120 python "$bench/bench_mixed_step.py" --target qwen2.5-1.5b-shaped \
  --draft qwen2.5-1.5b-shaped-dflash --bs 32 --verify-width 8 --widths 1 2 4 --prefix 820 \
  --new 78 --vocab 150000 --kernels 16 --out "$out/mixed_step_qwen.json"
# four engines (each captures its step, mixed and prefill graphs up to 40 requests): the
# 170 s that call 4 of 2026-12-05's sixth session gave them ran out before any printed
step served 255 python "$bench/bench_dflash_served.py" --bs 32 --max-running-requests 40 \
  --configs target_mixed dflash_mixed target_mixed_delay dflash_mixed_delay \
  --out "$out/dflash_served_arrivals.json"
cat "$out/status.txt"

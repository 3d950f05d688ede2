#!/usr/bin/env bash
# The verify side on the H200 in one device call (<= 7 minutes), from the repository root:
# issue 39 item 2's ragged verify attention and item 3's draft length schedule, their CUDA
# tests first, then the bench that decides the attention, then the DFlash step bench (issue 39
# item 1: static and compact, the step costs the schedule reads). Writes JSON and logs under
# OUT; each step's exit status is in OUT/status.txt.
#
#   bash scripts/device/verify_candidates.sh "$OUT"
. scripts/device/timed_steps.sh
export PYTHONPATH=$PYTHONPATH:$PWD/benchmark/spec_decode

step tests 165 python -m pytest -q \
  test/registered/model_executor/test_ragged_step_prologue_cuda.py \
  "test/registered/attention/test_triton_backend_cuda.py::test_ragged_verify_graph_matches_torch_native" \
  test/registered/speculative/test_dflash_worker_draft_len_cuda.py \
  test/registered/speculative/test_dspark_worker_cuda.py \
  test/registered/speculative/test_acceptance_law_cuda.py
# the ragged verify attention against the per-token path and the static layout
step ragged_attention 55 python "$bench/bench_decode_attention.py" --ragged --bs 1 8 32 \
  --contexts 900 --q-lens 16 --out "$out/ragged_verify_attention.json"
# a DFlash step at 1, 8 and 32 requests, static and compact, against target-only
step dflash_step 150 python "$bench/bench_dflash_step.py" --bs 1 8 32 \
  --out "$out/dflash_step.json"
cat "$out/status.txt"

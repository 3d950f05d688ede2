#!/usr/bin/env bash
# Issue 38 item 2's kernel candidates on the H200, in one device call (<= 8 minutes), from the
# repository root: their CUDA tests, then every bench row that decides them against today's
# default in the same run (docs/kernels.md, "Candidates"). Writes JSON and logs under OUT.
#
#   bash scripts/device/kernel_candidates.sh "$OUT"
#
# Each step has its own time limit, so a slow one leaves the others' results; a step's exit
# status is in OUT/status.txt.
. scripts/device/timed_steps.sh

step tests 140 python -m pytest -q -x \
  test/registered/layers/test_paired_row_gemv_cuda.py \
  test/registered/layers/test_grid_dependency_cuda.py \
  test/registered/layers/test_row_gemv_cuda.py test/registered/layers/test_triton_ops_cuda.py \
  "test/registered/attention/test_triton_backend_cuda.py::test_cuda_graph_replay_matches_torch_native"
# PDL on each GEMV, and the paired GEMVs against their two launches (with and without PDL)
step gemv 80 python "$bench/bench_gemv.py" --iters 100 --pdl --out "$out/gemv_candidates.json"
# single pass against split + merge, short to the step's 900-token contexts
step attention 100 python "$bench/bench_decode_attention.py" --bs 1 8 \
  --contexts 128 256 512 900 2048 --q-lens 1 16 \
  --single-pass 64:4:2 128:4:2 128:8:2 256:8:1 --out "$out/decode_attention_candidates.json"
# the whole bs-1 step with and without PDL (the row GEMV backend, today's default)
for pdl in off on; do
  step "replay_pdl_$pdl" 75 python "$bench/bench_graph_replay.py" \
    --presets qwen2.5-1.5b-shaped --decode-bs 1 8 --verify-bs --decode-gemv-backend triton \
    --pdl "$pdl" --out "$out/replay_pdl_$pdl.json"
done
cat "$out/status.txt"

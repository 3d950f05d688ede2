#!/usr/bin/env bash
# The attention key loop's early loads in one device call (<= 3 minutes), from the repository
# root (issues 38 and 39; docs/kernels.md, "The key loop's early loads"): its CUDA test (the
# plain loop's bits), then the per-layer-call bench at Qwen2.5-1.5B's heads, the launch path
# against the early one, query row tiles of 32 (a verify's 96 GQA rows unpadded) and both,
# decode and the 16-token verify at 1, 8 and 32 requests, 900 and 4,096 keys. Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/attention_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 150 python -m pytest -q \
  "test/registered/attention/test_triton_backend_cuda.py::test_early_loads_equal_the_plain_loop" \
  "test/registered/attention/test_triton_backend_cuda.py::test_row_tiles_of_32_match_torch_native"
step attention 120 python "$bench/bench_decode_attention.py" --bs 1 8 32 --contexts 900 4096 \
  --q-lens 1 16 --min-split-keys --early-loads --max-rows 32 --out "$out/attention_early.json"
cat "$out/status.txt"

#!/usr/bin/env bash
# Issue 38 item 3 on the H200 in one device call (<= 7 minutes), from the repository root:
# FlashInfer installed from .carry/flashinfer (its attention, norm, SiLU-and-mul and RoPE
# modules compiled ahead here: stage_flashinfer.sh --aot, so nothing is JIT-built unless a
# module does not load), its CUDA tests, then its attention and elementwise kernels beside ours
# (docs/kernels.md, "Libraries"). Writes JSON and logs under OUT; each step's exit status is in
# OUT/status.txt.
#
#   run(command="bash scripts/device/flashinfer_candidates.sh $OUT", carry=[".carry/flashinfer"])
. scripts/device/timed_steps.sh
bash scripts/device/stage_flashinfer.sh --install >"$out/install.log" 2>&1
status=$?
cat "$out/install.log"
[ $status = 0 ] || exit $status
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/benchmark/spec_decode

step tests 150 python -m pytest -q \
  test/registered/attention/test_bench_flashinfer_attention_cuda.py \
  test/registered/layers/test_bench_flashinfer_elementwise_cuda.py
step attention 150 python "$bench/bench_flashinfer_attention.py" --bs 1 8 32 \
  --contexts 900 4096 --q-lens 1 16 --out "$out/flashinfer_attention.json"
step elementwise 60 python "$bench/bench_flashinfer_elementwise.py" --rows 1 8 16 32 512 \
  --out "$out/flashinfer_elementwise.json"
cat "$out/status.txt"

#!/usr/bin/env bash
# The draft length per batch size on the H200 in one device call (about 7 minutes), from the
# repository root (issue 39 item 3; docs/benchmarks.md, "Not measured yet"): the schedule's
# CUDA tests (static verify's narrower graphs, its law, compact's ragged ones), static verify
# at fixed narrower widths against target-only, then the schedule each server derives at
# start-up from the Qwen GSM8K profile and its own graphs' costs, run as a server runs it.
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/draft_len_candidates.sh "$OUT"
set -uo pipefail
out=${1:?usage: draft_len_candidates.sh OUT_DIR}
mkdir -p "$out"
export PYTHONPATH=$PWD/python
bench=benchmark/spec_decode

. scripts/device/timed_steps.sh

step tests 150 python -m pytest -q -x -s \
  test/registered/speculative/test_dflash_worker_draft_len_cuda.py \
  "test/registered/speculative/test_acceptance_law_cuda.py::test_static_verify_narrower_than_the_block_keeps_the_law" \
  "test/registered/speculative/test_dflash_worker_cuda.py::test_narrower_verify_widths_equal_target_only_with_cuda_graphs"
# compact verify's ragged attention with its request slots bounded (the new default) beside
# one slot per token (before) and the static layout
step ragged_attention 90 python "$bench/bench_decode_attention.py" --ragged --bs 1 8 32 \
  --contexts 900 --q-lens 16 --out "$out/ragged_verify_attention.json"
# one static width at every batch size, the profile truncated to it: what each width pays
step widths 200 python "$bench/bench_dflash_step.py" --bs 1 8 16 32 --verify-modes static \
  --widths 4 6 8 12 16 --out "$out/dflash_step_widths.json"
# each server's own schedule (static: derived once, its narrower graphs captured; compact:
# its ragged buckets), each batch size at its width
step derived 200 python "$bench/bench_dflash_step.py" --bs 1 8 16 32 \
  --verify-modes static compact --schedule derived --out "$out/dflash_step_derived.json"
cat "$out/status.txt"

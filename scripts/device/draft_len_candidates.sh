#!/usr/bin/env bash
# The draft length per batch size on the H200 in one device call, from the repository root
# (issue 39 item 3; docs/benchmarks.md section 9c and "Not measured yet"): the schedule's CUDA
# tests (static verify's narrower graphs, its draft's narrower LM head, its mixed steps, its
# law, compact's ragged ones), each server's schedule derived at start-up from the Qwen GSM8K
# profile and its own graphs' costs (the draft timed at one proposal a request too) run as a
# server runs it, up to 128 requests, then served traffic (closed loops of requests, their
# prefills and mixed steps too: bench_dflash_served.py), target-only and DFlash, arrivals
# prefilled apart and in mixed steps (at most 595 s by the steps' limits; the fixed static
# widths of section 9c, measured on the H200 on 2026-12-05, no longer run here:
# `bench_dflash_step.py --bs 16 32 64 --verify-modes static --widths 4 6 8 12 16`).
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/draft_len_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 180 python -m pytest -q -x -s \
  test/registered/speculative/test_dflash_worker_draft_len_cuda.py \
  "test/registered/speculative/test_acceptance_law_cuda.py::test_static_verify_narrower_than_the_block_keeps_the_law" \
  "test/registered/speculative/test_dflash_worker_cuda.py::test_narrower_verify_widths_equal_target_only_with_cuda_graphs"
# each server's own schedule (static: derived once, its narrower verify and draft graphs
# captured), each batch size at its width; the report's server_schedule holds the costs
step derived 200 python "$bench/bench_dflash_step.py" --bs 1 8 16 32 64 128 \
  --verify-modes static --schedule derived --out "$out/dflash_step_derived.json"
# served traffic as the GSM8K harness sends it (a request ends after ~122 tokens, a new one
# with a cached prefix and 78 new prompt tokens comes at once): target-only and DFlash, their
# arrivals prefilled apart or in mixed steps
step served 215 python "$bench/bench_dflash_served.py" --bs 1 8 32 \
  --out "$out/dflash_served.json"
cat "$out/status.txt"

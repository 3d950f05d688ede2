#!/usr/bin/env bash
# The kernel candidates left after the paired row GEMVs (measured 2026-12-05 and shipped): the
# verify attention's splits and merges, the GEMV K tiles under PDL (the decode attention and its
# merge launched dependent lost on an H100 on 2026-12-05 and are removed); on the H200 in one
# device call (about 2 minutes), from the repository root (docs/kernels.md, "Candidates"). The
# draft length schedule's figures: draft_len_candidates.sh. Writes JSON and logs under OUT; each
# step's exit status in OUT/status.txt.
#
#   bash scripts/device/fusion_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 120 python -m pytest -q -x \
  test/registered/layers/test_paired_row_gemv_cuda.py test/registered/layers/test_row_gemv_cuda.py \
  "test/registered/attention/test_triton_backend_cuda.py::test_cuda_graph_replay_matches_torch_native" \
  test/registered/layers/test_grid_dependency_cuda.py
# verify (16 tokens) and decode attention at the step's context: fixed key splits, one row
# tile for a request's 96 GQA rows, each split with the merge of one head a program and of
# tiling.MERGE_HEADS (the default)
step attention 120 python "$bench/bench_decode_attention.py" --bs 1 8 32 --contexts 900 \
  --q-lens 1 16 --min-split-keys --splits 1 2 4 8 --merge-heads 1 \
  --out "$out/verify_attention_candidates.json"
# one K tile (2048 >= 1536) for the K = 1536 projections, launched dependent: with PDL the
# whole weight slice is requested before the wait on the kernel before (today: 1024-wide
# tiles, the first one before the wait)
step gemv_tiles 120 python "$bench/bench_gemv.py" --iters 100 --pdl \
  --shapes qkv o_proj gate_up down \
  --row-configs 2:1024:4:1 8:1024:8:1 4:512:4:3 2:2048:4:1 4:2048:4:1 4:2048:8:1 8:2048:8:1 \
  --out "$out/gemv_tiles.json"
cat "$out/status.txt"

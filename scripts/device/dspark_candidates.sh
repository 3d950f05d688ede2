#!/usr/bin/env bash
# DSpark's step on the GPU in one device call (<= 10 minutes), from the repository root (issue 41
# item 4; docs/benchmarks.md sections 9i-9k, docs/kernels.md "DSpark's Markov loop"): the Markov
# loop's tiles and the certified top-K path at both ends of its certificates
# (`bench_markov_argmax.py --bias-scales 1 0.001`), then the draft block graphs at the recipes'
# shapes (SmolLM2 and Qwen2.5-1.5B, dummy weights) with kernel tables, each in its own process:
# DFlash's draft block and the verify, DSpark's with the exact kernel (the default), and with the
# certified top-K path (SGLANG_AUX_MARKOV_TOPK=64); last, the top-K path's CUDA tests (the
# exact kernel's passed on 2026-12-06; both files from a cold Triton cache took 363 s).
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/dspark_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tiles 200 python "$bench/bench_markov_argmax.py" --bs 1 8 16 32 \
  --tiles 16:4:0 32:8:1:3:128 --topk 64 --bias-scales 1 0.001 --out "$out/markov_tiles.json"
replay=(--presets smollm2-shaped qwen2.5-1.5b-shaped --decode-bs --draft-bs 1 8 16 32
        --context 900 --kernel-table 14)
step dflash 150 python "$bench/bench_graph_replay.py" "${replay[@]}" --verify-bs 1 8 32 \
  --draft-algorithms dflash --out "$out/replay_dflash.json"
SGLANG_AUX_MARKOV_TOPK=0 step kernel 90 python "$bench/bench_graph_replay.py" \
  "${replay[@]}" --verify-bs --draft-algorithms dspark --out "$out/replay_kernel.json"
SGLANG_AUX_MARKOV_TOPK=64 step topk 90 python "$bench/bench_graph_replay.py" \
  "${replay[@]}" --verify-bs --draft-algorithms dspark --out "$out/replay_topk.json"
grep -hE "^ *(smollm2|qwen2\.5-1\.5b)-shaped " "$out/dflash.log" "$out/kernel.log" "$out/topk.log"
step tests 300 python -m pytest -q test/registered/speculative/test_markov_topk_kernel_cuda.py
cat "$out/status.txt"

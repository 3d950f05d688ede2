#!/usr/bin/env bash
# DSpark's step on the GPU in one device call (<= 10 minutes), from the repository root (issue 41
# item 4; docs/benchmarks.md sections 9i, 9j): the draft block graphs of DFlash and DSpark at the
# recipes' shapes (SmolLM2 and Qwen2.5-1.5B, dummy weights) with kernel tables, DSpark's Markov
# loop as the torch loop (SGLANG_AUX_MARKOV_ARGMAX=0) and as the kernel (=1, the default), each in
# its own process; before them the kernel's tiles and the top-K candidates' kernel
# (`bench_markov_argmax.py`), after them DSpark's draft block with the top-K kernel
# (SGLANG_AUX_MARKOV_TOPK=64), then the two kernels' CUDA tests.
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/dspark_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tiles 240 python "$bench/bench_markov_argmax.py" --bs 1 8 32 64 \
  --tiles 16:4:0 32:8:1:3:128 --topk 64 256 --out "$out/markov_tiles.json"
replay=(--presets smollm2-shaped qwen2.5-1.5b-shaped --decode-bs --draft-bs 1 8 32 --context 900
        --kernel-table 14)
SGLANG_AUX_MARKOV_ARGMAX=0 step loop 150 python "$bench/bench_graph_replay.py" "${replay[@]}" \
  --verify-bs 1 8 32 --draft-algorithms dflash dspark --out "$out/replay_loop.json"
SGLANG_AUX_MARKOV_ARGMAX=1 step kernel 90 python "$bench/bench_graph_replay.py" \
  "${replay[@]}" --verify-bs --draft-algorithms dspark --out "$out/replay_kernel.json"
SGLANG_AUX_MARKOV_TOPK=64 step topk 90 python "$bench/bench_graph_replay.py" \
  "${replay[@]}" --verify-bs --draft-algorithms dspark --out "$out/replay_topk.json"
grep -hE "^ *(smollm2|qwen2\.5-1\.5b)-shaped " "$out/loop.log" "$out/kernel.log" "$out/topk.log"
# last: the CUDA tests (about 5 minutes of compiling with a cold Triton cache, less after the
# benches), within the call's 600 s
step tests 270 python -m pytest -q \
  test/registered/speculative/test_markov_argmax_kernel_cuda.py \
  test/registered/speculative/test_markov_topk_kernel_cuda.py
cat "$out/status.txt"

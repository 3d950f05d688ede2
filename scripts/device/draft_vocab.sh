#!/usr/bin/env bash
# The draft vocabulary on the GPU in one device call (<= 10 minutes), from the repository root
# (issues 39 and 41; `--speculative-token-map`, docs/benchmarks.md section 10): the draft block
# graphs at the recipes' shapes (SmolLM2 and Qwen2.5-1.5B, dummy weights) with the whole
# vocabulary and with the first 32,768 ids, for DFlash's draft and DSpark's (its exact Markov
# kernel over markov_w2's 32,768 rows), kernel tables; then the draft vocabulary's CUDA tests
# (the engines' graphs equal eager and stay lossless; the mapped Markov kernel against the loop).
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt. The tests compile
# the Markov kernels on a cold Triton cache (minutes), so PART splits the work over two calls.
#
#   bash scripts/device/draft_vocab.sh "$OUT" [replay|tests|all]
. scripts/device/timed_steps.sh
part=${2:-all}

replay=(--presets smollm2-shaped qwen2.5-1.5b-shaped --decode-bs --verify-bs 1 --context 900
        --draft-bs 1 8 16 32 --kernel-table 14 --draft-vocabs 0 32768)
if [[ $part != tests ]]; then
step dflash 200 python "$bench/bench_graph_replay.py" "${replay[@]}" --draft-algorithms dflash \
  --out "$out/replay_dflash.json"
step dspark 200 python "$bench/bench_graph_replay.py" "${replay[@]}" --draft-algorithms dspark \
  --out "$out/replay_dspark.json"
grep -hE "^ *(smollm2|qwen2\.5-1\.5b)-shaped " "$out/dflash.log" "$out/dspark.log"
fi
[[ $part == replay ]] && { cat "$out/status.txt"; exit; }
tests_limit=170
[[ $part == tests ]] && tests_limit=560
step tests "$tests_limit" python -m pytest -q \
  "test/registered/speculative/test_dflash_worker_cuda.py::test_draft_vocabulary_graphs_equal_eager_and_stay_lossless" \
  "test/registered/speculative/test_dspark_worker_cuda.py::test_a_draft_vocabulary_graphs_equal_eager_and_stay_lossless" \
  test/registered/speculative/test_markov_argmax_kernel_cuda.py
cat "$out/status.txt"

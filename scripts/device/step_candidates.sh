#!/usr/bin/env bash
# The two candidates written on 2026-12-05 (eighth session) for the steps the H100 measured,
# in one device call from the repository root (at most 560 s by the steps' limits): a mixed
# step's arrivals attending on a side stream beside the step's rows
# (SGLANG_AUX_MIXED_ATTENTION_STREAMS=2; issue 39, an arrival costs ~1 ms, half of it the
# extend attention's latency) and the wider K tile of the row GEMV for o_proj and down
# (SGLANG_AUX_ROW_GEMV_NARROW_TILE=4:2048:8:1; issue 38, 1.10x and 1.13x per call under PDL).
# Each against the default in the same call: the CUDA tests, the bs-1 decode replay (tile,
# alternating), the mixed graph at 32 requests (streams), then served traffic at 32 with
# streams 1 and 2. Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/step_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 110 python -m pytest -q -x \
  "test/registered/managers/test_scheduler_mixed_chunk_cuda.py::test_mixed_attention_on_a_side_stream_changes_no_bit" \
  test/registered/layers/test_row_gemv_cuda.py
tile=SGLANG_AUX_ROW_GEMV_NARROW_TILE
for t in 2:1024:4:1 4:2048:8:1 2:1024:4:1 4:2048:8:1; do
  step "replay_tile_$t" 50 env "$tile=$t" python "$bench/bench_graph_replay.py" \
    --presets qwen2.5-1.5b-shaped --decode-bs 1 --verify-bs --decode-gemv-backend triton \
    --kernel-table 0 --out "$out/replay_tile_${t//:/-}_$SECONDS.json"
done
step mixed 130 python "$bench/bench_mixed_step.py" --target qwen2.5-1.5b-shaped \
  --draft qwen2.5-1.5b-shaped-dflash --bs 32 --verify-width 8 --widths 1 2 4 --prefix 820 \
  --new 78 --vocab 150000 --kernels 16 --attention-streams 1 2 \
  --out "$out/mixed_step_streams.json"
for s in 1 2; do
  step "served_streams$s" 130 env SGLANG_AUX_MIXED_ATTENTION_STREAMS=$s python \
    "$bench/bench_dflash_served.py" --bs 32 --max-running-requests 40 \
    --configs target_mixed dflash_mixed --out "$out/served_streams$s.json"
done
cat "$out/status.txt"

#!/usr/bin/env bash
# The L2 prefetch of a bs-1 decode layer in one device call (<= 9 minutes), from the repository
# root (issue 38; docs/kernels.md, "The L2 prefetch"): its CUDA test, the DECODE bs-1 replays
# of the Qwen2.5-1.5B- and SmolLM2-shaped presets (dummy weights, context 900, the row GEMV) at each budget, line by
# line and in bulk requests, each in its own process, some again later so drift shows;
# then the paired GEMVs' CUDA tests and the decode graph runner's with a 16 MiB budget.
# Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/l2_prefetch_candidates.sh "$OUT"
. scripts/device/timed_steps.sh

step tests 150 python -m pytest -q test/registered/layers/test_l2_prefetch_cuda.py
replay=(--presets qwen2.5-1.5b-shaped smollm2-shaped --decode-bs 1 --verify-bs --context 900
        --decode-gemv-backend triton)
# each run: budget in MiB, then 1 for 16 KiB bulk requests (0: line by line)
runs=(0:0 4:0 8:0 16:0 24:0 8:1 16:1 0:0 16:0 16:1)
for i in "${!runs[@]}"; do
  mib=${runs[$i]%:*} bulk=${runs[$i]#*:} table=0
  if [ "$i" -lt 7 ] && { [ "$mib" = 0 ] || [ "$mib" = 16 ]; }; then table=16; fi
  name="replay_${i}_${mib}_$bulk"
  step "$name" 90 python "$bench/bench_graph_replay.py" "${replay[@]}" --l2-prefetch "$mib" \
    --l2-prefetch-bulk "$bulk" --kernel-table "$table" --out "$out/$name.json"
done
for f in "$out"/replay_*.json; do
  python - "$f" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(f"{r['preset']:>20} {r['l2_prefetch_mib']:>3} MiB bulk {r['l2_prefetch_bulk']}  "
          f"{r['replay_ms']:.4f} ms  "
          f"{r['fraction_of_copy']:.3f} of copy  ({sys.argv[1].rsplit('/', 1)[-1]})")
PY
done
step paired 120 python -m pytest -q test/registered/layers/test_paired_row_gemv_cuda.py
SGLANG_AUX_L2_PREFETCH=16 step runner 200 python -m pytest -q \
  test/registered/model_executor/test_decode_cuda_graph_runner_cuda.py
cat "$out/status.txt"

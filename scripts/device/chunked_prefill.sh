#!/usr/bin/env bash
# Chunked prefill on the shaped presets in one device call from the repository root (issue 41;
# docs/chunked_prefill.md): the K3-shaped 4,096-token chunk step's peak per aux projection
# beside the target's own chunk step, then a 32,000-token prompt through the HTTP server (the
# Qwen2.5-1.5B-shaped pair, dummy weights) chunked at 4,096 and unchunked while 8 requests
# decode, with the chunk pacer at its default share (decode steps between full chunks) and
# off (share 0), then the chunked prefill CUDA tests (at most 400 s by the steps' limits; on
# an H100 on 2026-12-05 these steps and one more for the pacer's since removed way took 315 s,
# docs/data/session_h100_1205h/chunked_prefill). Needs the server wheels: carry
# .carry/wheels. Writes JSON and logs under OUT; each step's exit status in OUT/status.txt.
#
#   bash scripts/device/chunked_prefill.sh "$OUT"
. scripts/device/timed_steps.sh
python -m pip install -q --no-index --target /tmp/site .carry/wheels/*.whl >/dev/null 2>&1
export PYTHONPATH=$PYTHONPATH:/tmp/site

step step 60 python "$bench/bench_chunked_prefill.py" --skip-server --memory-history \
  --out "$out/chunk_step.json"
long=(--skip-step --model-path qwen2.5-1.5b-shaped --draft-path qwen2.5-1.5b-shaped-dflash)
step paced 130 python "$bench/bench_chunked_prefill.py" "${long[@]}" \
  --out "$out/long_prompt_paced.json" --server-args --load-format dummy
step unpaced 100 python "$bench/bench_chunked_prefill.py" "${long[@]}" \
  --out "$out/long_prompt_unpaced.json" --server-args --load-format dummy \
  --chunked-prefill-decode-share 0
step tests 110 python -m pytest -q -x \
  test/registered/managers/test_scheduler_chunked_prefill_cuda.py
cat "$out/status.txt"

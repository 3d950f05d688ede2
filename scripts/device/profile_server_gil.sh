#!/usr/bin/env bash
# Where the server's GIL goes under the GSM8K harness: py-spy samples only the threads holding
# the GIL (--gil), per thread of the server and its scheduler process (--subprocesses), while
# 1,319 questions run at 32 concurrent against one server.
#
#   bash scripts/device/profile_server_gil.sh CONFIG OUT_DIR     # CONFIG: target | dflash
#
# Needs SmolLM2 staged and GSM8K (as run_h200_figures.sh harness) and the py-spy wheel in
# .carry/pyspy (pip download --no-deps --only-binary=:all: --python-version 3.12
# --platform manylinux2014_x86_64 py-spy). Writes OUT_DIR/gil_CONFIG.txt (collapsed stacks)
# and prints the top frames per thread.
set -uo pipefail
cfg=$1; out=$2; port=31001
mkdir -p "$out" /tmp/spy
python3 -m pip install -q --no-index --no-deps --target /tmp/spy .carry/pyspy/*.whl
export PYTHONPATH=/tmp/site:python
flags=(--speculative-algorithm NONE)
[ "$cfg" = dflash ] && flags=(--speculative-algorithm DFLASH
                              --speculative-draft-model-path smollm2-135m-instruct-dflash-b8)
/tmp/spy/bin/py-spy record --gil --threads --subprocesses --nonblocking -r 500 --format raw \
  -o "$out/gil_$cfg.txt" -- python3 -m sglang_aux.launch_server \
  --model-path smollm2-135m-instruct --port $port --context-length 2048 \
  --max-running-requests 64 "${flags[@]}" > "$out/spy_server_$cfg.log" 2>&1 &
spy=$!
for _ in $(seq 240); do curl -sf localhost:$port/health > /dev/null && break; sleep 0.5; done
python3 -m sglang_aux.test.few_shot_gsm8k --port $port --num-questions 1319 --parallel 32 \
  --max-new-tokens 512 --result-file "$out/spy_results.jsonl" 2>&1 | grep -E "throughput|Accept"
kill -INT $spy; wait $spy 2>/dev/null
python3 - "$out/gil_$cfg.txt" <<'PY'
import collections, sys
by_thread, frames = collections.Counter(), collections.defaultdict(collections.Counter)
for line in open(sys.argv[1]):
    stack, _, n = line.rstrip().rpartition(" ")
    parts = stack.split(";")
    thread = next((p for p in parts if p.startswith("thread")), parts[0])
    n = int(n)
    by_thread[thread] += n
    # the innermost frame of ours (or the innermost at all) says what holds the GIL
    ours = [p for p in parts[1:] if "sglang_aux" in p] or parts[-1:]
    frames[thread][ours[-1][:110]] += n
total = sum(by_thread.values())
for thread, n in by_thread.most_common(4):
    print(f"{thread}: {n} samples ({n / total:.0%} of GIL-held samples)")
    for frame, m in frames[thread].most_common(12):
        print(f"   {m:>6} {frame}")
PY

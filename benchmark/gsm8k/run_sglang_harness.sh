#!/usr/bin/env bash
# SGLang 0.5.23's own GSM8K harness (`python -m sglang.test.few_shot_gsm8k`, the `sgl`
# frontend), unchanged, against a running server of ours; installs SGLang's client modules on
# first use (`sglang_aux.test.sglang_client`: pip --no-deps --target, no CUDA packages).
#   bash benchmark/gsm8k/run_sglang_harness.sh PORT [NUM_QUESTIONS [PARALLEL]]
# GSM8K comes from SGLANG_AUX_GSM8K_DIR, else ../shared/data/gsm8k beside the checkout, else
# the official file downloaded into the cache.
# Start the server first, e.g.
#   python -m sglang_aux.launch_server --model-path smollm2-135m-instruct --port 31000 \
#     --speculative-algorithm DFLASH --speculative-draft-model-path DRAFT
set -euo pipefail
port=$1; n=${2:-1319}; parallel=${3:-128}
py=${PYTHON:-python3}
client=$($py -c "from sglang_aux.test.sglang_client import install_client; print(install_client())")
data=$($py -c "from sglang_aux.test.gsm8k_data import gsm8k_path; print(gsm8k_path('test'))")
env=$($py -c "from pathlib import Path; from sglang_aux.test.sglang_client import client_env; \
print(client_env(Path('$client'))['PYTHONPATH'])")
PYTHONPATH="$env" $py -m sglang.test.few_shot_gsm8k --host 127.0.0.1 --port "$port" \
  --data-path "$data" --num-questions "$n" --parallel "$parallel" --max-new-tokens 512

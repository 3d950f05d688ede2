cd /root/t39
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1 SGLANG_AUX_GSM8K_DIR=/root/t39/.carry/gsm8k SGLANG_AUX_HUMANEVAL=/root/t39/.carry/humaneval/HumanEval.jsonl.gz PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
M="--model-path qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-1.5b-instruct-dflash-b16 --tasks gsm8k --num-gsm8k 1319"
python3 -m sglang_aux.test.user_eval $M --parallel 1 8 32 --num-sequential 1319 --start-timeout 300 --out /root/ue/full > /root/ue/full.log 2>&1
echo "full $?" >> /root/ue/status
python3 -m sglang_aux.test.user_eval $M --parallel 64 128 256 --server-flags "--max-running-requests 256" --start-timeout 300 --out /root/ue/high > /root/ue/high.log 2>&1
echo "high $?" >> /root/ue/status

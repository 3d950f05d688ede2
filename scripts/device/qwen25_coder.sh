#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct with its block-16 DFlash draft on the H200, one phase per device
# call, the calls one right after the other (the machine keeps the staged GGUF, the imported
# model and the draft in its cache while warm):
#
#   bash scripts/device/qwen25_coder.sh train OUT   # the draft: train_dflash --recipe (< 10 min)
#   bash scripts/device/qwen25_coder.sh eval OUT    # held-out accept, GSM8K harness x 4 servers
#   bash scripts/device/qwen25_coder.sh bench OUT   # lossless test, vs transformers, graph memory
#
# Needs the GGUF staged (scripts/device/stage_qwen2_gguf.sh; its last call, --join, can run
# right before `train` in the same call), GSM8K in $SGLANG_AUX_GSM8K_DIR (default: the carried
# .carry/gsm8k) and, for eval, the server wheels in /tmp/site (carry .carry/wheels:
# scripts/device/fetch_server_wheels.sh). Environment: NUM_QUESTIONS, CONFIGS (eval); DEADLINE
# (train: seconds for the whole training run).
set -uo pipefail
phase=$1; out=$2
mkdir -p "$out"
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
MODEL=qwen2.5-coder-1.5b-instruct
DRAFT=qwen2.5-coder-1.5b-instruct-dflash-b16
py=python3
case $phase in
  train)
    $py -m sglang_aux.tools.train_dflash --recipe $DRAFT ${DEADLINE:+--deadline-s $DEADLINE} \
      2>&1 | grep -v Warning | tee "$out/train.log" \
      | grep -E "generat|budget|sequences|step [0-9]+/|Error|error|Traceback" | tail -40
    draft=$($py -c "from sglang_aux.srt.model_loader.builtin import resolve_model_path as r
print(r('$DRAFT'))") || exit 1
    cp "$draft/README.md" "$out/draft_README.md"
    cp "$draft/config.json" "$out/draft_config.json"
    ls -la "$draft" ;;
  eval)
    [ -d .carry/wheels ] && $py -m pip install -q --no-index --no-deps --target /tmp/site \
      .carry/wheels/*.whl
    $py -m sglang_aux.tools.train_dflash --recipe $DRAFT --eval-only \
      2>&1 | grep -v Warning | tee "$out/heldout.log" | grep -E "eval:|Error|Traceback" | tail -3
    draft=$($py -c "from sglang_aux.srt.model_loader.builtin import resolve_model_path as r
print(r('$DRAFT'))")
    cp "$draft/README.md" "$out/draft_README.md"
    MODEL=$MODEL bash benchmark/gsm8k/run_gsm8k_eval.sh $DRAFT "$out" "${NUM_QUESTIONS:-1319}" \
      "${CONFIGS:-target dflash dflash_noshare dflash_streamed}" ;;
  bench)
    $py -m pytest -q test/registered/core/test_qwen25_coder_dflash_cuda.py \
      test/registered/core/test_qwen25_coder_cuda.py 2>&1 | tee "$out/tests.log" | tail -4
    $py benchmark/spec_decode/bench_vs_transformers.py --model-path $MODEL --draft $DRAFT \
      --bs 1 32 --modes forced natural --engines transformers target dflash --num-prompts 64 \
      --num-prompts-bs1 8 --out "$out/vs_transformers_qwen.json" 2>&1 | grep -v Warning \
      | tail -14
    folder=$($py -c "from sglang_aux.srt.model_loader.builtin import resolve_model_path as r
print(r('$MODEL'), r('$DRAFT'))")
    read -r target_dir draft_dir <<< "$folder"
    $py benchmark/aux_memory/bench_graph_memory.py --model-path "$target_dir" \
      --draft-path "$draft_dir" --block 16 --max-bs ${MAX_BS:-48 72} --paths per-graph shared \
      --out "$out/graph_memory_qwen.json" 2>&1 | tail -8 ;;
  *)
    echo "unknown phase $phase"; exit 2 ;;
esac

#!/usr/bin/env bash
# Retrain the SmolLM2-135M-Instruct block-8 DFlash draft on the H200, in two device calls made
# one right after the other (the machine keeps /root/draft between them while warm).
#
#   bash scripts/device/train_smollm2_draft.sh data OUT    # continuations: greedy + sampled
#   bash scripts/device/train_smollm2_draft.sh train OUT   # variants side by side, validation
#
# The last VAL questions of GSM8K train are held out of the data: every variant is measured on
# them (greedy accept length), and the best is kept at
# /root/draft/best and sent back as OUT/draft_model.safetensors.part-* (a call returns files
# of at most 16 MiB), with its card and config. GSM8K test stays for the harness.
# Environment: PASSES, TEMPERATURE (data: sampled passes, default 2 at 0.7); VARIANTS (train:
# "all greedy"), STEPS (4500), BUDGET (seconds of training; pace-limited steps), VAL (200).
# Needs SmolLM2 staged (stage_smollm2_gguf.sh --join) and GSM8K in $SGLANG_AUX_GSM8K_DIR.
set -uo pipefail
phase=$1; out=$2
mkdir -p "$out" /root/draft
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
train=$SGLANG_AUX_GSM8K_DIR/train.jsonl
VAL=${VAL:-200}
SHOTS=5
num_train=$(( $(wc -l < "$train") - SHOTS - VAL ))
tail -n "$VAL" "$train" > /root/draft/val.jsonl
tool="python3 -m sglang_aux.tools.train_dflash --num-samples $num_train ${TOOL_FLAGS:-}"
case $phase in
  data)  # greedy, then PASSES sampled continuations of every training question
    $tool --phase data --samples-file /root/draft/samples.jsonl --gen-batch 256 \
      --sampled-passes "${PASSES:-2}" --sample-temperature "${TEMPERATURE:-0.7}" \
      2>&1 | grep -v Warning | tee "$out/data.log" | grep -E "generated|Error|error" | tail -12
    wc -l /root/draft/samples.jsonl ;;
  train)
    # VARIANTS, side by side: all (every sequence of the samples file), greedy (the greedy
    # pass alone: the first num_train). The shipped draft is not measured here: it was trained
    # on every train question, the held-out ones included.
    for name in ${VARIANTS:-all greedy}; do
      n=$num_train; [ "$name" = all ] && n=$(wc -l < /root/draft/samples.jsonl)
      $tool --samples-file /root/draft/samples.jsonl --num-samples "$n" \
        --steps "${STEPS:-4500}" ${BUDGET:+--train-budget-s $BUDGET} --out "/root/draft/$name" \
        --eval --eval-data-path /root/draft/val.jsonl --eval-num-prompts "$VAL" \
        > "$out/train_$name.log" 2>&1 &
    done
    wait
    best="" best_accept=0
    for name in ${VARIANTS:-all greedy}; do
      log=$out/train_$name.log
      accept=$(grep -o "'accept_length': [0-9.]*" "$log" | tail -1 | cut -d' ' -f2)
      echo "[$name] held-out accept length ${accept:-missing}"
      grep -h "step .*/" "$log" | tail -1
      grep -h "Error" "$log" | tail -2
      accept=${accept:-0}
      if awk "BEGIN{exit !($accept > $best_accept)}"; then
        best=$name best_accept=$accept
      fi
    done
    echo "best: $best ($best_accept)"
    rm -rf /root/draft/best && cp -r "/root/draft/$best" /root/draft/best
    cp /root/draft/best/README.md "$out/draft_README.md"
    cp /root/draft/best/config.json "$out/draft_config.json"
    split -b 12M /root/draft/best/model.safetensors "$out/draft_model.safetensors.part-"
    sha256sum /root/draft/best/model.safetensors ;;
  *)
    echo "unknown phase $phase"; exit 2 ;;
esac

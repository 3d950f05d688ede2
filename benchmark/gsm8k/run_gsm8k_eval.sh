#!/usr/bin/env bash
# GSM8K 5-shot through the HTTP server: target-only vs DFlash, shared aux buffer on and off,
# prefix cache on (default) and off, each against its own server; then tokens/s at 1, 8 and 32
# concurrent requests.
#   bash benchmark/gsm8k/run_gsm8k_eval.sh DRAFT OUT_DIR [NUM_QUESTIONS [CONFIGS]]
# DRAFT: the draft folder or name; MODEL (environment): the target, default
# smollm2-135m-instruct (qwen2.5-coder-1.5b-instruct with qwen2.5-coder-1.5b-instruct-dflash-b16);
# SERVER_FLAGS: more flags for every server; START_TIMEOUT: seconds a server may take to
# start (600: a cold machine's first server imports the GGUF and compiles the kernels); N1,
# N8: questions one at a time (32) and at 8 concurrent (64); SGLANG_HARNESS=1: SGLang's own
# harness (run_sglang_harness.sh) too, after ours at 32 concurrent, on the target and dflash
# servers, and ours again with its prompts (`--shots-from test`: SGLang 0.5.23 takes the shots
# from the first test questions);
# HIGH_P: more concurrencies for ours after the 32-concurrent run, e.g. "64 128 256" (the
# server's --max-running-requests is MAX_RUNNING, default 64: raise it with them).
# CONFIGS: a space-separated subset of "target dflash dflash_noshare dflash_streamed
# target_nocache dflash_nocache target_delay dflash_delay
# target_mixed dflash_mixed target_apart dflash_apart" (default: target dflash dflash_noshare;
# *_nocache pass --disable-radix-cache, *_delay --enable-prefill-delayer,
# *_mixed --enable-mixed-chunk (on CUDA the default since 2026-12-05, so there these are the
# plain configs with the flag spelled out), *_apart --disable-mixed-chunk (arrivals prefilled
# in steps of their own, the default before),
# dflash_streamed --speculative-dflash-aux-projection streamed; dflash_schedule: static verify
# with the draft length schedule derived at start-up from ACCEPTANCE_PROFILE (environment,
# default the Qwen2.5-Coder GSM8K profile in benchmark/spec_decode/profiles/; `draft`: the
# draft's own, which `train_dflash --eval` or `--eval-only` writes); dflash_compact:
# --speculative-verify-mode compact (the draft's probabilities as confidences, SERVER_FLAGS may
# add --compact-verify-budget-frac F, which static configs refuse); dspark / dspark_compact:
# DSpark with the draft DSPARK_DRAFT (environment), --speculative-verify-mode static / compact,
# DSPARK_FLAGS (environment) added, e.g. --speculative-verify-width 8); dspark_topk: dspark
# with its greedy proposals scored over each row's MARKOV_TOPK (64) largest base logits where
# certified (SGLANG_AUX_MARKOV_TOPK in that server's environment; batches up to 16; the same
# tokens as dspark); dflash_vocab / dspark_vocab: dflash / dspark with the draft vocabulary
# TOKEN_MAP (environment; --speculative-token-map). Every speculative
# config passes its verify mode, so SGLANG_RAGGED_VERIFY_MODE in the environment changes none.
# Needs the target (a folder, or a built-in name imported on first use) and GSM8K
# (SGLANG_AUX_GSM8K_DIR).
set -uo pipefail
draft=$1; out=$2; n=${3:-1319}; configs=${4:-target dflash dflash_noshare}
mkdir -p "$out"
port=31000
profile=$(dirname "$0")/../spec_decode/profiles/qwen2.5-coder-1.5b-dflash-b16_gsm8k.json
serve() {  # name, extra flags...
  local name=$1; shift
  # shellcheck disable=SC2086
  env ${SERVER_ENV:-} ${PYTHON:-python3} -m sglang_aux.launch_server --model-path "${MODEL:-smollm2-135m-instruct}" \
    --port $port --context-length 2048 --max-running-requests "${MAX_RUNNING:-64}" \
    ${SERVER_FLAGS:-} "$@" \
    > "$out/server_$name.log" 2>&1 &
  pid=$!
  for _ in $(seq $((2 * ${START_TIMEOUT:-600}))); do
    if curl -sf localhost:$port/health > /dev/null; then
      # which widths it verifies: a draft without a profile verifies all of them at every size
      grep -ho "Draft length schedule.*" "$out/server_$name.log" | sed "s/^/[$name] /"
      return 0
    fi
    kill -0 $pid 2> /dev/null || break  # it exited: no use waiting
    sleep 0.5
  done
  echo "server $name did not start"; tail -20 "$out/server_$name.log"
  kill $pid 2> /dev/null; wait $pid 2> /dev/null; return 1
}
harness() {  # name, num questions, parallel, more flags...
  local name=$1 n=$2 p=$3; shift 3
  ${PYTHON:-python3} -m sglang_aux.test.few_shot_gsm8k --port $port --num-questions "$n" --parallel "$p" \
    --max-new-tokens 512 --result-file "$out/results.jsonl" "$@" 2>&1 | tail -6 \
    | sed "s/^/[$name n=$n p=$p$*] /"
}
for cfg in $configs; do
  SERVER_ENV=
  case $cfg in
    target) flags=(--speculative-algorithm NONE) ;;
    dflash) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft") ;;
    dflash_noshare) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                           --disable-shared-aux-buffer) ;;
    target_nocache) flags=(--speculative-algorithm NONE --disable-radix-cache) ;;
    dflash_nocache) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                           --disable-radix-cache) ;;
    dflash_streamed) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                            --speculative-dflash-aux-projection streamed) ;;
    target_delay) flags=(--speculative-algorithm NONE --enable-prefill-delayer) ;;
    dflash_delay) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                         --enable-prefill-delayer) ;;
    target_mixed) flags=(--speculative-algorithm NONE --enable-mixed-chunk) ;;
    dflash_mixed) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                         --enable-mixed-chunk) ;;
    target_apart) flags=(--speculative-algorithm NONE --disable-mixed-chunk) ;;
    dflash_apart) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                         --disable-mixed-chunk) ;;
    dflash_compact) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft") ;;
    dflash_schedule) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                            --speculative-acceptance-profile "${ACCEPTANCE_PROFILE:-$profile}") ;;
    dspark|dspark_compact|dspark_topk) flags=(--speculative-algorithm DSPARK
                                  --speculative-draft-model-path "${DSPARK_DRAFT:?set DSPARK_DRAFT}"
                                  ${DSPARK_FLAGS:-}) ;;
    dflash_vocab) flags=(--speculative-algorithm DFLASH --speculative-draft-model-path "$draft"
                         --speculative-token-map "${TOKEN_MAP:?set TOKEN_MAP}") ;;
    dspark_vocab) flags=(--speculative-algorithm DSPARK
                         --speculative-draft-model-path "${DSPARK_DRAFT:?set DSPARK_DRAFT}"
                         --speculative-token-map "${TOKEN_MAP:?set TOKEN_MAP}" ${DSPARK_FLAGS:-}) ;;
    *) echo "unknown config $cfg"; continue ;;
  esac
  [[ $cfg == dspark_topk ]] && SERVER_ENV="SGLANG_AUX_MARKOV_TOPK=${MARKOV_TOPK:-64}"
  mode=static; [[ $cfg == *_compact ]] && mode=compact
  [[ " ${flags[*]} " == *" NONE "* ]] || flags+=(--speculative-verify-mode "$mode")
  serve $cfg "${flags[@]}" || continue
  curl -s localhost:$port/get_server_info > "$out/server_info_$cfg.json"
  harness $cfg "$n" 32
  if [[ -n ${SGLANG_HARNESS:-} && $cfg =~ ^(target|dflash)$ ]]; then
    bash "$(dirname "$0")/run_sglang_harness.sh" $port "$n" 32 2>&1 | tail -4 \
      | sed "s/^/[sglang-harness $cfg n=$n p=32] /"
    harness $cfg "$n" 32 --shots-from test  # ours with SGLang's prompts
  fi
  # scheduler_stats (prefill/decode steps, requests, tokens, seconds) and prefix cache hits
  # (radix_cache_hit_tokens / radix_cache_admitted_prompt_tokens) of the 32-concurrent run
  curl -s localhost:$port/get_server_info > "$out/server_info_after32_$cfg.json"
  for p in ${HIGH_P:-}; do
    harness $cfg "$n" "$p"
    curl -s localhost:$port/get_server_info > "$out/server_info_after${p}_$cfg.json"
  done
  if [[ $cfg =~ ^(target|dflash|dflash_compact|dflash_schedule|dspark|dspark_compact|dspark_topk|dflash_vocab|dspark_vocab)(_delay|_mixed|_apart)?$ ]]; then
    harness $cfg "${N1:-32}" 1
    harness $cfg "${N8:-64}" 8
  fi
  kill $pid; wait $pid 2>/dev/null
done

#!/usr/bin/env bash
# Issue 27's no-regression figures: the same measurements from the tree before the one-runner
# restructuring (REV, default a1ec20a) and from this tree, on one machine, each tree running its
# own benchmark scripts (their internals differ; their flags and outputs do not).
#
# Here:    bash scripts/device/before_after.sh --pack [REV]
#          -> .carry/before: REV's python/ and benchmark/ (git archive, ~2 MB, without the
#             shipped SmolLM2 draft's weights: the run links this tree's)
# Device (SmolLM2 staged: stage_smollm2_gguf.sh; the server wheels in /tmp/site; GSM8K in
# .carry/gsm8k), two calls one right after the other, carrying .carry/before and .carry/gsm8k:
#          bash scripts/device/before_after.sh --run OUT before
#          bash scripts/device/before_after.sh --run OUT after
# Each: decode/verify graph replay (bench_graph_replay.py, smollm2-shaped and bench-llama), the
# K3-shaped graph-memory table (max bs 48/64/72; per-graph, shared, streamed), and the GSM8K
# harness with the shipped SmolLM2 draft (target-only and DFlash at 32 and 1 concurrent, and
# DFlash with mixed steps, whose server reports the free-memory drop with the mixed graphs).
# DEVICE, ITERS, MEMORY=0, NUM_QUESTIONS=0: fewer figures (on CPU the replay alone exceeds its timeout;
# checked here by hand: both trees run `bench_graph_replay.py --device cpu --iters 2`).
# Note: the old bench_graph_replay replayed its decode graphs over padding rows (the step
# prologue read rows it never set), so its context was about the block, not --context; the
# harness rows are the like-for-like comparison.
set -uo pipefail
cd "$(dirname "$0")/../.."
BEFORE=.carry/before
DRAFT_REL=python/sglang_aux/data/drafts/smollm2-135m-instruct-dflash-b8/model.safetensors
case ${1:-} in
  --pack)
    rev=${2:-a1ec20a}
    rm -rf "$BEFORE" && mkdir -p "$BEFORE"
    git archive "$rev" python benchmark | tar x -C "$BEFORE"
    rm -f "$BEFORE/$DRAFT_REL"
    echo "$rev" > "$BEFORE/REV"
    du -sh "$BEFORE" ;;
  --run)
    out=$2; tree=$3
    dir=$PWD; [ "$tree" = before ] && dir=$PWD/$BEFORE
    [ "$tree" = before ] && ln -sf "$PWD/$DRAFT_REL" "$BEFORE/$DRAFT_REL"
    mkdir -p "$out/$tree"
    export SGLANG_AUX_GSM8K_DIR=$PWD/.carry/gsm8k PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
      PYTHONUNBUFFERED=1
    cd "$dir" || exit 1
    export PYTHONPATH=/tmp/site:$dir/python
    timeout 120 python3 benchmark/spec_decode/bench_graph_replay.py \
      --presets smollm2-shaped bench-llama ${DEVICE:+--device $DEVICE} ${ITERS:+--iters $ITERS} \
      --out "$out/$tree/graph_replay.json" 2>&1 | tail -8
    [ "${MEMORY:-1}" = 1 ] && timeout 200 python3 benchmark/aux_memory/bench_graph_memory.py \
      --max-bs 48 64 72 --out "$out/$tree/graph_memory.json" 2>&1 | tail -11
    [ "${NUM_QUESTIONS:-1319}" -gt 0 ] && MODEL=smollm2-135m-instruct timeout 240 \
      bash benchmark/gsm8k/run_gsm8k_eval.sh smollm2-135m-instruct-dflash-b8 \
      "$out/$tree/harness" "${NUM_QUESTIONS:-1319}" "target dflash dflash_mixed" 2>&1 \
      | grep -E "Accuracy|throughput|Accept|did not"
    tar czf "$out/$tree.tgz" -C "$out" "$tree" && rm -rf "${out:?}/$tree" ;;
  --alternate)
    # The harness at 32 concurrent (and one at a time over N1 questions, 1 by default), the two
    # trees in turn ROUNDS times (before, after, before, ...): run-to-run spread against the
    # trees' difference.
    out=$2; rounds=${3:-2}; configs=${4:-dflash}
    ln -sf "$PWD/$DRAFT_REL" "$BEFORE/$DRAFT_REL"
    export SGLANG_AUX_GSM8K_DIR=$PWD/.carry/gsm8k PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    root=$PWD
    for r in $(seq "$rounds"); do
      for tree in before after; do
        dir=$root; [ "$tree" = before ] && dir=$root/$BEFORE
        (cd "$dir" && PYTHONPATH=/tmp/site:$dir/python N1=${N1:-1} N8=1 MODEL=smollm2-135m-instruct \
          timeout 150 bash benchmark/gsm8k/run_gsm8k_eval.sh smollm2-135m-instruct-dflash-b8 \
          "$out/alt_${tree}_$r" "${NUM_QUESTIONS:-1319}" "$configs" 2>&1 \
          | grep -E "n=[0-9]+ p=(32|1)[] ].*(throughput|Accept)" | sed "s/^/[$tree round $r] /")
      done
    done
    tar czf "$out/alternate.tgz" -C "$out" $(cd "$out" && ls -d alt_*) && rm -rf "$out"/alt_* ;;
  *)
    echo "usage: $0 --pack [REV] | --run OUT before|after | --alternate OUT [ROUNDS [CONFIGS]]"
    exit 2 ;;
esac

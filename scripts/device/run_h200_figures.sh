#!/usr/bin/env bash
# The H200 half of a session: CUDA tests and the figures of docs/benchmarks.md, one phase per
# device call (each well under the 10-minute limit), run from the repository root. Section
# numbers below are docs/benchmarks_log.md's.
#
#   bash scripts/device/run_h200_figures.sh PHASE OUT_DIR
#
# PHASE: tests (every register_cuda_ci file, in parallel groups: one GPU, 16 CPU cores for the
# Triton compiles), speed and speed_more (sections 7, 9 and 10), harness (section 5's GSM8K rows), load (the
# server load test), arrivals (the harness's traffic in-process, traced), gemm (section 8's MXFP8 GEMM sweep), memory (section 8's graph memory),
# host (host time per step, overlap scheduler on and off), mixed (section 12: arrivals apart / in
# mixed steps, in-process).
# Environment: TEST_FILES (tests: these files only), TEST_GROUPS (tests: these groups), DRAFT (harness: the draft folder or name),
# LOAD_FLAGS (load: more server flags), CONFIGS and NUM_QUESTIONS (harness).
# Needs, for all but tests/gemm/memory: SmolLM2 staged (stage_smollm2_gguf.sh --join) and
# GSM8K in $SGLANG_AUX_GSM8K_DIR; for harness/load the server wheels in /tmp/site
# (fetch_server_wheels.sh, then pip install --target /tmp/site).
set -uo pipefail
phase=$1; out=$2
mkdir -p "$out"
export PYTHONPATH=/tmp/site:python
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
py=python3
case $phase in
  tests)
    # a speed assertion: run alone after the groups (beside them it measured 1.5x, not 3x)
    timed=test/registered/attention/test_triton_backend_cuda.py::test_sliding_window_skips_keys_at_long_context
    groups=(
      "test/registered/attention/test_triton_backend_cuda.py --deselect $timed"
      "test/registered/layers/test_triton_ops_cuda.py test/registered/models/test_qwen2_cuda.py test/registered/compat/test_sliding_windows_cuda.py"
      "test/registered/quantization/test_accumulating_gemm_cuda.py test/registered/quantization/test_mxfp8_cuda.py test/registered/speculative/test_staged_input_cuda.py"
      "test/registered/managers/test_scheduler_step_loop_cuda.py test/registered/model_executor/test_graph_runner_prefill_cuda.py test/registered/managers/test_scheduler_overlap_cuda.py test/registered/managers/test_scheduler_mixed_chunk_cuda.py"
      "test/registered/speculative/test_dflash_worker_cuda.py test/registered/model_executor/test_decode_cuda_graph_runner_cuda.py test/registered/mem_cache/test_radix_cache_engine_cuda.py"
      "test/registered/speculative/test_streamed_projection_cuda.py test/registered/speculative/test_draft_context_streamed_cuda.py test/registered/sampling/test_top_k_top_p_cuda.py"
      "test/registered/core/test_basic_sanity_dflash_cuda.py test/registered/core/test_qwen25_coder_cuda.py"
      # asserts that nothing in its process touched CUDA before it: a process of its own
      "test/registered/entrypoints/test_tokenizer_manager_cuda.py"
    )
    # every other register_cuda_ci file, so a new one is never left out
    listed=" ${groups[*]} "
    rest=()
    for f in test/registered/*/*_cuda.py; do [[ $listed == *" $f "* ]] || rest+=("$f"); done
    [ ${#rest[@]} -gt 0 ] && groups+=("${rest[*]}")
    # TEST_FILES="a.py b.py": those files instead, one group each, no timed test after
    if [ -n "${TEST_FILES:-}" ]; then read -ra groups <<< "$TEST_FILES"; timed=""; fi
    # TEST_GROUPS="0 5 8": those groups only, each file its own process (a rerun of the groups
    # a cut call left); the timed test with group 0
    if [ -n "${TEST_GROUPS:-}" ]; then
      picked=()
      for g in $TEST_GROUPS; do read -ra files <<< "${groups[$g]}"; picked+=("${files[@]}"); done
      groups=()
      for f in "${picked[@]}"; do
        case $f in
          --deselect|*::*) ;;
          "${timed%%::*}") groups+=("$f --deselect $timed") ;;
          *) groups+=("$f") ;;
        esac
      done
      [[ " $TEST_GROUPS " == *" 0 "* ]] || timed=""
    fi
    pids=()
    for i in "${!groups[@]}"; do
      # shellcheck disable=SC2086
      $py -m pytest -q ${groups[$i]} > "$out/tests_$i.log" 2>&1 &
      pids+=($!)
    done
    rc=0
    for i in "${!pids[@]}"; do
      wait "${pids[$i]}" || rc=1
      echo "[group $i] ${groups[$i]}: $(tail -1 "$out/tests_$i.log")"
    done
    if [ -n "$timed" ]; then
      $py -m pytest -q "$timed" > "$out/tests_timed.log" 2>&1 || rc=1
      echo "[alone] $timed: $(tail -1 "$out/tests_timed.log")"
    fi
    exit $rc ;;
  speed)  # ~140 s: the goal rows; speed_more has the rest (the whole set exceeds one call)
    $py benchmark/spec_decode/bench_vs_transformers.py --bs 1 32 --modes forced \
      --engines transformers target dflash --num-prompts 64 --num-prompts-bs1 8 \
      --out "$out/vs_transformers.json" 2>&1 | grep -v Warning | tail -12 ;;
  speed_more)
    $py benchmark/spec_decode/bench_vs_transformers.py --bs 8 32 --modes natural \
      --engines transformers target dflash dflash_noshare dflash_streamed --num-prompts 64 \
      --out "$out/vs_transformers_more.json" 2>&1 | grep -v Warning | tail -16
    $py benchmark/spec_decode/bench_request_breakdown.py --num-prompts 12 \
      --out "$out/request_breakdown.json" 2>&1 | grep "^{" ;;
  harness)
    bash benchmark/gsm8k/run_gsm8k_eval.sh "${DRAFT:-smollm2-135m-instruct-dflash-b8}" "$out" \
      "${NUM_QUESTIONS:-1319}" "${CONFIGS:-target dflash dflash_noshare}" ;;
  load)
    $py benchmark/spec_decode/load_test_server.py --out "$out/load_test.json" -- \
      --model-path smollm2-135m-instruct --speculative-algorithm DFLASH \
      --speculative-draft-model-path smollm2-135m-instruct-dflash-b8 --dtype float32 \
      --max-running-requests 128 --context-length 2048 ${LOAD_FLAGS:-} 2>&1 | tail -25 ;;
  arrivals)  # the harness's traffic in-process, per-step GPU spans, prefill delayer off / on
    $py benchmark/spec_decode/bench_continuous_arrivals.py --trace \
      --engines target_apart dflash_apart target_delay dflash_delay \
      --out "$out/continuous_arrivals.json" \
      2>&1 | grep -v Warning | tail -12 ;;
  mixed)  # the harness's traffic in-process, arrivals' prefills apart / inside the step
    $py benchmark/spec_decode/bench_continuous_arrivals.py --trace \
      --engines target_apart dflash_apart target_mixed dflash_mixed \
      --out "$out/continuous_arrivals_mixed.json" \
      2>&1 | grep -v Warning | tail -12 ;;
  gemm)
    $py benchmark/aux_memory/bench_mxfp8_gemm.py --out "$out/mxfp8_gemm.json" 2>&1 | tail -40 ;;
  host)
    $py benchmark/spec_decode/bench_step_host_time.py --model-path smollm2-135m-instruct \
      --draft smollm2-135m-instruct-dflash-b8 --load-format auto --bs 1 8 32 \
      --prompt-len 900 --out "$out/step_host_time.json" 2>&1 | grep -v Warning | tail -14 ;;
  memory)
    $py benchmark/aux_memory/bench_graph_memory.py --max-bs 48 64 72 \
      --out "$out/graph_memory.json" 2>&1 | tail -12 ;;
  *)
    echo "unknown phase $phase"; exit 2 ;;
esac

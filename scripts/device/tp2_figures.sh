#!/usr/bin/env bash
# Tensor parallelism on the two-GPU machine (`nvidia-h200-x2`, NCCL; leave NVLink multicast as
# that machine's environment sets it), one phase per device call, from the repository root:
#
#   bash scripts/device/tp2_figures.sh tests OUT      # test_tp_ranks_cuda.py: TP2 == TP1 token for
#                                                     # token with real graphs (NCCL inside)
#   bash scripts/device/tp2_figures.sh memory OUT     # the K3-shaped target-verify graph memory,
#                                                     # TP1 and TP2 (a row per rank), shared vs
#                                                     # per-graph vs streamed
#   bash scripts/device/tp2_figures.sh speed OUT      # tok/s TP1 vs TP2, Qwen2.5-Coder-1.5B with
#                                                     # its block-16 DFlash draft
#
# `speed` needs the Qwen GGUF staged on this warm machine and the draft trained on it, as
# scripts/device/qwen25_coder.sh does at TP1 (its `train` phase uses GPU 0 only):
#   run(kind="nvidia-h200-x2", command="bash scripts/device/stage_qwen2_gguf.sh --put 00",
#       carry=[".carry/qwen2-gguf/00"])   ... the staging calls, then --join
#   run(kind="nvidia-h200-x2", command="DEADLINE=520 bash scripts/device/qwen25_coder.sh train \
#       $OUT", carry=[".carry/gsm8k"], timeout_s=600)
#   run(kind="nvidia-h200-x2", command="bash scripts/device/tp2_figures.sh speed $OUT",
#       carry=[".carry/gsm8k"], timeout_s=600)
# Not run yet: no two-GPU machine has been lent to this project (docs/tensor_parallel.md).
set -uo pipefail
phase=$1; out=$2
mkdir -p "$out"
export PYTHONPATH=/tmp/site:python PYTHONUNBUFFERED=1
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
py=python3
nvidia-smi --query-gpu=index,name,memory.total --format=csv | tee "$out/gpus.csv"
case $phase in
  tests)
    timeout 500 $py -m pytest -v test/registered/distributed/test_tp_ranks_cuda.py 2>&1 \
      | tee "$out/test_tp_ranks_cuda.log" | tail -8 ;;
  memory)
    for tp in 1 2; do
      timeout 250 $py benchmark/aux_memory/bench_graph_memory.py --preset k3-shaped \
        --tp-size $tp --max-bs 48 64 72 --out "$out/graph_memory_k3_tp$tp.json" 2>&1 | tail -10
    done ;;
  speed)
    timeout 560 $py benchmark/spec_decode/bench_vs_transformers.py \
      --model-path qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-1.5b-instruct-dflash-b16 \
      --engines target target_tp2 dflash dflash_tp2 --bs 1 32 --modes forced \
      --num-prompts 32 --num-prompts-bs1 4 --out "$out/tp2_speed_qwen.json" 2>&1 \
      | grep -v Warning | tail -14 ;;
  *)
    echo "unknown phase $phase"; exit 2 ;;
esac

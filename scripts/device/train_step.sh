#!/usr/bin/env bash
# Where a training step of the Qwen2.5-Coder mix draft spends its time, with no staging (issue
# 40; docs/training.md "Where a training step goes"): the mix recipe's trainer on the shaped
# Qwen2.5-1.5B preset (its config, random weights: a step's cost does not depend on the
# values) over every SAMPLE_EVERY-th of the shipped mix samples (not the GSM8K recipe's the
# recipe adds), one run per variant below,
# each profiled over 20 steps (`--profile-steps`: wall time, the device's busy time, the ops)
# and timed unprofiled (the log lines' seconds every 20 steps: the profiler slows the host).
# `base` is the recipe (over its draft vocabulary, the rows as MXFP8, host rows copied on
# their own stream, compiled: the default on CUDA); `eager` runs it without torch.compile (`--no-compile`);
# `packed` projects only the sequences' own context rows, not the batch's padding
# (`--pack-context`); `fused` steps AdamW with its fused kernels (`--fused-adam`). Others
# through VARIANTS (NAME=FLAGS, a variant's flags joined by commas), e.g.
# `grouped=--group-by-length` (each batch from one length group: less padding),
# `bf16rows=--no-mxfp8-rows` (the rows kept in bf16, not decoded: 1.14x base's pace on an
# H100, docs/benchmarks.md section 9s), `tritondecode=--mxfp8-rows-decode=triton` (a batch's
# MXFP8 rows decoded by one Triton kernel, not through torch's fp32 temporary),
# `fullvocab=--no-train-over-token-map`, `hostrows=--device-reserve-gb=100000` (every row in
# pinned host memory, as most of the whole mix's are; with `,--no-batch-stream` copied in
# line), `wide5=--num-layers=5,--intermediate-size=8960`, `efficient=--sdpa-backend=efficient`
# or `unbucketed=--context-bucket=0` (docs/benchmarks.md sections 9o and 9p timed those).
# From the repository root, carry .carry/wheels, .carry/gsm8k and .carry/humaneval (the
# contamination check reads GSM8K's test and HumanEval's prompts):
#
#   bash scripts/device/train_step.sh "$OUT"   # about 5 minutes on an H100 or the H200; OUT/table.md
. scripts/device/timed_steps.sh
export PYTHONPATH=$PYTHONPATH:/tmp/site
export SGLANG_AUX_HUMANEVAL=${SGLANG_AUX_HUMANEVAL:-$PWD/.carry/humaneval/HumanEval.jsonl.gz}
export SGLANG_AUX_GSM8K_DIR=${SGLANG_AUX_GSM8K_DIR:-$PWD/.carry/gsm8k}
[ -d .carry/wheels ] && python -m pip install -q --no-index --no-deps --target /tmp/site \
  .carry/wheels/*.whl
recipe=qwen2.5-coder-1.5b-instruct-dflash-b16
samples=/tmp/train-step-samples.jsonl.xz
python - "python/sglang_aux/data/$recipe.samples.jsonl.xz" "$samples" "${SAMPLE_EVERY:-8}" <<'EOF'
import lzma, sys
lines = lzma.open(sys.argv[1], "rt").read().splitlines()[:: int(sys.argv[3])]
with lzma.open(sys.argv[2], "wt") as f:
    f.write("\n".join(lines) + "\n")
print(f"{len(lines)} samples")
EOF
# NAME=FLAGS (a variant's flags joined by commas), as qwen25_coder.sh's search takes them
for v in ${VARIANTS:-base= eager=--no-compile packed=--pack-context fused=--fused-adam}; do
  name=${v%%=*}
  flags=${v#*=}
  step "$name" 300 python -m sglang_aux.tools.train_dflash --recipe $recipe \
    --target qwen2.5-1.5b-shaped --mask-token 151662 --phase train --samples-file "$samples" --extra-samples-file \
    --out "/tmp/train-step/$name" --steps "${STEPS:-100}" --log-every 20 --profile-steps 20 \
    ${flags//,/ }
done
cat "$out/status.txt"
# the table: each variant's profiled step and the pace of its steps from 40 on, against base's
python benchmark/training/train_step_table.py "$out" $([ -f "$out/base.log" ] && echo --base=base) \
  | tee "$out/table.md"

"""Named sets of `train_dflash` flag defaults: the recipes of the drafts we train, and the
smoke run's (`--smoke`)."""

from __future__ import annotations

from pathlib import Path

from sglang_aux.tools.dflash_training.code_tasks import MORE_TASKS_FILE, TASKS_FILE


def shipped_samples(recipe: str) -> Path:
    """Where a recipe's generated samples are kept in the package, when they are: its
    training then starts without the target generating them (`--samples-file`'s default)."""
    return TASKS_FILE.parent / f"{recipe}.samples.jsonl.xz"  # the package's data folder


# Named drafts trained by one command (`--recipe NAME`): the flags that make each, applied as
# defaults (flags given beside `--recipe` still win). The draft is written to the cache folder
# its name resolves to. Why these choices: the draft's card (`docs/drafts/<name>.md`).
# The GSM8K-only recipe (the default name's until 2026-12-07, when the mix below passed it on
# GSM8K too): its samples are shipped (43,608 continuations of every train question but the
# shots and the held-out 200, greedy + 5 sampled: 6.4 MB of xz, generated on the H200).
GSM8K = "qwen2.5-coder-1.5b-instruct-dflash-b16-gsm8k"
RECIPES: dict[str, dict] = {
    GSM8K: dict(
        target="qwen2.5-coder-1.5b-instruct", block_size=16, num_layers=2, num_aux_layers=5,
        intermediate_size=2816, gamma=7.0, sampled_passes=5, sample_temperature=0.7,
        gen_batch=256, holdout=200, steps=6_120, samples_file=str(shipped_samples(GSM8K))),
}
# The default Qwen2.5-Coder draft, for what users send a coder model (issue 40): code tasks and
# self-instruct chat beside GSM8K, greedy + 3 sampled answers of each prompt (32,000
# continuations, shipped: 8.1 MB of xz), and the GSM8K recipe's continuations of the 4,268
# questions it lacks (25,608).
# Trained over its draft vocabulary (the search: the same held-out accept as the whole
# vocabulary's at 1.75x the steps a second), the rows' hidden states kept as MXFP8 (the 57,608
# sequences' rows took 77 GB of host memory beside the device's, where an H100 machine has 128
# GiB; about 87 GB in all since each prompt's are kept once).
# 1% of its sequences are held out, their objective logged as it trains, and the draft
# written is its best validation's. At these steps on an H100 (docs/benchmarks.md section 9s):
# held-out accept 4.95 on GSM8K (the GSM8K recipe's draft: 4.11), 2.58 on HumanEval, 2.08 on
# chat.
MIX = "qwen2.5-coder-1.5b-instruct-dflash-b16"
RECIPES[MIX] = dict(
    RECIPES[GSM8K], sampled_passes=3, num_samples=3_000,
    code_tasks=3_000, code_tasks_file=str(TASKS_FILE), chat_instructions=2_000,
    code_chat_max_new_tokens=512, samples_file=str(shipped_samples(MIX)),
    extra_samples_file=[str(shipped_samples(GSM8K))], mxfp8_rows=True, steps=24_000,
    train_over_token_map=True, val_samples=320, keep_best=True)
# A second set of the mix's code and chat prompts (no GSM8K: the GSM8K recipe's already
# follow the mix): 3,000 code tasks of functions the mix's tasks are not, 2,000 chat requests
# the target writes from another seed. Its samples are made by `--phase data` (on a GPU:
# `qwen25_coder.sh gen`) and trained beside the mix's with `--extra-samples-file`.
MIX_MORE = f"{MIX}-more"
RECIPES[MIX_MORE] = dict(
    RECIPES[MIX], num_samples=0, code_tasks_file=str(MORE_TASKS_FILE), seed=1,
    samples_file=str(shipped_samples(MIX_MORE)), extra_samples_file=[])
# DSpark beside the GSM8K recipe on its data, schedule and deadline; gamma 15 verifies the same 16
# tokens per request as the block-16 DFlash draft
RECIPES["qwen2.5-coder-1.5b-instruct-dspark-b15-gsm8k"] = dict(
    RECIPES[GSM8K], algorithm="dspark", block_size=15)
# DSpark beside the mix recipe (issue 41's comparison on what users send): its samples, draft
# vocabulary (the Markov head's rows and the base logits cut to it, as it is served), held-out
# prompts and schedule
RECIPES["qwen2.5-coder-1.5b-instruct-dspark-b15"] = dict(
    RECIPES[MIX], algorithm="dspark", block_size=15)
# SmolLM2's DSpark draft on its shipped DFlash draft's data and schedule (greedy + 2 sampled
# passes, 4,500 steps, 2 layers, K = 5, loss decay 4); gamma 7 verifies the same 8 tokens per
# request as the block-8 DFlash draft. Not shipped: its Markov head alone (rank 256 over a
# 49,152 vocabulary) is 50 MB in bf16.
RECIPES["smollm2-135m-instruct-dspark-b7"] = dict(
    target="smollm2-135m-instruct", algorithm="dspark", block_size=7, num_layers=2,
    num_aux_layers=5, gamma=4.0, sampled_passes=2, sample_temperature=0.7, gen_batch=256,
    holdout=200, steps=4_500)
# A tiny-llama target, a few samples and steps on the CPU: the whole pipeline in seconds
SMOKE_DEFAULTS = dict(target="tiny-llama", num_samples=6, num_shots=0, max_new_tokens=24,
                      gen_batch=8, num_layers=1, num_aux_layers=2, block_size=4, steps=20,
                      batch_size=4, anchors_per_seq=4, log_every=5, eval_num_prompts=2,
                      context_length=1024, device="cpu", markov_rank=16)

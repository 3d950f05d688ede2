"""Named sets of `train_dflash` flag defaults: the recipes of the drafts we train, and the
smoke run's (`--smoke`)."""

from __future__ import annotations

from pathlib import Path

from sglang_aux.tools.dflash_training.code_tasks import TASKS_FILE


def shipped_samples(recipe: str) -> Path:
    """Where a recipe's generated samples are kept in the package, when they are: its
    training then starts without the target generating them (`--samples-file`'s default)."""
    return TASKS_FILE.parent / f"{recipe}.samples.jsonl.xz"  # the package's data folder


# Named drafts trained by one command (`--recipe NAME`): the flags that make each, applied as
# defaults (flags given beside `--recipe` still win). The draft is written to the cache folder
# its name resolves to. Why these choices: the draft's card (`docs/drafts/<name>.md`).
RECIPES: dict[str, dict] = {
    "qwen2.5-coder-1.5b-instruct-dflash-b16": dict(
        target="qwen2.5-coder-1.5b-instruct", block_size=16, num_layers=2, num_aux_layers=5,
        intermediate_size=2816, gamma=7.0, sampled_passes=5, sample_temperature=0.7,
        gen_batch=256, holdout=200, steps=6_120),
}
# The candidate for what users send a coder model (issue 40): code tasks and self-instruct chat
# beside GSM8K, greedy + 3 sampled answers of each prompt. Its samples are generated and
# shipped (32,000 continuations, 8.1 MB of xz: docs/training.md); it replaces the recipe above
# once its draft is measured against that one's (until then its step count is that one's).
# Trained over its draft vocabulary: the search measured the same held-out accept as the full
# vocabulary's at 2,000 steps (GSM8K 2.786 against 2.791) at 1.75x the steps a second. 1% of
# its sequences are held out, their objective logged as it trains: trained for many epochs
# of the same 32,000 (a session's run is 27,000 steps eager, about twice that compiled),
# the curve says when it overfits, and the draft written is its best validation's.
MIX = "qwen2.5-coder-1.5b-instruct-dflash-b16-mix"
RECIPES[MIX] = dict(
    RECIPES["qwen2.5-coder-1.5b-instruct-dflash-b16"], sampled_passes=3, num_samples=3_000,
    code_tasks=3_000, code_tasks_file=str(TASKS_FILE), chat_instructions=2_000,
    code_chat_max_new_tokens=512, samples_file=str(shipped_samples(MIX)),
    train_over_token_map=True, val_samples=320, keep_best=True)
# DSpark beside it on the same data, schedule and deadline; gamma 15 verifies the same 16
# tokens per request as the block-16 DFlash draft
RECIPES["qwen2.5-coder-1.5b-instruct-dspark-b15"] = dict(
    RECIPES["qwen2.5-coder-1.5b-instruct-dflash-b16"], algorithm="dspark", block_size=15)
# DSpark beside the mix recipe (issue 41's comparison on what users send): its samples, draft
# vocabulary (the Markov head's rows and the base logits cut to it, as it is served), held-out
# prompts and schedule
RECIPES["qwen2.5-coder-1.5b-instruct-dspark-b15-mix"] = dict(
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

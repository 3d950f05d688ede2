"""Evaluation prompts kept out of training data: a draft trained on the prompts it is measured
on reports an accept length users never see. Samples hold token ids, so their prompts are
decoded and every evaluation prompt (a GSM8K test question, a held-out train question, a
HumanEval prompt and its signature, a chat evaluation prompt) is looked for in that text,
both with their whitespace runs collapsed to one space (so a reindented docstring or a
template's line breaks still match)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

from sglang_aux.tools.dflash_training.data import (
    BadInputError,
    Sample,
    by_source,
    common_prefix_len,
)

# Tokens of the shared k-shot prefix decoded again with each prompt's own part, so a question
# that starts inside the shared tokens is still found whole.
PREFIX_OVERLAP_TOKENS = 16
PREVIEW_CHARS = 60  # of the offending prompt, in the error


def normalized(text: str) -> str:
    return " ".join(text.split())


def check_no_eval_prompts(samples: list[Sample], decode: Callable[[list[int]], str],
                          eval_sets: dict[str, list[str]], data_name: str) -> None:
    """`BadInputError` naming `data_name`, the first sample (in file order) whose prompt
    holds an evaluation prompt, and that prompt's set and index, when one does.
    `eval_sets` maps where prompts come from (a file) to the prompts."""
    texts: list[str] = []
    owners: list[int] = []  # the sample each text is first found in
    for index in by_source(samples).values():  # each source's prompts share their own prefix
        group = [samples[i] for i in index]
        shared = common_prefix_len(group)
        skip = max(0, shared - PREFIX_OVERLAP_TOKENS)
        firsts: dict[tuple[int, ...], int] = {}  # each distinct prompt part -> first sample
        for i, s in zip(index, group, strict=True):
            firsts.setdefault(tuple(s.prompt_ids[skip:]), i)
        # the shared part (in every sample of the source, so its first's), then each part
        texts += [decode(group[0].prompt_ids[:shared])] + [decode(list(t)) for t in firsts]
        owners += [index[0], *firsts.values()]
    # one text, searched once per evaluation prompt, its parts joined by NUL (in no prompt)
    texts = [normalized(t) for t in texts]
    starts, pos = [], 0
    for t in texts:
        starts.append(pos)
        pos += len(t) + 1
    text = "\0".join(texts)
    found: tuple[int, str, int, str] | None = None  # (sample, set, index, prompt)
    for name, prompts in eval_sets.items():
        for j, prompt in enumerate(prompts):
            at = text.find(normalized(prompt)) if prompt.strip() else -1
            if at < 0:
                continue
            sample = owners[bisect_right(starts, at) - 1]
            if found is None or sample < found[0]:
                found = (sample, name, j, prompt)
    if found is not None:
        sample, name, j, prompt = found
        preview = prompt.strip()[:PREVIEW_CHARS]
        raise BadInputError(f"{data_name}: sample {sample}'s prompt holds evaluation prompt {j} "
                            f"of {name} ({preview!r}...); keep evaluation prompts out of "
                            "training data")


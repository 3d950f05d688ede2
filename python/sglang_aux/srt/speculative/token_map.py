"""The draft vocabulary (FR-Spec; SGLang's `--speculative-token-map`): the H token ids a DFlash
draft may propose, its LM head cut to their rows.

On a 151,936-token vocabulary the draft's LM head and argmax are about half of a Qwen2.5-1.5B
DFlash draft block (docs/benchmarks.md section 9k); the 32,768 ids a target writes most cover
99.5-99.9% of what it writes (`build_token_map`). The draft then proposes `ids[argmax]`, and
a sampled proposal's distribution is the hot logits' softmax placed at `ids` in a full
vocabulary row (zero elsewhere), so the rejection test and its residual stay exact.

The file is SGLang's: a tensor or list of ids saved with `torch.save`, loaded with
`weights_only`; a path that is not a file is `REPO/FILE` on the Hugging Face hub, as SGLang
reads it (fetched when `huggingface_hub` is installed), or `NAME/FILE` for a built-in draft
NAME (`train_dflash` writes `freq_32768.pt` beside a draft of a larger vocabulary).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sglang_aux.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang_aux.srt.layers.vocab_parallel_embedding import vocab_range
from sglang_aux.srt.model_loader.builtin import SHIPPED_DRAFTS, TRAINED_DRAFTS, resolve_model_path


def resolve_token_map_path(path: str) -> str:
    """A local file as given; `NAME/FILE` in the folder of the built-in draft NAME; else
    SGLang's hub form `REPO/FILE`, downloaded."""
    if os.path.isfile(path):
        return path
    repo, name = os.path.dirname(path), os.path.basename(path)
    if repo in SHIPPED_DRAFTS or repo in TRAINED_DRAFTS:
        file = Path(resolve_model_path(repo)) / name  # an untrained draft: its own message
        if not file.is_file():
            raise FileNotFoundError(f"--speculative-token-map {path}: the draft {repo!r} "
                                    f"({file.parent}) has no {name}")
        return str(file)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise FileNotFoundError(
            f"--speculative-token-map {path}: no such file (a hub path REPO/FILE needs "
            "huggingface_hub installed)") from None
    if not repo or not name:
        raise FileNotFoundError(f"--speculative-token-map {path}: no such file")
    return hf_hub_download(repo_id=repo, filename=name)


def load_token_map(path: str, vocab_size: int) -> torch.Tensor:
    """The draft vocabulary's ids, int64 `[H]` on the host, in the file's order (row j of the
    cut head is token `ids[j]`). Refuses what would make a proposal wrong: ids outside the
    target's vocabulary, repeated ids, anything but a non-empty 1-D list of integers."""
    file = resolve_token_map_path(path)
    try:
        raw = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle torch refuses, or not a torch file at all
        raise ValueError(f"--speculative-token-map {path}: not a tensor or list of token ids "
                         f"saved with torch.save ({type(e).__name__}: {e})") from None
    try:
        ids = torch.as_tensor(raw)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"--speculative-token-map {path}: holds {type(raw).__name__}, not a "
                         "tensor or list of token ids") from None
    if ids.dim() != 1 or ids.numel() == 0 or ids.is_floating_point() or ids.is_complex() \
            or ids.dtype == torch.bool:
        raise ValueError(f"--speculative-token-map {path}: needs a non-empty 1-D list of "
                         f"integer token ids, got {ids.dtype} {tuple(ids.shape)}")
    ids = ids.to(torch.int64)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise ValueError(f"--speculative-token-map {path}: id {int(bad[0])} is outside the "
                         f"target's vocabulary [0, {vocab_size}) ({bad.numel()} such ids)")
    unique, counts = ids.unique(return_counts=True)
    if unique.numel() != ids.numel():
        raise ValueError(f"--speculative-token-map {path}: id {int(unique[counts > 1][0])} "
                         f"is listed more than once ({ids.numel() - unique.numel()} repeats)")
    return ids


def cut_lm_head(lm_head_shard: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """`lm_head[ids]` `[H, hidden]` on every rank, from each rank's vocabulary shard `[V / tp,
    hidden]`: each rank fills the rows it holds and the zeros elsewhere sum away exactly. The
    cut head is replicated, so its logits need no gather."""
    start, end = vocab_range(vocab_size)
    if lm_head_shard.shape[0] != end - start:
        raise ValueError(f"LM head shard {tuple(lm_head_shard.shape)} does not hold this rank's "
                         f"vocabulary rows [{start}, {end})")
    ids = ids.to(lm_head_shard.device)
    mine = (ids >= start) & (ids < end)
    rows = torch.zeros((ids.numel(), lm_head_shard.shape[1]), dtype=lm_head_shard.dtype,
                       device=lm_head_shard.device)
    rows[mine] = lm_head_shard[ids[mine] - start]
    return tensor_model_parallel_all_reduce(rows)

"""Collectives over this process's TP group, by SGLang's names; each is the identity on one
rank, so single-device code runs them unchanged."""

from __future__ import annotations

import torch

from sglang_aux.srt.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    return get_tp_group().all_reduce(x)


def tensor_model_parallel_all_gather(x: torch.Tensor,
                                     out: torch.Tensor | None = None) -> torch.Tensor:
    return get_tp_group().all_gather(x, out)


def broadcast_from_first_rank(x: torch.Tensor) -> torch.Tensor:
    """Rank 0's `x` on every rank, in place: what decides tokens, so ranks cannot diverge."""
    return get_tp_group().broadcast(x, 0)

"""The token embedding and the LM head split by vocabulary rows over the TP group (SGLang's
`VocabParallelEmbedding` / `ParallelLMHead`).

Rank r holds rows `[r * V / tp, (r + 1) * V / tp)` (the vocabulary must divide; no padding).
The embedding looks up the ids in its range, zeroes the others and sums over ranks; the LM
head's logits are each rank's columns, all-gathered to `[rows, V]` on every rank.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sglang_aux.srt.distributed.communication_op import (
    tensor_model_parallel_all_gather,
    tensor_model_parallel_all_reduce,
)
from sglang_aux.srt.distributed.parallel_state import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)


def vocab_range(vocab_size: int) -> tuple[int, int]:
    """This rank's `[start, end)` of the vocabulary."""
    per = divide(vocab_size, get_tensor_model_parallel_world_size(), "vocab_size")
    start = get_tensor_model_parallel_rank() * per
    return start, start + per


class VocabParallelEmbedding(nn.Embedding):
    """An `nn.Embedding` of this rank's vocabulary rows (all of them on one rank)."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.vocab_start, self.vocab_end = vocab_range(num_embeddings)
        super().__init__(self.vocab_end - self.vocab_start, embedding_dim)
        self.org_vocab_size = num_embeddings
        self.weight.tp_slice = (0, self.vocab_start, num_embeddings)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.num_embeddings == self.org_vocab_size:
            return F.embedding(input_ids, self.weight)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = (input_ids - self.vocab_start).masked_fill(outside, 0)
        out = F.embedding(local, self.weight).masked_fill(outside[..., None], 0)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(nn.Module):
    """The untied LM head's weight rows of this rank's vocabulary `[V / tp, hidden]`."""

    def __init__(self, num_embeddings: int, embedding_dim: int):
        super().__init__()
        start, end = vocab_range(num_embeddings)
        self.weight = nn.Parameter(torch.empty(end - start, embedding_dim))
        self.weight.tp_slice = (0, start, num_embeddings)


def lm_head_logits(rows: torch.Tensor, weight: torch.Tensor,
                   out: torch.Tensor | None = None, replicated: bool = False) -> torch.Tensor:
    """Logits `[N, V]` of hidden rows `[N, H]` against this rank's LM head rows `[V / tp, H]`,
    gathered over ranks (into `out` when given: a graph's static buffer); a `replicated` head
    (every rank's the whole, as a draft vocabulary's) needs no gather."""
    if replicated or get_tensor_model_parallel_world_size() == 1:
        return torch.matmul(rows, weight.t(), out=out) if out is not None \
            else torch.matmul(rows, weight.t())
    return tensor_model_parallel_all_gather(torch.matmul(rows, weight.t()), out)

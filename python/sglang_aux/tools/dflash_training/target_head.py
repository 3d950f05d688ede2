"""The target's frozen LM head as the training objectives read it: its logits on rows, and a
token's logsumexp over the whole vocabulary, kept beside the token's DSpark row so a draft
trained over a draft vocabulary reads the target's distribution at those ids alone.

Why keep the logsumexp: a DSpark row is matched to the target's next-token distribution, and
over a draft vocabulary of M ids only those ids' probabilities and the mass off them enter the
loss (`dspark_objective.row_terms`). Both follow from the M logits and the whole vocabulary's
logsumexp, which one full-head product per token gives once, when the features are extracted;
without it every training step runs the whole head on every block row (Qwen2.5-Coder-1.5B:
151,936 ids against the draft vocabulary's 32,768, 4.6x the product and its softmax). The
logsumexp is fp32, its bytes kept as the row's last columns in the row's own dtype (two in
bf16), so the rows' copies, host memory and batches carry it unchanged."""

from __future__ import annotations

import torch

LOGSUMEXP_CHUNK_ROWS = 1024  # rows of whole-vocabulary logits at a time: 0.6 GB fp32 on Qwen


def head_logits(h: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """`h @ lm_head.t()`, the frozen LM head read as it is. Under autocast the product runs in
    its dtype whatever the operands', so the head is not cast to `h`'s dtype first: the
    draft's fp32 rows and a bf16 head made a cast of the whole head to fp32 and one back at
    every loss slice (four a mix step; the compiled step's 5% in a materialized copy), for
    the same product, bit for bit. Without autocast, the head in `h`'s dtype."""
    if torch.is_autocast_enabled(h.device.type):
        return h @ lm_head.t()
    return h @ lm_head.t().to(h.dtype)


def logsumexp_columns_count(dtype: torch.dtype) -> int:
    """How many columns of a row in `dtype` hold one fp32 logsumexp."""
    size = torch.empty((), dtype=dtype).element_size()
    if 4 % size:
        raise ValueError(f"rows in {dtype} cannot hold an fp32 logsumexp's bytes")
    return 4 // size


@torch.no_grad()
def target_logsumexp(final: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
    """`[T]` fp32: the logsumexp of each final hidden row's logits (`head_logits`, in the
    rows' dtype, as the training step computes them) over the whole vocabulary, a chunk of
    rows at a time."""
    return torch.cat([torch.logsumexp(head_logits(c, lm_head).float(), -1)
                      for c in final.split(LOGSUMEXP_CHUNK_ROWS)]) if len(final) else \
        final.new_zeros(0, dtype=torch.float32)


def logsumexp_columns(lse: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[T]` fp32 as `[T, logsumexp_columns_count(dtype)]` columns of `dtype` holding its
    bytes (copies keep them; `read_logsumexp` gives the floats back)."""
    return lse.float().contiguous().view(dtype).view(len(lse), -1)


def read_logsumexp(columns: torch.Tensor) -> torch.Tensor:
    """`[..., C]` columns written by `logsumexp_columns` -> `[...]` fp32."""
    return columns.contiguous().view(torch.float32).squeeze(-1)

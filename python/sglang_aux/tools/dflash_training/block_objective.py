"""The DFlash block objective.

A training example is a block at a random anchor inside the target's continuation: the
context is the aux rows of every token before the anchor, the block `[anchor, MASK x (B-1)]`
sits at positions anchor..anchor+B-1, and offset j is trained to predict the true token at
anchor + j (j = 1..B-1) with cross-entropy weighted `exp(-(j - 1) / gamma)`: early offsets
matter most, since a draft token only counts when every one before it was accepted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from sglang_aux.tools.dflash_training.sequence_set import Batch
from sglang_aux.tools.dflash_training.sliced_loss import SLICE_ROWS, loss_in_slices
from sglang_aux.tools.dflash_training.target_head import head_logits

IGNORE = -100  # label of positions past a sequence's end and of offset 0 (the anchor)
OFF_VOCAB = -1  # label of a token the draft vocabulary leaves out: never trained, never right


def block_labels(batch: Batch, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """`[N, A, B]`: the true token at anchor + j for j >= 1, IGNORE past the end and at j = 0."""
    pos = anchors[:, :, None] + torch.arange(block_size, device=anchors.device)
    valid = pos < batch.lens[:, None, None]
    labels = batch.ids.gather(1, pos.clamp(max=batch.ids.shape[1] - 1).flatten(1))
    labels = torch.where(valid, labels.view(pos.shape), IGNORE)
    labels[:, :, 0] = IGNORE
    return labels


def offset_weights(block_size: int, gamma: float, device: torch.device) -> torch.Tensor:
    j = torch.arange(block_size, device=device, dtype=torch.float32)
    w = torch.exp(-(j - 1) / gamma)
    w[0] = 0.0
    return w


def vocab_labels(labels: torch.Tensor, label_rows: torch.Tensor) -> torch.Tensor:
    """Token labels as rows of an LM head cut to a draft vocabulary (`label_rows` `[V]`: each
    token's row, OFF_VOCAB for the tokens left out); IGNORE stays."""
    return torch.where(labels == IGNORE, IGNORE, label_rows[labels.clamp(min=0)])


def slice_cross_entropy(h: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
                        weights: torch.Tensor, den: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One slice of `block_loss`: hidden rows `[S, B, H]` through the LM head, their fp32
    cross-entropy weighted and divided by `den`, and which offsets the argmax gets right."""
    logits = head_logits(h, lm_head)
    hit = labels >= 0
    ce = F.cross_entropy(logits.flatten(0, 1).float(),
                         torch.where(hit, labels, IGNORE).flatten(), ignore_index=IGNORE,
                         reduction="none").view(labels.shape)
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels) & hit
    return (ce * weights).sum() / den, correct


def block_loss(hidden: torch.Tensor, lm_head: torch.Tensor, labels: torch.Tensor,
               weights: torch.Tensor, slice_rows: int = SLICE_ROWS,
               slice_loss: Callable = slice_cross_entropy) -> tuple[torch.Tensor, dict]:
    """Weighted cross-entropy over valid block offsets of the draft's hidden states
    `[N, A, B, H]` through the (frozen) LM head, `slice_rows` logit rows at a time
    (`loss_in_slices`), plus per-offset accuracy and the accept length greedy verification
    would give (1 + the run of correct offsets from 1). Stats stay on the device. Over a
    draft vocabulary (`vocab_labels`) an OFF_VOCAB offset is left out of the loss and counts
    as wrong, as the draft can never propose it."""
    b = labels.shape[-1]
    valid = labels != IGNORE
    trained = labels >= 0
    w = weights * trained
    den = w.sum()

    def one_slice(h: torch.Tensor, lab: torch.Tensor, wt: torch.Tensor):
        loss, correct = slice_loss(h, lm_head, lab, wt, den)
        return loss, {"correct": correct}

    loss, parts = loss_in_slices(one_slice, [hidden.flatten(0, 1)],
                                 [labels.flatten(0, 1), w.flatten(0, 1)],
                                 max(1, slice_rows // b))
    with torch.no_grad():
        correct = parts["correct"]
        acc = correct.sum(0) / valid.flatten(0, 1).sum(0).clamp(min=1)
        accept = 1 + correct[:, 1:].int().cumprod(-1).sum(-1).float().mean()
    return loss, {"loss": loss.detach(), "acc": acc[1:], "accept": accept}

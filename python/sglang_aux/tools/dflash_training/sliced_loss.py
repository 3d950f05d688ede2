"""LM-head losses over slices of blocks, so that one slice's logits exist at a time.

A training step's logits are `[blocks x rows per block, V]`: on Qwen2.5-Coder-1.5B (V 151,936)
32 sequences x 16 blocks x 16 rows are 1.25 G logits, 5 GB in fp32, and the loss keeps
several such tensors (the fp32 copy, log-softmax, its gradient; DSpark adds both softmaxes
and their difference: ~40 GB). Computed slice by slice, each slice's loss is back-propagated
to its own inputs at once and its logits are freed, so the step holds one slice's worth.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

SliceLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
# Logit rows a slice holds at most: `[2,048, 151,936]` is 1.2 GB in fp32.
SLICE_ROWS = 2048


def loss_in_slices(slice_loss: SliceLoss, inputs: list[torch.Tensor],
                   others: list[torch.Tensor], blocks_per_slice: int
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """`slice_loss(*inputs[s:e], *others[s:e])` over consecutive slices of `blocks_per_slice`
    blocks (every tensor's leading dimension): the summed loss, differentiable in `inputs`,
    and each stat (a tensor led by the slice's blocks) concatenated over the slices.

    Each slice's loss is back-propagated into detached copies of `inputs` as soon as it
    exists; the returned loss hands the collected gradients on to `inputs`' graph in the
    caller's backward (value: the sum of the slices'; gradient in every input row: exactly
    its slice's). Parameters `slice_loss` reads directly get their gradient during this
    call, so the caller zeroes gradients before it. Without autograd nothing is
    back-propagated.
    """
    if blocks_per_slice < 1:
        raise ValueError(f"blocks_per_slice must be >= 1, got {blocks_per_slice}")
    train = torch.is_grad_enabled() and any(x.requires_grad for x in inputs)
    leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
    total, parts = None, []
    for s in range(0, inputs[0].shape[0], blocks_per_slice):
        part = slice(s, s + blocks_per_slice)
        loss, stats = slice_loss(*(x[part] for x in leaves), *(o[part] for o in others))
        if train:
            loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
        parts.append(stats)
    stats = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    if not train:
        return total, stats
    handed_on = sum((x * leaf.grad).sum() for x, leaf in zip(inputs, leaves, strict=True)
                    if leaf.grad is not None)
    return total + (handed_on - handed_on.detach()), stats

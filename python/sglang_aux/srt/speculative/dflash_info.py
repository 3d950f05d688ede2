"""Verifying a drafted block: greedy longest-prefix acceptance and lossless rejection sampling.

A block for one request is `[anchor, d_1 .. d_{B-1}]`; the target's row i predicts the token
after block position i. Draft `d_{i+1}` is accepted while it matches (greedy) or passes the
rejection test (sampling) against target row i; the first target row past the accepted drafts
gives one more token (the bonus, or the corrected token), so a step emits accepted + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BlockVerdict:
    accepted: int  # accepted drafts, 0..B-1
    tokens: list[int]  # emitted tokens: the accepted drafts, then the bonus/correction

    @property
    def accept_length(self) -> int:
        return self.accepted + 1


def greedy_verify(drafts: list[int], target_argmax: list[int]) -> BlockVerdict:
    """`drafts` `[B-1]`, `target_argmax` `[B]` (the target's greedy token after each position)."""
    n = 0
    while n < len(drafts) and drafts[n] == target_argmax[n]:
        n += 1
    return BlockVerdict(n, drafts[:n] + [target_argmax[n]])


def rejection_verify(drafts: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator | None = None) -> BlockVerdict:
    """Speculative sampling: emitted tokens are distributed as sampling from the target alone.

    `draft_probs` `[B-1, V]`: the distribution each draft was sampled from; `target_probs`
    `[B, V]`: the target's distribution after each block position (after the same temperature,
    top-k and top-p transform). Host tensors.
    """
    for i, d in enumerate(drafts):
        p, q = target_probs[i, d], draft_probs[i, d]
        u = torch.rand((), generator=generator)
        if q > 0 and u * q <= p:
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        if residual.sum() <= 0:  # p == q: any rejection is measure zero; fall back to p
            residual = target_probs[i]
        tok = int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
        return BlockVerdict(i, drafts[:i] + [tok])
    bonus = int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator))
    return BlockVerdict(len(drafts), [*drafts, bonus])

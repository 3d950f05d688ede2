"""Verifying drafted blocks on the device: greedy longest prefix and lossless rejection sampling.

A request verifies `[anchor, d_1 .. d_{W-1}]` (W: its verify width, `d` its draft's proposals);
the target's row i predicts the token
after block position i. Draft `d_{i+1}` is accepted while it matches (greedy) or passes the
rejection test (sampling) against target row i; the first target row past the accepted drafts
gives one more token (the bonus, or the corrected token), so a step emits accepted + 1.
Both verifiers are batched tensor code without host syncs (capturable in a graph). A request
that verified only its first `num_verified` block tokens (DSpark's compact verify) accepts at
most `num_verified - 1` drafts; the token after them comes from the target alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.sampling.sampler import sample_from_probs


@dataclass
class BlockVerdicts:
    accepted: torch.Tensor  # [bs] int64, accepted drafts 0..W-1
    tokens: torch.Tensor  # [bs, W] int64; row r emits tokens[r, : accepted[r] + 1]

    def packed(self) -> torch.Tensor:
        """`[bs, W + 1]`: accepted, then the tokens (what the host reads back)."""
        return torch.cat([self.accepted[:, None], self.tokens], dim=1)


def _verified(match: torch.Tensor, num_verified: torch.Tensor | None) -> torch.Tensor:
    """`match` `[bs, W-1]` where each request's drafts past its verified tokens fail."""
    if num_verified is None:
        return match
    offset = torch.arange(match.shape[1], device=match.device)
    return match & (offset < num_verified[:, None] - 1)


def greedy_verify(drafts: torch.Tensor, target_argmax: torch.Tensor,
                  num_verified: torch.Tensor | None = None) -> BlockVerdicts:
    """`drafts` `[bs, W-1]`, `target_argmax` `[bs, W]` (the target's greedy token after each
    block position; past a request's `num_verified` `[bs]` tokens, never read). Accepted
    drafts equal the target's tokens, so the emitted tokens are the target's argmax row."""
    match = _verified(drafts == target_argmax[:, :-1], num_verified)
    return BlockVerdicts(match.long().cumprod(-1).sum(-1), target_argmax)


def rejection_verify(drafts: torch.Tensor, draft_probs: torch.Tensor,
                     target_probs: torch.Tensor, u_accept: torch.Tensor,
                     u_residual: torch.Tensor,
                     num_verified: torch.Tensor | None = None) -> BlockVerdicts:
    """Speculative sampling: emitted tokens are distributed as sampling from the target alone.

    `drafts` `[bs, W-1]`, sampled from `draft_probs` `[bs, W-1, V]`; `target_probs` `[bs, W, V]`:
    the target's distribution after each block position (after the same temperature, top-k
    and top-p transform). `u_accept` `[bs, W-1]` and `u_residual` `[bs, W]` are independent
    uniforms: the rejection test of each draft, and the draw of the token after j accepted
    drafts (from the residual `max(p - q, 0)`, or from p for the bonus). `num_verified`
    `[bs]`: tokens each request verified (target rows past them are never read); a request
    that accepts all its verified drafts draws the next token from p, as a full block's bonus.
    """
    bs, num_drafts = drafts.shape
    vocab = target_probs.shape[-1]
    p = target_probs[:, :-1].gather(-1, drafts[..., None])[..., 0]  # [bs, W-1]
    q = draft_probs.gather(-1, drafts[..., None])[..., 0]
    # p = 0 (a token the target's processing or grammar excludes) is never accepted, even
    # on a draw of exactly 0
    ok = (q > 0) & (p > 0) & (u_accept * q <= p)
    ok = _verified(ok, num_verified)
    accepted = ok.long().cumprod(-1).sum(-1)  # [bs]
    limit = num_drafts if num_verified is None else num_verified - 1
    at = accepted[:, None, None].expand(bs, 1, vocab)
    p_next = target_probs.gather(1, at)[:, 0]  # [bs, V]
    # after all W-1 drafts there is no draft distribution: the bonus draws from p alone
    if num_drafts:
        q_next = draft_probs.gather(1, at.clamp_max(num_drafts - 1))[:, 0]
        q_next = torch.where((accepted < limit)[:, None], q_next, 0.0)
    else:  # the anchor alone (plain decoding): the next token draws from p
        q_next = torch.zeros_like(p_next)
    residual = (p_next - q_next).clamp_min_(0)
    # p == q: a rejection has probability zero; should rounding produce one, draw from p
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    last = sample_from_probs(residual, u_residual.gather(1, accepted[:, None])[:, 0])
    offset = torch.arange(num_drafts + 1, device=drafts.device)
    padded = torch.cat([drafts, last[:, None]], dim=1)
    tokens = torch.where(offset < accepted[:, None], padded, last[:, None])
    return BlockVerdicts(accepted, tokens)

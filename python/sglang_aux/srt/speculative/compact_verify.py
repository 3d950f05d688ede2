"""`compact` verify (SGLang's `SGLANG_RAGGED_VERIFY_MODE=compact`): how many tokens each
request of the DFlash family verifies this step.

Each proposal k of a request comes with a confidence, the estimated probability that it is
accepted given proposals 0..k-1 were: DSpark's confidence head, or for DFlash, whose draft has
none, the draft's own probability of its proposal (`max_probability`). Proposal k is accepted
only if proposals 0..k all are, so its survival is `cumprod(confidence[r])[k]`, and verifying
it is worth that survival in expected accepted tokens. Every request verifies its anchor (1
token); the `budget` extra tokens go to the globally most likely survivals, one top-k over all
requests (SGLang's `compact` mode), so a request verifies 1 + (its chosen survivals) <= gamma
+ 1 tokens (gamma: proposals per request). Survivals below `survival_eps` are never chosen.
Ties go to the earlier block position, then the lower request index. Survival does not grow
along a row, so each request's choice is a prefix.

The step's TARGET_VERIFY graph is the captured token bucket that holds the most the budget
allows, `bs + min(budget, bs * gamma)`, known on the host without reading the confidences;
no host sync, fixed shapes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch

SURVIVAL_EPS = 1e-6  # SGLang's default
CONFIDENCE_ROWS = 256  # rows of draft logits whose softmax temporaries exist at once


@dataclass
class CompactVerifyLens:
    verify_lens: torch.Tensor  # [bs] int32, in [1, gamma + 1], summing to <= num_tokens
    num_tokens: int  # the captured token bucket the step's verify graph runs


def round_up_to_bucket(num_tokens: int, buckets: Sequence[int]) -> int:
    """The smallest captured token bucket holding `num_tokens`."""
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
        raise ValueError(f"token buckets must be distinct, ascending and >= 1, got "
                         f"{list(buckets)}")
    if num_tokens > buckets[-1]:
        raise ValueError(f"{num_tokens} verify tokens exceed the largest captured bucket "
                         f"{buckets[-1]}")
    return buckets[bisect.bisect_left(buckets, num_tokens)]


def compact_verify_lens(confidence: torch.Tensor, budget: int, buckets: Sequence[int],
                        survival_eps: float = SURVIVAL_EPS) -> CompactVerifyLens:
    """Verify lengths for confidences `[bs, gamma]` (each in [0, 1]) under `budget` extra
    tokens beyond one per request, and the token bucket of the step."""
    if confidence.dim() != 2 or confidence.shape[0] < 1 or confidence.shape[1] < 1:
        raise ValueError(f"confidence {tuple(confidence.shape)} must be [bs >= 1, gamma >= 1]")
    if budget < 0:
        raise ValueError(f"the verify token budget must be >= 0, got {budget}")
    bs, gamma = confidence.shape
    take = min(budget, bs * gamma)
    num_tokens = round_up_to_bucket(bs + take, buckets)
    survival = torch.cumprod(confidence.float(), dim=1)  # [bs, gamma]
    # position-major: flat index k * bs + r, so a stable sort breaks ties by (k, r)
    flat = survival.t().reshape(-1)
    valid = flat >= survival_eps
    order = torch.argsort(torch.where(valid, flat, -1.0), descending=True, stable=True)
    chosen = order[:take]
    extra = torch.zeros(bs, dtype=torch.int64, device=confidence.device)
    extra.scatter_add_(0, chosen % bs, valid[chosen].to(torch.int64))
    return CompactVerifyLens((1 + extra).to(torch.int32), num_tokens)


def max_probability(logits: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """DFlash's confidence: the largest softmax probability of each row of `logits` `[..., V]`
    (any view), the draft's probability of its greedy proposal, into `out` (float32, the
    leading shape, any view). The softmax exists for `CONFIDENCE_ROWS` rows at a time: whole,
    a Qwen2.5 draft block's at bs 64 would be 583 MB of float32."""
    if logits.dim() < 2 or tuple(out.shape) != tuple(logits.shape[:-1]) \
            or out.dtype != torch.float32:
        raise ValueError(f"out must be float32 {tuple(logits.shape[:-1])} for logits "
                         f"{tuple(logits.shape)} [..., vocab], got {out.dtype} "
                         f"{tuple(out.shape)}")
    step = max(1, CONFIDENCE_ROWS // max(1, logits[0, ..., 0].numel()))
    for s in range(0, logits.shape[0], step):
        rows = logits[s:s + step].float()
        out[s:s + step] = rows.amax(-1).sub_(rows.logsumexp(-1)).exp_()
    return out

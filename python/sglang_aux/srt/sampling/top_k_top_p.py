"""Top-k / top-p restriction of softmax(logits / T) without sorting the vocabulary.

Rule (per row): rank tokens by (probability descending, vocabulary index ascending); keep the
first top_k ranks; among those keep a token while the mass of the kept candidates ranked
before it is below top_p times the top-k mass (the first token always stays); renormalize.

The kept set is every token above a cut value `v` plus the first few tokens equal to `v`
(vocabulary order), so each row needs a value and a tie count, both found by bisection on
the float32 bit pattern of the probabilities (non-negative floats order like their int32
bits; every probability in [0, 1] has bits below 2**30, so 30 fixed halvings pin a value):
- top-k: `vk`, the largest `t` with count(p >= t) >= k, i.e. the k-th largest probability;
  ties at `vk` fill the `k - count(p > vk)` ranks left, lowest vocabulary index first;
- top-p: `v`, the largest `t >= vk` with mass(p >= t) >= top_p * M (M: the top-k mass), the
  smallest value whose first token still has less than that mass before it; ties at `v` are
  kept while mass(p > v) + j * v < top_p * M (j: their rank among the ties).
Masses are float32 sums over the row, not the running sum in sorted order, so a token whose
mass before it equals the boundary within float32 rounding may fall on either side of it;
every other decision (kept set, ties, top-k, the first token) is exact.

Probabilities are exp(x - max x), x = logits / T, unnormalized (the rule is scale-free; the
largest is exactly 1.0). Rows with top_k >= vocab skip the top-k search and rows with
top_p >= 1 the top-p search (this file computes both and selects, the kernel skips).
This torch version is the kernel's twin: CPU, and CUDA with the fused kernels off.
"""

from __future__ import annotations

import torch

SEARCH_STEPS = 30  # probabilities in [0, 1] have float32 bits in [0, 2**30)
SEARCH_END = 1 << SEARCH_STEPS
ONE_BITS = 0x3F800000  # float32 1.0, the largest unnormalized probability


def _as_float(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int32).view(torch.float32)


def _ge_mask(probs: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """mask <- 1.0 where probs >= the float with bits `t` `[rows]` (>= 1), else 0.0. Exact:
    subtraction is monotone, so p - below is >= gap (at - below, a power of two) exactly when
    p >= at and <= 0 otherwise; scaled by 1 / gap and clamped that is 1 or 0."""
    at, below = _as_float(t)[:, None], _as_float(t - 1)[:, None]
    return torch.sub(probs, below, out=mask).div_(at - below).clamp_(0.0, 1.0)


def _count(probs: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _ge_mask(probs, t, mask).sum(-1)  # 0/1 sums stay exact in float32 below 2**24


def _mass(probs: torch.Tensor, t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _ge_mask(probs, t, mask).mul_(probs).sum(-1)  # a pairwise sum: bmm's is ~100x off


def _bisect(lo: torch.Tensor, holds) -> torch.Tensor:
    """The largest t in [lo, SEARCH_END) with holds(t), for a predicate true at lo (assumed,
    not tested) and false from some point on; SEARCH_STEPS fixed halvings."""
    hi = torch.full_like(lo, SEARCH_END)
    for _ in range(SEARCH_STEPS):
        mid = lo + (hi - lo + 1) // 2  # > lo, so mid - 1 is a float's bits
        ok = holds(mid)
        lo, hi = torch.where(ok, mid, lo), torch.where(ok, hi, mid)
    return lo


def _unnormalized_probs(logits: torch.Tensor, temperature: torch.Tensor,
                       out: torch.Tensor) -> torch.Tensor:
    """out <- exp(x - max x), x = logits / T (T `[rows]`), in place."""
    out.copy_(logits).div_(temperature[:, None])
    return out.sub_(out.amax(-1, keepdim=True)).exp_()


def top_k_top_p_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                      top_p: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The restricted, renormalized distribution of each row into `out` (float32, the shape of
    `logits` `[rows, vocab]`). T `[rows]` float32 (> 0), top_k `[rows]` int64, top_p `[rows]`
    float32. Temporaries: one `[rows, vocab]` float32 mask and at most two boolean ones."""
    vocab = logits.shape[-1]
    probs = _unnormalized_probs(logits, temperature, out)
    bits = probs.view(torch.int32)
    mask = torch.empty_like(probs)
    k = top_k.clamp(1, vocab).to(torch.float32)
    zero = torch.zeros(k.shape, dtype=torch.int64, device=k.device)

    # rows that skip a search run it toward the top of the range, where floats are normal
    # (denormal arithmetic is ~100x slower on CPUs)
    off_k, off_p = k >= vocab, top_p >= 1.0
    vk = _bisect(zero, lambda t: _count(probs, t, mask) >= torch.where(off_k, 1.0, k))
    vk = torch.where(off_k, zero, vk)  # every token ranks inside the top k
    count_gt, mass_gt = _count(probs, vk + 1, mask), _mass(probs, vk + 1, mask)
    ties_k = k - count_gt  # ranks left for the tokens equal to vk
    target = top_p * (mass_gt + ties_k * _as_float(vk))

    v = _bisect(vk, lambda t: _mass(probs, t, mask) >= torch.where(off_p, 0.0, target))
    v = torch.where(off_p, vk, v).clamp_max(ONE_BITS)
    v_float = _as_float(v)
    room = ((target - _mass(probs, v + 1, mask)) / torch.where(v_float > 0, v_float, 1.0)).ceil()
    ties = torch.where(~off_p & (v_float > 0), room.clamp(max=vocab), vocab)
    # at least one: a top_p that is 0 in float32 still keeps the first token
    ties = torch.where(v == vk, torch.minimum(ties, ties_k), ties).clamp_min(1.0)

    v = v.to(torch.int32)[:, None]
    tied = bits == v
    torch.cumsum(tied, -1, out=mask)  # a tied token's rank among the ties, from 1
    tied &= mask > ties[:, None]  # the ties past the room
    probs.masked_fill_(tied, 0.0).masked_fill_(bits < v, 0.0)
    return probs.div_(probs.sum(-1, keepdim=True))

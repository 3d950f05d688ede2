"""The Triton kernel of `top_k_top_p`: one program per row, the same bisections on the float32
bits, each step one sweep of the row (count and mass in registers), so nothing but `out` is
written to memory. Rows with top_k >= vocab skip the top-k search and rows with top_p >= 1 the
top-p search: the common case costs four sweeps, the worst ~64."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.sampling.top_k_top_p import ONE_BITS, SEARCH_END, SEARCH_STEPS

MAX_BLOCK = 2048


@triton.jit
def _at_least(P, n, t, BLOCK: tl.constexpr):
    """count and mass of the probabilities P[:n] whose float32 bits are >= t."""
    count = tl.zeros([], dtype=tl.int32)
    mass = tl.zeros([], dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        p = tl.load(P + cols, mask=cols < n, other=-1.0)  # negative bits: never >= t
        ge = p.to(tl.int32, bitcast=True) >= t
        count += tl.sum(ge.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(ge, p, 0.0), axis=0)
    return count, mass


@triton.jit
def _kept(p, ties_before, v, ties):
    """Which of the chunk's probabilities `p` stay: above the cut, or among its first `ties`
    ties (`ties_before` tied tokens precede the chunk)."""
    b = p.to(tl.int32, bitcast=True)
    tied = b == v
    rank = ties_before + tl.cumsum(tied.to(tl.int32), axis=0)
    return (b > v) | (tied & (rank <= ties)), tl.sum(tied.to(tl.int32), axis=0)


@triton.jit
def _top_k_top_p_kernel(X, Out, Temp, TopK, TopP, stride_x, stride_o, n,
                        STEPS: tl.constexpr, END: tl.constexpr, ONE: tl.constexpr,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    P = Out + row * stride_o
    temperature = tl.load(Temp + row)
    k = tl.minimum(tl.maximum(tl.load(TopK + row), 1), n).to(tl.int32)
    top_p = tl.load(TopP + row)

    top = tl.full([], float("-inf"), tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + cols, mask=cols < n, other=float("-inf")).to(tl.float32) / temperature
        top = tl.maximum(top, tl.max(x, axis=0))
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + cols, mask=cols < n, other=0.0).to(tl.float32) / temperature
        tl.store(P + cols, tl.exp(x - top), mask=cols < n)
    tl.debug_barrier()  # later sweeps may read what another thread of this program wrote

    # top-k: the largest t with count(p >= t) >= k
    lo = tl.zeros([], dtype=tl.int32)
    hi = tl.full([], END, tl.int32)
    for _ in range(0, tl.where(k < n, STEPS, 0)):
        mid = lo + (hi - lo + 1) // 2
        count, _mass = _at_least(P, n, mid, BLOCK)
        lo = tl.where(count >= k, mid, lo)
        hi = tl.where(count >= k, hi, mid)
    vk = lo
    count_gt, mass_gt = _at_least(P, n, vk + 1, BLOCK)
    ties_k = k - count_gt
    target = top_p * (mass_gt + ties_k.to(tl.float32) * vk.to(tl.float32, bitcast=True))

    # top-p: the largest t >= vk with mass(p >= t) >= target
    hi = tl.full([], END, tl.int32)
    for _ in range(0, tl.where(top_p < 1.0, STEPS, 0)):
        mid = lo + (hi - lo + 1) // 2
        _count, mass = _at_least(P, n, mid, BLOCK)
        lo = tl.where(mass >= target, mid, lo)
        hi = tl.where(mass >= target, hi, mid)
    v = tl.minimum(lo, ONE)
    v_float = v.to(tl.float32, bitcast=True)
    _count, mass_gt = _at_least(P, n, v + 1, BLOCK)
    room = tl.math.ceil((target - mass_gt) / tl.where(v_float > 0, v_float, 1.0))
    room = tl.minimum(room, n.to(tl.float32))
    ties = tl.where((top_p < 1.0) & (v_float > 0), room, n.to(tl.float32)).to(tl.int32)
    ties = tl.where(v == vk, tl.minimum(ties, ties_k), ties)
    ties = tl.maximum(ties, 1)

    total = tl.zeros([], dtype=tl.float32)
    seen = tl.zeros([], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        p = tl.load(P + cols, mask=cols < n, other=0.0)
        keep, tied = _kept(p, seen, v, ties)
        total += tl.sum(tl.where(keep, p, 0.0), axis=0)
        seen += tied
    seen = tl.zeros([], dtype=tl.int32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        p = tl.load(P + cols, mask=cols < n, other=0.0)
        keep, tied = _kept(p, seen, v, ties)
        tl.store(P + cols, tl.where(keep, p / total, 0.0), mask=cols < n)
        seen += tied


def top_k_top_p_kernel(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                       top_p: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """`top_k_top_p_probs` in one kernel: same arguments; `logits` and `out` need a contiguous
    last dim."""
    if logits.stride(-1) != 1 or out.stride(-1) != 1:
        raise ValueError(f"top_k_top_p_kernel needs contiguous rows, got logits strides "
                         f"{logits.stride()} and out strides {out.stride()}")
    rows, n = logits.shape
    if rows:
        _top_k_top_p_kernel[(rows,)](
            logits, out, temperature, top_k, top_p, logits.stride(0), out.stride(0), n,
            STEPS=SEARCH_STEPS, END=SEARCH_END, ONE=ONE_BITS,
            BLOCK=min(MAX_BLOCK, triton.next_power_of_2(n)), num_warps=8)
    return out

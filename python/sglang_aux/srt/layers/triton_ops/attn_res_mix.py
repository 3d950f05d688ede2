"""Block AttnRes mixing (Kimi-K3-style): per token, a softmax over S source rows of their
scores `<RMSNorm(v), q>`, and the weighted sum of the sources, in one pass.

One program per token; the sources are read once each, with an online softmax (running max,
sum and weighted accumulator), so nothing `[S, T, H]` is ever materialized. Sources are
separate tensors (the model keeps block summaries apart), passed as up to MAX_SOURCES
pointer arguments and unrolled at compile time.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_SOURCES = 8


@triton.jit
def _score(src, row, cols, mask, gq, n, eps):
    v = tl.load(src + row * n + cols, mask=mask, other=0.0).to(tl.float32)
    return v, tl.sum(v * gq, axis=0) * tl.rsqrt(tl.sum(v * v, axis=0) / n + eps)


@triton.jit
def _accumulate(src, row, cols, mask, gq, n, eps, m, denom, acc):
    v, s = _score(src, row, cols, mask, gq, n, eps)
    m_new = tl.maximum(m, s)
    alpha, p = tl.exp(m - m_new), tl.exp(s - m_new)
    return m_new, denom * alpha + p, acc * alpha + p * v


@triton.jit
def _attn_res_mix_kernel(S0, S1, S2, S3, S4, S5, S6, S7, W, Query, Out, n, eps,
                         NUM_SOURCES: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    gq = w * tl.load(Query + cols, mask=mask, other=0.0).to(tl.float32)
    acc, m = _score(S0, row, cols, mask, gq, n, eps)
    denom = m * 0.0 + 1.0
    if NUM_SOURCES > 1:
        m, denom, acc = _accumulate(S1, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 2:
        m, denom, acc = _accumulate(S2, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 3:
        m, denom, acc = _accumulate(S3, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 4:
        m, denom, acc = _accumulate(S4, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 5:
        m, denom, acc = _accumulate(S5, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 6:
        m, denom, acc = _accumulate(S6, row, cols, mask, gq, n, eps, m, denom, acc)
    if NUM_SOURCES > 7:
        m, denom, acc = _accumulate(S7, row, cols, mask, gq, n, eps, m, denom, acc)
    tl.store(Out + row * n + cols, (acc / denom).to(Out.dtype.element_ty), mask=mask)


def attn_res_mix(sources: list[torch.Tensor], query: torch.Tensor, norm_weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """sources: 1..MAX_SOURCES contiguous `[T, H]` of one dtype; the pseudo-query and the
    score norm's weight `[H]` -> a new `[T, H]` mixture in the sources' dtype."""
    if not 1 <= len(sources) <= MAX_SOURCES:
        raise ValueError(f"attn_res_mix takes 1..{MAX_SOURCES} sources, got {len(sources)}")
    first = sources[0]
    for s in sources:
        if s.shape != first.shape or s.dtype != first.dtype or not s.is_contiguous():
            raise ValueError(f"sources must be contiguous, all {tuple(first.shape)} "
                             f"{first.dtype}; got {tuple(s.shape)} {s.dtype}")
    rows, n = first.shape
    out = torch.empty_like(first)
    if rows:
        ptrs = [*sources, *[first] * (MAX_SOURCES - len(sources))]
        _attn_res_mix_kernel[(rows,)](*ptrs, norm_weight, query, out, n, eps,
                                      NUM_SOURCES=len(sources), BLOCK=triton.next_power_of_2(n),
                                      num_warps=4 if n <= 2048 else 16)
    return out

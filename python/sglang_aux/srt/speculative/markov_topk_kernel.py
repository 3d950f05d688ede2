"""DSpark's greedy Markov loop over each proposal's top-K base logits only (a candidate: off
unless `SGLANG_AUX_MARKOV_TOPK` names a K; docs/kernels.md, "DSpark's Markov loop").

The exact loop (`markov_argmax_kernel.py`) reads all of `markov_w2` `[V, r]` for every
proposal: 15 reads of 77.8 MB a Qwen2.5 step, 14-22% of the step. Here each proposal's token
is chosen among the K tokens with the largest base logits: one `topk` over the block's base
logits, then one launch, a program per request, walks the n proposals in order and reads only
its candidates' K rows of `markov_w2` for each (K * r * 2 bytes: 32 KB at K = 64, r = 256).

The choice is the exact loop's wherever the winner is among the top K: the bias of each
candidate is summed in fp32, rounded to the weights' dtype and added to the base logit in its
dtype as the torch Linear and the exact kernel do (the fp32 sum's order differs, so a near tie
may fall otherwise in bf16), and ties go to the smallest token id. A token outside the top K
that the Markov bias would lift above them is not proposed: proposals may then differ from
exact DSpark's, never the output (the target verifies every proposal).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.speculative.markov_argmax_kernel import check_tokens_out

MAX_RANK_BLOCK = 64  # rank columns a step of the bias sum loads at once, at most
# Batches this kernel takes when switched on; larger ones keep the exact kernel, whose 32-row
# tile was as fast past 16 requests (H100, draft block: Qwen2.5 at 32 1.222 ms exact against
# 1.192 with K = 64; SmolLM2 0.298 against 0.357), the `topk` over all base logits costing
# most of this path there (docs/benchmarks.md section 9k).
MAX_REQUESTS = 16
BIG = tl.constexpr(2**62)  # an id no token has


@triton.jit
def _markov_topk_kernel(VALS, IDS, stride_b, stride_k, W1, W2, ANCHOR, TOKENS, stride_tb, n,
                        RANK: tl.constexpr, R_BLOCK: tl.constexpr, K: tl.constexpr):
    b = tl.program_id(0)
    prev = tl.load(ANCHOR + b).to(tl.int64)
    c = tl.arange(0, K)
    rs = tl.arange(0, R_BLOCK)
    for k in range(n):
        at = b.to(tl.int64) * stride_b + k * stride_k + c
        ids = tl.load(IDS + at).to(tl.int64)
        base = tl.load(VALS + at)
        acc = tl.zeros((K,), dtype=tl.float32)
        for r0 in tl.static_range(0, RANK, R_BLOCK):
            e = tl.load(W1 + prev * RANK + r0 + rs).to(tl.float32)
            w = tl.load(W2 + ids[:, None] * RANK + r0 + rs[None, :]).to(tl.float32)
            acc += tl.sum(w * e[None, :], axis=1)
        bias = acc.to(W2.dtype.element_ty).to(VALS.dtype.element_ty)
        logits = (base + bias).to(tl.float32)
        top = tl.max(logits, axis=0)
        prev = tl.min(tl.where(logits == top, ids, BIG), axis=0)
        tl.store(TOKENS + b * stride_tb + k, prev)


def supports(rank: int, vocab: int, k: int) -> bool:
    """Whether a head of this rank and vocabulary takes K candidates: a power of two no larger
    than the vocabulary, and a rank that is a multiple of 16."""
    return k >= 1 and k & (k - 1) == 0 and k <= vocab and rank >= 16 and rank % 16 == 0


def markov_topk_tokens(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                       markov_w1: torch.Tensor, markov_w2: torch.Tensor,
                       tokens_out: torch.Tensor, k: int) -> None:
    """Greedy proposals into tokens_out `[bs, n]` int64 as `markov_greedy_tokens` makes them,
    each chosen among its row's k largest base logits (module docstring). base_logits
    `[bs, n, V]`; anchor_tokens `[bs]`; markov_w1 / markov_w2 `[V, r]`, contiguous, one
    dtype."""
    bs, n, vocab = base_logits.shape
    rank = markov_w1.shape[1]
    if tuple(anchor_tokens.shape) != (bs,) or markov_w1.shape != markov_w2.shape or \
            markov_w1.shape[0] != vocab or markov_w1.dtype != markov_w2.dtype or \
            not (markov_w1.is_contiguous() and markov_w2.is_contiguous()):
        raise ValueError(f"base_logits {tuple(base_logits.shape)}, anchor_tokens "
                         f"{tuple(anchor_tokens.shape)}, markov_w1 {markov_w1.dtype} "
                         f"{tuple(markov_w1.shape)} and markov_w2 {markov_w2.dtype} "
                         f"{tuple(markov_w2.shape)}: the weights must both be contiguous "
                         f"[{vocab}, r] of one dtype, one anchor per request")
    if not supports(rank, vocab, k):
        raise ValueError(f"{k} candidates over a vocabulary of {vocab} at rank {rank}: k must "
                         f"be a power of two <= the vocabulary, the rank a multiple of 16")
    check_tokens_out(tokens_out, bs, n)
    if bs == 0:
        return
    vals, ids = base_logits.topk(k, dim=-1)  # [bs, n, k] each, contiguous
    _markov_topk_kernel[(bs,)](vals, ids, vals.stride(0), vals.stride(1), markov_w1, markov_w2,
                               anchor_tokens, tokens_out, tokens_out.stride(0), n, RANK=rank,
                               R_BLOCK=min(MAX_RANK_BLOCK, rank & -rank), K=k, num_warps=4)

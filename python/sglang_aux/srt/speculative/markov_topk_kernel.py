"""DSpark's greedy Markov loop that reads `markov_w2` only for each proposal's top-K base
logits where that is provably enough (a candidate: off unless `SGLANG_AUX_MARKOV_TOPK` names a
K; docs/kernels.md, "DSpark's Markov loop").

The exact loop (`markov_argmax_kernel.py`) reads all of `markov_w2` `[V, r]` for every
proposal: 15 reads of 77.8 MB a Qwen2.5 step, 14-22% of the step. Here one `topk` over the
block's base logits gives each proposal K candidates; one launch, a program per request, walks
the n proposals in order, scores only its candidates' K rows of `markov_w2` (32 KB at K = 64,
r = 256; the bias summed in fp32, rounded to the weights' dtype and added to the base logit in
its dtype as the torch Linear and the exact kernel do; ties to the smallest id) and certifies
the winner: every token outside the candidates has a base logit at most the smallest
candidate's, and a bias at most the head's bound after this previous token
(`models.dspark.markov_bias_bounds`: `|w1[p]|_2` times markov_w2's largest row norm, or the
sum over rank columns of `|w1[p, c]|` times the column's largest magnitude, the smaller), so a
winner above that sum plus its rounding margin is the exact loop's token. Then the exact
kernel's n + 1 launches run with the candidates' tokens and certificates: a request is swept
over the whole vocabulary from its first uncertified proposal on (after a swept token that
differs from the candidates', every later one), and a row block with nothing to sweep exits
without reading `markov_w2`. So the tokens are the exact kernel's, whatever the weights; how
much is saved depends on how often the bound holds, which only a trained head can show.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.speculative.markov_argmax_kernel import (
    check_inputs,
    markov_greedy_tokens,
)

MAX_RANK_BLOCK = 64  # rank columns a step of the bias sum loads at once, at most
# Batches this kernel takes when switched on; larger ones keep the exact kernel, whose 32-row
# tile was as fast past 16 requests (H100, draft block: Qwen2.5 at 32 1.222 ms exact against
# 1.192 with K = 64; SmolLM2 0.298 against 0.357), the `topk` over all base logits costing
# most of this path there (docs/benchmarks.md section 9k).
MAX_REQUESTS = 16
BIG = tl.constexpr(2**62)  # an id no token has
MARGIN = tl.constexpr(2**-6)  # relative slack of a certificate (docs in the kernel)


@triton.jit
def _markov_topk_kernel(VALS, IDS, stride_b, stride_k, W1, W2, ANCHOR, TOKENS, CERT, stride_tb,
                        NORM_MAX, COL_MAX, n, RANK: tl.constexpr, R_BLOCK: tl.constexpr,
                        K: tl.constexpr):
    b = tl.program_id(0)
    prev = tl.load(ANCHOR + b).to(tl.int64)
    c = tl.arange(0, K)
    rs = tl.arange(0, R_BLOCK)
    norm_max = tl.load(NORM_MAX)
    for k in range(n):
        at = b.to(tl.int64) * stride_b + k * stride_k + c
        ids = tl.load(IDS + at).to(tl.int64)
        base = tl.load(VALS + at)
        acc = tl.zeros((K,), dtype=tl.float32)
        sq = tl.zeros((R_BLOCK,), dtype=tl.float32)
        held = tl.zeros((R_BLOCK,), dtype=tl.float32)
        for r0 in tl.static_range(0, RANK, R_BLOCK):
            e = tl.load(W1 + prev * RANK + r0 + rs).to(tl.float32)
            w = tl.load(W2 + ids[:, None] * RANK + r0 + rs[None, :]).to(tl.float32)
            acc += tl.sum(w * e[None, :], axis=1)
            sq += e * e
            held += tl.abs(e) * tl.load(COL_MAX + r0 + rs)
        bias = acc.to(W2.dtype.element_ty).to(VALS.dtype.element_ty)
        logits = (base + bias).to(tl.float32)
        top = tl.max(logits, axis=0)
        # every other token: base <= the smallest candidate's, bias <= the bound; the margins
        # cover the bias's fp32 sum and its two roundings (bf16: 2**-8 each) and this sum's
        bound = tl.minimum(tl.sqrt(tl.sum(sq, axis=0)) * norm_max, tl.sum(held, axis=0))
        x = tl.min(base.to(tl.float32), axis=0) + bound * (1 + MARGIN)
        tl.store(CERT + b * stride_tb + k, (top > x + tl.abs(x) * MARGIN).to(tl.int32))
        prev = tl.min(tl.where(logits == top, ids, BIG), axis=0)
        tl.store(TOKENS + b * stride_tb + k, prev)


def supports(rank: int, vocab: int, k: int) -> bool:
    """Whether a head of this rank and vocabulary takes K candidates: a power of two no larger
    than the vocabulary, and a rank that is a multiple of 16."""
    return k >= 1 and k & (k - 1) == 0 and k <= vocab and rank >= 16 and rank % 16 == 0


def markov_topk_tokens(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                       markov_w1: torch.Tensor, markov_w2: torch.Tensor,
                       tokens_out: torch.Tensor, k: int,
                       bounds: tuple[torch.Tensor, torch.Tensor]) -> None:
    """Greedy proposals into tokens_out `[bs, n]` int64, the exact kernel's
    (`markov_greedy_tokens`), reading markov_w2 only for each row's k largest base logits where
    they are certified to hold the winner (module docstring). base_logits `[bs, n, V]`;
    anchor_tokens `[bs]`; markov_w1 / markov_w2 `[V, r]`, contiguous, one dtype; bounds:
    `markov_bias_bounds(markov_w2)`, taken outside any graph capture."""
    bs, n, vocab = base_logits.shape
    rank = markov_w1.shape[1]
    norm_max, col_max = bounds
    check_inputs(base_logits, anchor_tokens, markov_w1, markov_w2, tokens_out)
    if not supports(rank, vocab, k):
        raise ValueError(f"{k} candidates over a vocabulary of {vocab} at rank {rank}: k must "
                         f"be a power of two <= the vocabulary, the rank a multiple of 16")
    if norm_max.shape != () or tuple(col_max.shape) != (rank,) or \
            norm_max.dtype != torch.float32 or col_max.dtype != torch.float32:
        raise ValueError(f"bounds must be fp32 () and ({rank},) (markov_bias_bounds), got "
                         f"{norm_max.dtype} {tuple(norm_max.shape)} and {col_max.dtype} "
                         f"{tuple(col_max.shape)}")
    if bs == 0:
        return
    certified = certified_candidates(base_logits, anchor_tokens, markov_w1, markov_w2, k,
                                     bounds, like=tokens_out)
    markov_greedy_tokens(base_logits, anchor_tokens, markov_w1, markov_w2, tokens_out,
                         certified=certified)


def certified_candidates(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                         markov_w1: torch.Tensor, markov_w2: torch.Tensor, k: int,
                         bounds: tuple[torch.Tensor, torch.Tensor],
                         like: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-K launch alone (inputs checked by `markov_topk_tokens`): each proposal's best
    candidate given the candidates before it, int64 `[bs, n]`, and whether it is certified the
    exact loop's (int32 1 / 0), strided as `like` (default: contiguous)."""
    bs, n, _ = base_logits.shape
    shape, stride = ((bs, n), (n, 1)) if like is None else (like.shape, like.stride())
    cand = torch.empty_strided(shape, stride, dtype=torch.int64, device=base_logits.device)
    cert = torch.empty_strided(shape, stride, dtype=torch.int32, device=base_logits.device)
    vals, ids = base_logits.topk(k, dim=-1)  # [bs, n, k] each, contiguous
    rank = markov_w1.shape[1]
    _markov_topk_kernel[(bs,)](vals, ids, vals.stride(0), vals.stride(1), markov_w1, markov_w2,
                               anchor_tokens, cand, cert, cand.stride(0), *bounds, n,
                               RANK=rank, R_BLOCK=min(MAX_RANK_BLOCK, rank & -rank), K=k,
                               num_warps=4)
    return cand, cert

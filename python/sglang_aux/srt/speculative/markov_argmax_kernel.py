"""DSpark's greedy Markov loop (`dspark_proposal.propose_block`) in n + 1 launches instead of
about five small kernels per proposal.

Launch k (k < n) runs a `[request blocks, vocabulary chunks]` grid. Each program first settles
its requests' previous token: the anchor at k = 0, else the argmax of launch k - 1, reduced
from that launch's per-chunk partials (chunk 0's program writes it to the tokens). It then
computes its chunk of the Markov bias `markov_w1[prev] @ markov_w2[chunk].T` with one `tl.dot`
per rank block (fp32 accumulation, rounded to the weights' dtype as the torch Linear rounds
its output), adds the block row's base logits in their dtype, and leaves the chunk's max and
its first index as partials. Launch n only reduces and writes the last token. A program reads
its chunk of `markov_w2` once for all its requests (the torch loop's GEMM does the same), so
the bytes are the loop's; what goes is the launches and the `[bs, V]` round trips between them.

Ties go to the smallest index, as `torch.argmax` returns them; partials alternate between two
buffers, so no launch writes what it reads. The scratch is allocated per call (inside a
graph: once, in its pool, at capture).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops.tiling import dot_precision

ROWS = 16  # requests per program: tl.dot's smallest tile
CHUNK = 128  # vocabulary rows per program
MAX_RANK_BLOCK = 64


@triton.jit
def _markov_argmax_kernel(BASE, stride_bb, stride_bk, W1, W2, ANCHOR, TOKENS, stride_tb,
                          PMAX, PIDX, bs, vocab, num_chunks, k,
                          RANK: tl.constexpr, R_BLOCK: tl.constexpr, FIRST: tl.constexpr,
                          SWEEP: tl.constexpr, DOT_PRECISION: tl.constexpr, ROWS: tl.constexpr,
                          CHUNK: tl.constexpr, NC_BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    chunk = tl.program_id(1)
    rmask = rows < bs
    big = 2147483647
    if FIRST:
        prev = tl.load(ANCHOR + rows, mask=rmask, other=0).to(tl.int64)
    else:
        src = ((k - 1) % 2) * bs * num_chunks
        cs = tl.arange(0, NC_BLOCK)
        offs = src + rows[:, None] * num_chunks + cs[None, :]
        pmask = rmask[:, None] & (cs[None, :] < num_chunks)
        pm = tl.load(PMAX + offs, mask=pmask, other=-float("inf"))
        pi = tl.load(PIDX + offs, mask=pmask, other=big)
        best = tl.max(pm, axis=1)
        prev = tl.min(tl.where(pm == best[:, None], pi, big), axis=1).to(tl.int64)
        if chunk == 0:
            tl.store(TOKENS + rows * stride_tb + (k - 1), prev, mask=rmask)
    if SWEEP:
        cols = chunk * CHUNK + tl.arange(0, CHUNK)
        cmask = cols < vocab
        rs = tl.arange(0, R_BLOCK)
        acc = tl.zeros((ROWS, CHUNK), dtype=tl.float32)
        for r0 in tl.static_range(0, RANK, R_BLOCK):
            e = tl.load(W1 + prev[:, None] * RANK + r0 + rs[None, :], mask=rmask[:, None],
                        other=0.0)
            w = tl.load(W2 + cols[:, None].to(tl.int64) * RANK + r0 + rs[None, :],
                        mask=cmask[:, None], other=0.0)
            acc += tl.dot(e, tl.trans(w), input_precision=DOT_PRECISION)
        bias = acc.to(W2.dtype.element_ty).to(BASE.dtype.element_ty)
        base = tl.load(BASE + rows[:, None].to(tl.int64) * stride_bb + k * stride_bk
                       + cols[None, :], mask=rmask[:, None] & cmask[None, :])
        logits = (base + bias).to(tl.float32)
        logits = tl.where(cmask[None, :], logits, -float("inf"))
        top = tl.max(logits, axis=1)
        idx = tl.min(tl.where(logits == top[:, None], cols[None, :], big), axis=1)
        dst = (k % 2) * bs * num_chunks + rows * num_chunks + chunk
        tl.store(PMAX + dst, top, mask=rmask)
        tl.store(PIDX + dst, idx, mask=rmask)


def supports(rank: int) -> bool:
    """Whether the kernel takes a Markov head of this rank (tl.dot's tiles: a multiple of 16)."""
    return rank >= 16 and rank % 16 == 0


def markov_greedy_tokens(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                         markov_w1: torch.Tensor, markov_w2: torch.Tensor,
                         tokens_out: torch.Tensor) -> None:
    """Greedy proposals into tokens_out `[bs, n]` int64: row k's token is the argmax of
    base_logits `[bs, n, V]` (last dim contiguous) row k plus the Markov bias of the token
    before it (`anchor_tokens` `[bs]` for row 0). markov_w1 / markov_w2: `[V, r]`, contiguous,
    one dtype."""
    bs, n, vocab = base_logits.shape
    rank = markov_w1.shape[1]
    if base_logits.stride(-1) != 1 or tuple(anchor_tokens.shape) != (bs,):
        raise ValueError(f"base_logits {tuple(base_logits.shape)} (strides "
                         f"{base_logits.stride()}) needs a contiguous last dim and "
                         f"anchor_tokens {tuple(anchor_tokens.shape)} one token per request")
    if markov_w1.shape != markov_w2.shape or markov_w1.shape[0] != vocab or \
            not (markov_w1.is_contiguous() and markov_w2.is_contiguous()) or not supports(rank):
        raise ValueError(f"markov_w1 {tuple(markov_w1.shape)} and markov_w2 "
                         f"{tuple(markov_w2.shape)} must both be contiguous [{vocab}, r] with r "
                         "a multiple of 16")
    if tuple(tokens_out.shape) != (bs, n) or tokens_out.dtype != torch.int64 or \
            tokens_out.stride(-1) != 1:
        raise ValueError(f"tokens_out must be int64 {(bs, n)} with a contiguous last dim, got "
                         f"{tokens_out.dtype} {tuple(tokens_out.shape)}")
    if bs == 0:
        return
    num_chunks = triton.cdiv(vocab, CHUNK)
    pmax = torch.empty((2, bs, num_chunks), dtype=torch.float32, device=base_logits.device)
    pidx = torch.empty((2, bs, num_chunks), dtype=torch.int32, device=base_logits.device)
    r_block = min(MAX_RANK_BLOCK, rank & -rank)  # a power of two that divides the rank
    row_blocks = triton.cdiv(bs, ROWS)
    for k in range(n + 1):
        sweep = k < n
        _markov_argmax_kernel[(row_blocks, num_chunks if sweep else 1)](
            base_logits, base_logits.stride(0), base_logits.stride(1), markov_w1, markov_w2,
            anchor_tokens, tokens_out, tokens_out.stride(0), pmax, pidx, bs, vocab,
            num_chunks, k, RANK=rank, R_BLOCK=r_block, FIRST=k == 0, SWEEP=sweep,
            DOT_PRECISION=dot_precision(markov_w2.dtype), ROWS=ROWS, CHUNK=CHUNK,
            NC_BLOCK=triton.next_power_of_2(num_chunks), num_warps=4)

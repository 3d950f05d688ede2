"""DSpark's greedy Markov loop (`dspark_proposal.propose_block`) in n + 1 launches instead of
about five small kernels per proposal.

Launch k (k < n) runs a `[request blocks, vocabulary chunks]` grid, at most MAX_CHUNKS chunks a
row; a block is 16 requests, or 32 in a loop Triton pipelines past 16 (`markov_tile`). Each
program first settles its requests' previous token: the anchor at k = 0, else the argmax of
launch k - 1, reduced PARTIALS_BLOCK at a time from that launch's per-chunk partials (chunk 0's
program writes it to the tokens). Then, one SUB-row tile of its chunk at a time, it computes the
Markov bias `markov_w1[prev] @ markov_w2[tile].T` with one `tl.dot` per rank block (fp32
accumulation, rounded to the weights' dtype as the torch Linear rounds its output), adds the
block row's base logits in their dtype, and keeps a running max and its first index, which it
leaves as the chunk's partials. Launch n only reduces and writes the last token. A program reads
its chunk of `markov_w2` once for all its requests (the torch loop's GEMM does the same), so the
bytes are the loop's; what goes is the launches and the `[bs, V]` round trips between them.

Ties go to the smallest index, as `torch.argmax` returns them; partials alternate between two
buffers, so no launch writes what it reads. (The first version cut Qwen2.5's vocabulary into
1,187 chunks of 128 and held all of a row's partials in one register tile: on an H100 its
launches took 146-489 us against the torch loop's 43-70 us a proposal.) The scratch is allocated
per call (inside a graph: once, in its pool, at capture).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops.tiling import dot_precision

# Requests per program: tl.dot's smallest tile; twice that for larger batches, whose row blocks
# would each read all of `markov_w2` (Qwen2.5's 77.8 MB: past the L2) a proposal.
ROWS = 16
MAX_ROWS = 32
SUB = 128  # vocabulary rows per dot tile; a program's chunk is a few of them
MAX_CHUNKS = 256  # chunks a row's vocabulary is cut into, at most: programs per request block
MAX_RANK_BLOCK = 64
PARTIALS_BLOCK = 64  # partials a program reduces at a time
BIG = tl.constexpr(2**31 - 1)  # the index no token has (constexpr: kernels read no other globals)


@triton.jit
def _first_max(vals, idxs, best, best_idx):
    """The running (max, its first index) per row after one more block `[ROWS, N]` whose
    indices all exceed those seen before: a tie keeps the earlier index."""
    top = tl.max(vals, axis=1)
    at = tl.min(tl.where(vals == top[:, None], idxs, BIG), axis=1)
    take = top > best
    return tl.where(take, top, best), tl.where(take, at, best_idx)


@triton.jit
def _markov_argmax_kernel(BASE, stride_bb, stride_bk, W1, W2, ANCHOR, TOKENS, stride_tb,
                          PMAX, PIDX, CAND, CERT, DIV, IDS, bs, vocab, num_chunks, k,
                          RANK: tl.constexpr, R_BLOCK: tl.constexpr, FIRST: tl.constexpr,
                          SWEEP: tl.constexpr, DOT_PRECISION: tl.constexpr, ROWS: tl.constexpr,
                          SUB: tl.constexpr, NSUB: tl.constexpr, P_BLOCK: tl.constexpr,
                          PIPELINED: tl.constexpr, CERTIFIED: tl.constexpr,
                          MAPPED: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    chunk = tl.program_id(1)
    rmask = rows < bs
    # CERTIFIED (`markov_topk_kernel`): CAND `[bs, n]` holds the top-K path's tokens, CERT
    # whether each is certified exact given the token before it; a row is swept from its first
    # uncertified proposal on, or once a swept token differed from CAND (DIV: 1 from then,
    # alternating between two buffers like the partials). Others take CAND unswept.
    div = tl.zeros((ROWS,), tl.int32)
    if FIRST:
        prev = tl.load(ANCHOR + rows, mask=rmask, other=0).to(tl.int64)
    else:
        swept = rmask
        if CERTIFIED:
            div = tl.load(DIV + ((k - 1) % 2) * bs + rows, mask=rmask, other=0)
            cand = tl.load(CAND + rows * stride_tb + (k - 1), mask=rmask, other=0)
            swept = rmask & ((tl.load(CERT + rows * stride_tb + (k - 1), mask=rmask, other=1)
                              == 0) | (div != 0))
        at = tl.full((ROWS,), BIG, tl.int32)
        settle = True
        if CERTIFIED:
            settle = tl.max(swept.to(tl.int32), axis=0) > 0
        if settle:
            src = ((k - 1) % 2) * bs * num_chunks
            best = tl.full((ROWS,), -float("inf"), tl.float32)
            for c0 in range(0, num_chunks, P_BLOCK):
                cs = c0 + tl.arange(0, P_BLOCK)
                offs = src + rows[:, None] * num_chunks + cs[None, :]
                pmask = swept[:, None] & (cs[None, :] < num_chunks)
                pm = tl.load(PMAX + offs, mask=pmask, other=-float("inf"))
                pi = tl.load(PIDX + offs, mask=pmask, other=BIG)
                best, at = _first_max(pm, pi, best, at)
        prev = tl.where(swept, at, 0).to(tl.int64)
        if MAPPED:  # a draft vocabulary: column `at` is token IDS[at], which indexes W1
            prev = tl.load(IDS + prev, mask=rmask, other=0)
        if CERTIFIED:
            prev = tl.where(swept, prev, cand)
            div = tl.where(swept & (prev != cand), 1, div)
        if chunk == 0:
            tl.store(TOKENS + rows * stride_tb + (k - 1), prev, mask=rmask)
    if CERTIFIED and chunk == 0:
        tl.store(DIV + (k % 2) * bs + rows, div, mask=rmask)
    if SWEEP:
        go = True
        if CERTIFIED:
            go = tl.max((rmask & ((tl.load(CERT + rows * stride_tb + k, mask=rmask, other=1) == 0)
                                  | (div != 0))).to(tl.int32), axis=0) > 0
        if go:
            best = tl.full((ROWS,), -float("inf"), tl.float32)
            at = tl.full((ROWS,), BIG, tl.int32)
            if PIPELINED:  # a loop Triton pipelines: fewer registers, the tiles in shared memory
                for s in range(NSUB):
                    best, at = _sweep_tile(BASE, stride_bb, stride_bk, W1, W2, rows, rmask, prev,
                                           (chunk * NSUB + s) * SUB, vocab, k, best, at, RANK,
                                           R_BLOCK, DOT_PRECISION, ROWS, SUB)
            else:
                for s in tl.static_range(NSUB):
                    best, at = _sweep_tile(BASE, stride_bb, stride_bk, W1, W2, rows, rmask, prev,
                                           (chunk * NSUB + s) * SUB, vocab, k, best, at, RANK,
                                           R_BLOCK, DOT_PRECISION, ROWS, SUB)
            dst = (k % 2) * bs * num_chunks + rows * num_chunks + chunk
            tl.store(PMAX + dst, best, mask=rmask)
            tl.store(PIDX + dst, at, mask=rmask)


@triton.jit
def _sweep_tile(BASE, stride_bb, stride_bk, W1, W2, rows, rmask, prev, col0, vocab, k, best, at,
                RANK: tl.constexpr, R_BLOCK: tl.constexpr, DOT_PRECISION: tl.constexpr,
                ROWS: tl.constexpr, SUB: tl.constexpr):
    """(best, at) after the SUB vocabulary rows from col0: the bias of each request's previous
    token over them, plus their base logits."""
    rs = tl.arange(0, R_BLOCK)
    cols = col0 + tl.arange(0, SUB)
    cmask = cols < vocab
    acc = tl.zeros((ROWS, SUB), dtype=tl.float32)
    for r0 in tl.static_range(0, RANK, R_BLOCK):
        e = tl.load(W1 + prev[:, None] * RANK + r0 + rs[None, :], mask=rmask[:, None], other=0.0)
        w = tl.load(W2 + cols[:, None].to(tl.int64) * RANK + r0 + rs[None, :],
                    mask=cmask[:, None], other=0.0)
        acc += tl.dot(e, tl.trans(w), input_precision=DOT_PRECISION)
    bias = acc.to(W2.dtype.element_ty).to(BASE.dtype.element_ty)
    base = tl.load(BASE + rows[:, None].to(tl.int64) * stride_bb + k * stride_bk + cols[None, :],
                   mask=rmask[:, None] & cmask[None, :])
    logits = tl.where(cmask[None, :], (base + bias).to(tl.float32), -float("inf"))
    return _first_max(logits, cols[None, :], best, at)


@dataclass(frozen=True)
class MarkovTile:
    """How the sweeping launches are cut: requests a program takes (ROWS or MAX_ROWS), its
    warps, whether the vocabulary loop is one Triton pipelines (`PIPELINED`) and how deep."""

    rows: int = ROWS
    num_warps: int = 4
    pipelined: bool = False
    num_stages: int = 3  # the pipelined loop's depth (Triton's default)
    # ptxas's register cap (None: its own choice, which gave the 32-row pipelined tile 64
    # registers and a spill; 128 gives it ~100 and none, offline for sm_90)
    max_registers: int | None = None

    def __post_init__(self):
        if self.rows not in (ROWS, MAX_ROWS) or self.num_warps not in (4, 8) \
                or not 1 <= self.num_stages <= 4 or self.max_registers not in (None, 128, 255):
            raise ValueError(f"a Markov tile takes {ROWS} or {MAX_ROWS} rows on 4 or 8 warps, "
                             f"1 to 4 stages and a register cap of None, 128 or 255, got {self}")


WIDE_TILE = MarkovTile(MAX_ROWS, 8, pipelined=True, max_registers=128)


def markov_tile(bs: int, dtype: torch.dtype = torch.bfloat16) -> MarkovTile:
    """The tile a batch of `bs` requests runs with weights of `dtype`, as measured on the H100
    (`bench_markov_argmax.py`, docs/kernels.md): ROWS a program up to ROWS requests; past that,
    for 2-byte weights, MAX_ROWS a program in a pipelined loop capped at 128 registers, which
    reads `markov_w2` once for 32 requests (1.22-1.39x the 16-row tile at 17, 32 and 64
    requests on both recipes' shapes). fp32 weights keep the ROWS tile: their pipelined stages
    need 311 KB of shared memory (an SM has 227 KiB; the H100 refused the launch)."""
    return WIDE_TILE if bs > ROWS and dtype.itemsize == 2 else MarkovTile()


def chunk_rows(vocab: int) -> int:
    """Vocabulary rows a program sweeps: whole dot tiles, so that a row has at most
    MAX_CHUNKS chunks (SmolLM2's 49,152: 256; Qwen2.5's 151,936: 640)."""
    return triton.cdiv(triton.cdiv(vocab, MAX_CHUNKS), SUB) * SUB


def supports(rank: int) -> bool:
    """Whether the kernel takes a Markov head of this rank (tl.dot's tiles: a multiple of 16)."""
    return rank >= 16 and rank % 16 == 0


def check_inputs(base_logits: torch.Tensor, anchor_tokens: torch.Tensor, markov_w1: torch.Tensor,
                 markov_w2: torch.Tensor, tokens_out: torch.Tensor,
                 token_ids: torch.Tensor | None = None) -> None:
    """A ValueError naming what a Markov kernel's call gets wrong: base_logits `[bs, n, V]` with a
    contiguous last dim, one anchor per request, both weights contiguous `[V, r]` of one dtype
    with r a multiple of 16, tokens_out int64 `[bs, n]` with a contiguous last dim. Over a draft
    vocabulary (`token_ids` `[H]` int64, contiguous) the base logits and markov_w2 have its H
    columns and rows, markov_w1 every token's."""
    bs, n, vocab = base_logits.shape
    if base_logits.stride(-1) != 1 or tuple(anchor_tokens.shape) != (bs,):
        raise ValueError(f"base_logits {tuple(base_logits.shape)} (strides "
                         f"{base_logits.stride()}) needs a contiguous last dim and "
                         f"anchor_tokens {tuple(anchor_tokens.shape)} one token per request")
    if token_ids is not None and (tuple(token_ids.shape) != (vocab,) or
                                  token_ids.dtype != torch.int64 or
                                  not token_ids.is_contiguous()):
        raise ValueError(f"token_ids {token_ids.dtype} {tuple(token_ids.shape)} must be "
                         f"contiguous int64 ({vocab},), one per base_logits column")
    w1_rows = markov_w1.shape[0] if token_ids is not None else vocab
    if markov_w1.shape[1:] != markov_w2.shape[1:] or markov_w2.shape[0] != vocab or \
            markov_w1.shape[0] != w1_rows or markov_w1.dtype != markov_w2.dtype or \
            not supports(markov_w1.shape[1]) or \
            not (markov_w1.is_contiguous() and markov_w2.is_contiguous()):
        raise ValueError(f"markov_w1 {markov_w1.dtype} {tuple(markov_w1.shape)} and markov_w2 "
                         f"{markov_w2.dtype} {tuple(markov_w2.shape)} must both be contiguous "
                         f"[{vocab}, r] of one dtype with r a multiple of 16"
                         + (" (markov_w1: every token's rows, markov_w2: the draft "
                            "vocabulary's)" if token_ids is not None else ""))
    if tuple(tokens_out.shape) != (bs, n) or tokens_out.dtype != torch.int64 or \
            tokens_out.stride(-1) != 1:
        raise ValueError(f"tokens_out must be int64 {(bs, n)} with a contiguous last dim, got "
                         f"{tokens_out.dtype} {tuple(tokens_out.shape)}")


def markov_greedy_tokens(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                         markov_w1: torch.Tensor, markov_w2: torch.Tensor,
                         tokens_out: torch.Tensor, tile: MarkovTile | None = None,
                         certified: tuple[torch.Tensor, torch.Tensor] | None = None,
                         token_ids: torch.Tensor | None = None) -> None:
    """Greedy proposals into tokens_out `[bs, n]` int64: row k's token is the argmax of
    base_logits `[bs, n, V]` (last dim contiguous) row k plus the Markov bias of the token
    before it (`anchor_tokens` `[bs]` for row 0). markov_w1 / markov_w2: `[V, r]`, contiguous,
    one dtype. `tile`: `markov_tile(bs, dtype)` unless a bench compares another. `certified`:
    (candidate tokens, certified flags), both `[bs, n]` with tokens_out's strides, from
    `markov_topk_kernel`: only the rows and proposals they leave open are swept. `token_ids`:
    a draft vocabulary `[H]` (`speculative/token_map.py`): base_logits and markov_w2 are its H
    columns and rows, the argmax column j is token `token_ids[j]` (markov_w1 stays `[V, r]`)."""
    bs, n, vocab = base_logits.shape
    rank = markov_w1.shape[1]
    check_inputs(base_logits, anchor_tokens, markov_w1, markov_w2, tokens_out, token_ids)
    if certified is not None and token_ids is not None:
        raise ValueError("the certified top-K candidates do not take a draft vocabulary")
    if bs == 0:
        return
    chunk = chunk_rows(vocab)
    num_chunks = triton.cdiv(vocab, chunk)
    pmax = torch.empty((2, bs, num_chunks), dtype=torch.float32, device=base_logits.device)
    pidx = torch.empty((2, bs, num_chunks), dtype=torch.int32, device=base_logits.device)
    cand, cert = certified if certified is not None else (tokens_out, tokens_out)
    if any(t.shape != tokens_out.shape or t.stride() != tokens_out.stride() for t in (cand, cert)):
        raise ValueError(f"certified tokens {tuple(cand.shape)} {cand.stride()} and flags "
                         f"{tuple(cert.shape)} {cert.stride()} must be shaped and strided as "
                         f"tokens_out {tuple(tokens_out.shape)} {tokens_out.stride()}")
    div = torch.empty((2, bs), dtype=torch.int32, device=base_logits.device) \
        if certified is not None else pidx
    r_block = min(MAX_RANK_BLOCK, rank & -rank)  # a power of two that divides the rank
    tile = tile or markov_tile(bs, markov_w2.dtype)
    row_blocks = triton.cdiv(bs, tile.rows)
    for k in range(n + 1):
        sweep = k < n
        _markov_argmax_kernel[(row_blocks, num_chunks if sweep else 1)](
            base_logits, base_logits.stride(0), base_logits.stride(1), markov_w1, markov_w2,
            anchor_tokens, tokens_out, tokens_out.stride(0), pmax, pidx, cand, cert, div,
            token_ids if token_ids is not None else anchor_tokens, bs,
            vocab, num_chunks, k, RANK=rank, R_BLOCK=r_block, FIRST=k == 0, SWEEP=sweep,
            DOT_PRECISION=dot_precision(markov_w2.dtype), ROWS=tile.rows, SUB=SUB,
            NSUB=chunk // SUB, P_BLOCK=PARTIALS_BLOCK, PIPELINED=tile.pipelined,
            CERTIFIED=certified is not None, MAPPED=token_ids is not None,
            num_warps=tile.num_warps,
            num_stages=tile.num_stages, maxnreg=tile.max_registers)

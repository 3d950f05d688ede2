"""Attention for the fixed-layout modes: DECODE, TARGET_VERIFY and DRAFT_BLOCK, and for a
ragged verify step.

Every request has the same number `q_len` of queries (1 for DECODE, the block size B for
TARGET_VERIFY and DRAFT_BLOCK), stored request-major: token `b * q_len + i`. A ragged layout
(`RaggedQueries`: compact verify) gives request b only `lens[b] <= q_len` queries, at rows
`q_start[b] + i`, after `prefix_lens[b]` cached keys; same tiles, rows past its queries are
masked, and a tile past them (a request slot of 0 tokens: all of them) stores nothing. A
position p of a request with `seq_len` tokens sees key positions `j < seq_len`, and `j <= p`
too when causal, and `p - j <= sliding_window_size` with a window. Keys and values are
gathered from the paged pool through `req_to_token[req_pool_indices[b], j]`.

One program owns (request, kv head, row tile, key split). Its rows are the `q_len * group`
query heads that share the kv head, so each K/V tile is loaded once for the whole GQA group
and multiplied with tl.dot. The key axis the tile can see (from its window's start, 0 without
one, to `seq_len`) is cut into chunks so a small batch still launches enough programs. Keys
before the window are never loaded, so a windowed layer's cost is bounded by the window.

Two ways to cut and combine (`merge`):
- "launch": `num_kv_splits` equal chunks; every split writes a partial result and
  `merge_attn_states` combines them in a second launch (none when `num_kv_splits` is 1).
- "in_kernel": the grid still has `num_kv_splits` programs per tile, but the kernel cuts the
  keys it finds into chunks of at least `min_split_keys`, so a short context runs in one
  program that writes the output directly and the other programs exit at once. Longer ones
  write partial results, and the last split of a tile to finish (a per-tile counter in
  `SplitCounters`, reset by that split) merges them: one launch either way.

NOTE: CUDA-graph safe. The grid depends only on (bs, heads, q_len, num_kv_splits, the pool's
context bound), the key loop bounds are read from `seq_lens` and `positions` inside the kernel
(the window is a compile-time constant of the layer), and nothing here syncs with the host.
So a graph captured for any context replays correctly at every length up to the maximum.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops import tiling
from sglang_aux.srt.layers.attention.triton_ops.merge_attn_states import merge_attn_states
from sglang_aux.srt.layers.attention.triton_ops.paged_kv_loop import attend_paged_kv
from sglang_aux.srt.layers.attention.triton_ops.tiling import (
    NO_KEYS,
    SinglePassTile,
    pick_num_kv_splits,
)

MergeMode = Literal["launch", "in_kernel"]
MERGE_MODES: tuple[MergeMode, ...] = ("launch", "in_kernel")


class RaggedQueries(Protocol):
    """A ragged layout's requests (`forward_state.RaggedRequests` is one), `[bs]` int tensors
    each: request b's `lens[b] <= width` queries are the rows `q_start[b] + i` of q, after
    `prefix_lens[b]` cached keys (its keys: those and its queries' own)."""

    @property
    def q_start(self) -> torch.Tensor: ...

    @property
    def lens(self) -> torch.Tensor: ...

    @property
    def prefix_lens(self) -> torch.Tensor: ...

    @property
    def width(self) -> int: ...


class SplitCounters:
    """Zeroed int32 arrival counters for the in-kernel merge, one per (request, kv head, row
    tile) of a launch; the split that merges resets its counter, so they stay zero between
    launches. Launches sharing one must not run concurrently (a backend's fixed-layout
    forwards run on the runner's one stream).

    Grows outside graph capture only: the warm-up forwards before each capture size it, and a
    captured graph keeps the buffer it read alive through `_retired`."""

    def __init__(self):
        self._buffer: torch.Tensor | None = None
        self._retired: list[torch.Tensor] = []

    def get(self, n: int, device: torch.device) -> torch.Tensor:
        buf = self._buffer
        if buf is not None and buf.numel() >= n and buf.device == device:
            return buf
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"in-kernel merge needs {n} split counters on {device} but "
                               "none were allocated before capture: run an eager forward "
                               "of this shape first (the graph runner's warm-ups do)")
        if buf is not None:
            self._retired.append(buf)
        self._buffer = torch.zeros(max(n, 2 * (0 if buf is None else buf.numel())),
                                   dtype=torch.int32, device=device)
        return self._buffer


@triton.jit
def _decode_attention_kernel(
    Q, K_Buf, V_Buf, Out, Partial_Out, Partial_Lse, Counters,
    Req_To_Token, Req_Pool_Indices, Seq_Lens, Positions, Q_Start, Q_Lens,
    sm_scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_req,
    Q_LEN: tl.constexpr, GROUP: tl.constexpr, M_TILES: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr, MERGE_IN_KERNEL: tl.constexpr, MIN_SPLIT_KEYS: tl.constexpr,
    RAGGED: tl.constexpr, CAUSAL: tl.constexpr, SLIDING_WINDOW_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // M_TILES
    m_tile = tl.program_id(1) % M_TILES
    split = tl.program_id(2)

    # Row r of the tile is query i = r // GROUP of the request, head kv_head * GROUP + r % GROUP.
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    head = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    if RAGGED:  # Seq_Lens holds each request's keys before its queries
        q_len = tl.load(Q_Lens + b)
        row_valid = rows < q_len * GROUP
        tok = tl.load(Q_Start + b) + rows // GROUP
        seq_len = tl.load(Seq_Lens + b) + q_len
    else:
        row_valid = rows < Q_LEN * GROUP
        tok = b * Q_LEN + rows // GROUP
        seq_len = tl.load(Seq_Lens + b)
    pos = tl.load(Positions + tok, mask=row_valid, other=0)

    kv_lo = tiling.window_start(tl.min(tl.where(row_valid, pos, seq_len), 0), seq_len,
                                SLIDING_WINDOW_SIZE)
    chunk = tl.cdiv(tl.cdiv(seq_len - kv_lo, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    if MERGE_IN_KERNEL:
        # Every split of the tile derives the same count from the same seq_len and window.
        chunk = tl.maximum(chunk, MIN_SPLIT_KEYS)
        num_splits = tl.maximum(tl.cdiv(seq_len - kv_lo, chunk), 1)
        active = split < num_splits
    else:
        num_splits = NUM_KV_SPLITS
        active = True  # a compile-time branch: the launch mode's kernel is unchanged
    if RAGGED:
        # a tile past the request's queries exits: with in-kernel merges its whole tile does,
        # so no split waits on its counter
        active = (m_tile * BLOCK_M < q_len * GROUP) & active
    if active:
        kv_start = kv_lo + split * chunk
        kv_end = tl.minimum(kv_start + chunk, seq_len)
        q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=row_valid[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
        req_row = tl.load(Req_Pool_Indices + b).to(tl.int64)
        acc, l_i, m_i = attend_paged_kv(
            q, pos, row_valid, K_Buf, V_Buf, Req_To_Token, req_row, kv_head, kv_start, kv_end,
            sm_scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
            CAUSAL, SLIDING_WINDOW_SIZE, DOT_PRECISION, HEAD_DIM, BLOCK_M, BLOCK_N)

        # Rows that saw no key (an empty split) give 0 and a NO_KEYS log-sum-exp, never NaN.
        has_keys = l_i > 0.0
        acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
        out_ptrs = Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        if num_splits == 1:
            tl.store(out_ptrs, acc.to(Out.dtype.element_ty), mask=row_valid[:, None])
        else:
            lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), NO_KEYS)
            part_ptrs = Partial_Out + tok[:, None] * stride_pt + head[:, None] * stride_ph
            lse_ptrs = Partial_Lse + tok * stride_lt + head * stride_lh
            tl.store(part_ptrs + split * stride_ps + d[None, :], acc, mask=row_valid[:, None])
            tl.store(lse_ptrs + split, lse, mask=row_valid)
            if MERGE_IN_KERNEL:
                # Every thread's partial stores precede the release; the last split to arrive
                # acquires them all (the CTA barrier, then a gpu-scope acq_rel counter).
                tl.debug_barrier()
                counter = Counters + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
                if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
                    _merge_splits(out_ptrs, part_ptrs, lse_ptrs, row_valid, num_splits,
                                  stride_ps, d, BLOCK_M, HEAD_DIM)
                    tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")


@triton.jit
def _merge_splits(out_ptrs, part_ptrs, lse_ptrs, row_valid, num_splits, stride_ps, d,
                  BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The tile's `num_splits` partial results, weighted by their log-sum-exps, into `out`;
    0 for rows no split saw a key for. Loads bypass L1: other SMs wrote them."""
    m = tl.full([BLOCK_M], NO_KEYS, tl.float32)
    w_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for s in range(num_splits):
        lse = tl.load(lse_ptrs + s, mask=row_valid, other=NO_KEYS, cache_modifier=".cg")
        o = tl.load(part_ptrs + s * stride_ps + d[None, :], mask=row_valid[:, None], other=0.0,
                    cache_modifier=".cg")
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + w[:, None] * o
        w_sum = w_sum * alpha + w
        m = m_new
    merged = tl.where((m > NO_KEYS)[:, None], acc / w_sum[:, None], 0.0)
    tl.store(out_ptrs, merged.to(out_ptrs.dtype.element_ty), mask=row_valid[:, None])


def grid_kv_splits(programs: int, max_context_len: int, device: torch.device,
                   merge: MergeMode, min_split_keys: int, q_len: int = 1) -> int:
    """The key splits a launch of `programs` (request, kv head, row tile) programs gets when
    none is forced; the in-kernel merge drops splits past the pool's context bound, which
    could never run."""
    splits = pick_num_kv_splits(programs, device, at_most=q_len > 1)
    if merge == "in_kernel":
        splits = min(splits, triton.cdiv(max_context_len, min_split_keys))
    return splits


def decode_attention_fwd(
    q: torch.Tensor,  # [bs * q_len, H, D]
    k_buffer: torch.Tensor,  # [num_slots, KVH, D]
    v_buffer: torch.Tensor,  # [num_slots, KVH, D]
    out: torch.Tensor,  # [bs * q_len, H, D], written
    req_to_token: torch.Tensor,  # [num_rows, max_context_len]
    req_pool_indices: torch.Tensor,  # [bs]
    seq_lens: torch.Tensor,  # [bs]
    positions: torch.Tensor,  # [bs * q_len]
    sm_scale: float,
    causal: bool,
    num_kv_splits: int | None = None,
    sliding_window_size: int = -1,
    merge: MergeMode = "launch",
    counters: SplitCounters | None = None,
    min_split_keys: int = tiling.MIN_SPLIT_KEYS,
    single_pass: SinglePassTile | None = None,
    ragged: RaggedQueries | None = None,
    merge_heads: int = tiling.MERGE_HEADS,
) -> None:
    """Fixed-layout paged attention; `num_kv_splits=None` picks the split from the device;
    `sliding_window_size` keys left of each query are seen (-1: all). `merge="in_kernel"`
    needs `counters` and splits only keys past `min_split_keys` (a multiple of the key tile).
    `single_pass` (a bench-only candidate): no key split at all, at that tile. With `ragged`
    (bs request slots, any number of tokens), `seq_lens` is unused; rows of no request come
    out 0. `merge_heads`: the heads a merge program combines (`merge_attn_states`)."""
    if merge not in MERGE_MODES:
        raise ValueError(f"merge must be one of {MERGE_MODES}, got {merge!r}")
    if single_pass is not None and (merge != "launch" or num_kv_splits not in (None, 1)):
        raise ValueError(f"a single-pass tile takes no key split and no merge, got "
                         f"num_kv_splits={num_kv_splits}, merge={merge!r}")
    bs = req_pool_indices.shape[0]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    q_len = num_tokens // bs if ragged is None else ragged.width
    if ragged is not None and q_len < 1:
        raise ValueError(f"a ragged layout's width must be >= 1, got {q_len}")
    group = num_heads // num_kv_heads
    block_m = tiling.q_block(q_len * group, head_dim)
    block_n = tiling.kv_block(head_dim) if single_pass is None else single_pass.block_n
    m_tiles = triton.cdiv(q_len * group, block_m)
    in_kernel = merge == "in_kernel"
    if in_kernel and min_split_keys % block_n:
        raise ValueError(f"min_split_keys {min_split_keys} is not a multiple of the "
                         f"{block_n}-key tile")
    if single_pass is not None:
        num_kv_splits = 1
    elif num_kv_splits is None:
        # ragged: as few requests as can hold the tokens, the fewest programs
        requests = bs if ragged is None else triton.cdiv(num_tokens, q_len)
        num_kv_splits = grid_kv_splits(requests * num_kv_heads * m_tiles, req_to_token.shape[1],
                                       q.device, merge, min_split_keys, q_len)
    partial_out, partial_lse, split_counters = out, out, out  # unused when unsplit
    q_start, q_lens = seq_lens, seq_lens  # unused unless ragged
    merge_launch = num_kv_splits > 1 and not in_kernel
    if ragged is not None:
        seq_lens, q_start, q_lens = ragged.prefix_lens, ragged.q_start, ragged.lens
        if not merge_launch:
            out.zero_()  # rows of no request (the bucket's padding) stay finite
    if num_kv_splits > 1:
        # Per-split results in fp32; allocated per call (from the graph's pool when captured).
        partial_out = q.new_empty((num_tokens, num_heads, num_kv_splits, head_dim),
                                  dtype=torch.float32)
        lse_shape = (num_tokens, num_heads, num_kv_splits)
        if ragged is not None and merge_launch:
            # rows of no request merge to 0: no split saw a key for them
            partial_lse = q.new_full(lse_shape, NO_KEYS.value, dtype=torch.float32)
        else:
            partial_lse = q.new_empty(lse_shape, dtype=torch.float32)
        if in_kernel:
            if counters is None:
                raise ValueError("merge='in_kernel' with key splits needs SplitCounters")
            split_counters = counters.get(bs * num_kv_heads * m_tiles, q.device)
    grid = (bs, num_kv_heads * m_tiles, num_kv_splits)
    _decode_attention_kernel[grid](
        q, k_buffer, v_buffer, out, partial_out, partial_lse, split_counters,
        req_to_token, req_pool_indices, seq_lens, positions, q_start, q_lens,
        sm_scale * tiling.LOG2E,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        req_to_token.stride(0),
        Q_LEN=q_len, GROUP=group, M_TILES=m_tiles, NUM_KV_SPLITS=num_kv_splits,
        MERGE_IN_KERNEL=in_kernel and num_kv_splits > 1,  # one split: the launch kernel
        MIN_SPLIT_KEYS=min_split_keys, RAGGED=ragged is not None, CAUSAL=causal,
        SLIDING_WINDOW_SIZE=sliding_window_size, DOT_PRECISION=tiling.dot_precision(q.dtype),
        HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n,
        num_warps=tiling.num_warps(block_m, head_dim) if single_pass is None
        else single_pass.num_warps,
        num_stages=tiling.NUM_STAGES if single_pass is None else single_pass.num_stages,
    )
    if merge_launch:
        merge_attn_states(partial_out, partial_lse, out, merge_heads)

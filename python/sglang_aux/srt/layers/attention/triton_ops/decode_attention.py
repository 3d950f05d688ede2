"""Attention for the fixed-layout modes: DECODE, TARGET_VERIFY and DRAFT_BLOCK.

Every request has the same number `q_len` of queries (1 for DECODE, the block size B for
TARGET_VERIFY and DRAFT_BLOCK), stored request-major: token `b * q_len + i`. A query at
position p of a request with `seq_len` tokens sees key positions `j < seq_len`, and `j <= p`
too when causal, and `p - j <= sliding_window_size` with a window. Keys and values are
gathered from the paged pool through `req_to_token[req_pool_indices[b], j]`.

One program owns (request, kv head, row tile, key split). Its rows are the `q_len * group`
query heads that share the kv head, so each K/V tile is loaded once for the whole GQA group
and multiplied with tl.dot. The key axis the tile can see (from its window's start, 0 without
one, to `seq_len`) is cut into `num_kv_splits` equal chunks so a small batch still launches
enough programs; `merge_attn_states` then combines the chunks. Keys before the window are
never loaded, so a windowed layer's cost is bounded by the window, not the context.

NOTE: CUDA-graph safe. The grid depends only on (bs, heads, q_len, num_kv_splits), the key
loop bounds are read from `seq_lens` and `positions` inside the kernel (the window is a
compile-time constant of the layer), and nothing here syncs with the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops import tiling
from sglang_aux.srt.layers.attention.triton_ops.merge_attn_states import merge_attn_states
from sglang_aux.srt.layers.attention.triton_ops.paged_kv_loop import attend_paged_kv
from sglang_aux.srt.layers.attention.triton_ops.tiling import NO_KEYS, pick_num_kv_splits


@triton.jit
def _decode_attention_kernel(
    Q, K_Buf, V_Buf, Out, Partial_Out, Partial_Lse,
    Req_To_Token, Req_Pool_Indices, Seq_Lens, Positions,
    sm_scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_req,
    Q_LEN: tl.constexpr, GROUP: tl.constexpr, M_TILES: tl.constexpr,
    NUM_KV_SPLITS: tl.constexpr, CAUSAL: tl.constexpr, SLIDING_WINDOW_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1) // M_TILES
    m_tile = tl.program_id(1) % M_TILES
    split = tl.program_id(2)

    # Row r of the tile is query i = r // GROUP of the request, head kv_head * GROUP + r % GROUP.
    rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_valid = rows < Q_LEN * GROUP
    tok = b * Q_LEN + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    pos = tl.load(Positions + tok, mask=row_valid, other=0)

    seq_len = tl.load(Seq_Lens + b)
    req_row = tl.load(Req_Pool_Indices + b).to(tl.int64)
    kv_lo = tiling.window_start(tl.min(tl.where(row_valid, pos, seq_len), 0), seq_len,
                                SLIDING_WINDOW_SIZE)
    chunk = tl.cdiv(tl.cdiv(seq_len - kv_lo, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    kv_start = kv_lo + split * chunk
    kv_end = tl.minimum(kv_start + chunk, seq_len)

    acc, l_i, m_i = attend_paged_kv(
        q, pos, row_valid, K_Buf, V_Buf, Req_To_Token, req_row, kv_head, kv_start, kv_end,
        sm_scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
        CAUSAL, SLIDING_WINDOW_SIZE, DOT_PRECISION, HEAD_DIM, BLOCK_M, BLOCK_N)

    # Rows that saw no key (an empty split) give 0 and a NO_KEYS log-sum-exp, never NaN.
    has_keys = l_i > 0.0
    acc = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if NUM_KV_SPLITS == 1:
        tl.store(Out + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 acc.to(Out.dtype.element_ty), mask=row_valid[:, None])
    else:
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), NO_KEYS)
        tl.store(Partial_Out + tok[:, None] * stride_pt + head[:, None] * stride_ph
                 + split * stride_ps + d[None, :], acc, mask=row_valid[:, None])
        tl.store(Partial_Lse + tok * stride_lt + head * stride_lh + split, lse, mask=row_valid)


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
) -> None:
    """Fixed-layout paged attention; `num_kv_splits=None` picks the split from the device;
    `sliding_window_size` keys left of each query are seen (-1: all)."""
    bs = req_pool_indices.shape[0]
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    q_len = num_tokens // bs
    group = num_heads // num_kv_heads
    block_m = tiling.q_block(q_len * group, head_dim)
    m_tiles = triton.cdiv(q_len * group, block_m)
    if num_kv_splits is None:
        num_kv_splits = pick_num_kv_splits(bs * num_kv_heads * m_tiles, q.device)
    if num_kv_splits > 1:
        # Per-split results in fp32; allocated per call (from the graph's pool when captured).
        partial_out = q.new_empty((num_tokens, num_heads, num_kv_splits, head_dim),
                                  dtype=torch.float32)
        partial_lse = q.new_empty((num_tokens, num_heads, num_kv_splits), dtype=torch.float32)
    else:
        partial_out, partial_lse = out, out  # unused: the kernel writes `out` directly
    grid = (bs, num_kv_heads * m_tiles, num_kv_splits)
    _decode_attention_kernel[grid](
        q, k_buffer, v_buffer, out, partial_out, partial_lse,
        req_to_token, req_pool_indices, seq_lens, positions,
        sm_scale * tiling.LOG2E,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        req_to_token.stride(0),
        Q_LEN=q_len, GROUP=group, M_TILES=m_tiles, NUM_KV_SPLITS=num_kv_splits, CAUSAL=causal,
        SLIDING_WINDOW_SIZE=sliding_window_size, DOT_PRECISION=tiling.dot_precision(q.dtype),
        HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=tiling.kv_block(head_dim),
        num_warps=tiling.num_warps(block_m, head_dim), num_stages=tiling.NUM_STAGES,
    )
    if num_kv_splits > 1:
        merge_attn_states(partial_out, partial_lse, out)

"""Attention for EXTEND: each request appends `extend_len` new tokens after `prefix_len` cached.

Queries are packed request after request (`q_start[b]` is the first row of request b); the
i-th new token of a request sits at position `prefix_len + i` and sees key positions up to and
including its own (every key of the request when not causal), and with a window only the
`sliding_window_size` positions before it. Every key, prefix and new alike, is gathered from
the paged pool through `req_to_token[req_pool_indices[b], j]`, so the new tokens' K/V must
already be in the pool (the backend writes them to `out_cache_loc` first).

One program owns (request, kv head, tile of BLOCK_M rows, key split), a row being one new
token's query head of that kv head's group, token-major (GQA packing: each K/V tile loaded
serves the whole group; `pack_gqa=False` gives a program per query head); the tile's key range
starts at its window (keys before it are never loaded) and, when causal, stops at its last
position. The grid covers `max_extend_len` new tokens per request, a host bound: the batch's
longest request eagerly, the token bucket in a captured graph. A few new tokens after a long
cached prefix (an arrival whose prompt the prefix cache holds) make few tiles, each walking
the whole prefix; the key range is then cut into `num_kv_splits` chunks, as decode does, and
`merge_attn_states` combines them. The split count depends only on static shapes (graph safe).
Query rows outside every request (a graph's padding) come out 0 (`out` is written whole).
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
def _extend_attention_kernel(
    Q, K_Buf, V_Buf, Out, Partial_Out, Partial_Lse,
    Req_To_Token, Req_Pool_Indices, Q_Start, Prefix_Lens, Extend_Lens,
    q_offset, sm_scale_log2,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh,
    stride_req,
    GROUP: tl.constexpr, PACK_GQA: tl.constexpr, NUM_KV_SPLITS: tl.constexpr,
    CAUSAL: tl.constexpr, SLIDING_WINDOW_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    m_tile = tl.program_id(2) // NUM_KV_SPLITS
    split = tl.program_id(2) % NUM_KV_SPLITS
    # PACK_GQA: a program owns a kv head and its GROUP query heads, a tile's rows running
    # (token, head) token-major, so each K/V tile it loads serves GROUP heads
    rows_per_token = GROUP if PACK_GQA else 1
    if PACK_GQA:
        kv_head = tl.program_id(1)
    else:
        kv_head = tl.program_id(1) // GROUP

    extend_len = tl.load(Extend_Lens + b)
    prefix_len = tl.load(Prefix_Lens + b)
    q_start = tl.load(Q_Start + b)
    req_row = tl.load(Req_Pool_Indices + b).to(tl.int64)

    tile_rows = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tile_rows // rows_per_token  # index among this request's new tokens
    if PACK_GQA:
        head = kv_head * GROUP + tile_rows % GROUP
    else:
        head = tl.program_id(1) + tile_rows * 0
    row_valid = rows < extend_len
    tok = (q_start - q_offset + rows).to(tl.int64)
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None], other=0.0)  # [BLOCK_M, HEAD_DIM]
    q_pos = prefix_len + rows

    # Keys past the tile's last query are causally invisible; a tile past the request's new
    # tokens (the grid covers the longest request) runs no loop and stores nothing.
    first_token = m_tile * BLOCK_M // rows_per_token
    if CAUSAL:
        last_token = ((m_tile + 1) * BLOCK_M - 1) // rows_per_token
        kv_end = prefix_len + tl.minimum(last_token + 1, extend_len)
    else:
        kv_end = prefix_len + extend_len
    kv_end = tl.where(first_token < extend_len, kv_end, 0)
    kv_lo = tiling.window_start(prefix_len + first_token, kv_end, SLIDING_WINDOW_SIZE)
    chunk = tl.cdiv(tl.cdiv(kv_end - kv_lo, NUM_KV_SPLITS), BLOCK_N) * BLOCK_N
    kv_start = kv_lo + split * chunk
    kv_end = tl.minimum(kv_start + chunk, kv_end)

    acc, l_i, m_i = attend_paged_kv(
        q, q_pos, row_valid, K_Buf, V_Buf, Req_To_Token, req_row, kv_head, kv_start, kv_end,
        sm_scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
        CAUSAL, SLIDING_WINDOW_SIZE, DOT_PRECISION, HEAD_DIM, BLOCK_M, BLOCK_N)

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


def extend_attention_fwd(
    q: torch.Tensor,  # [sum(extend_lens), H, D]
    k_buffer: torch.Tensor,  # [num_slots, KVH, D]
    v_buffer: torch.Tensor,  # [num_slots, KVH, D]
    out: torch.Tensor,  # [sum(extend_lens), H, D], written
    req_to_token: torch.Tensor,  # [num_rows, max_context_len]
    req_pool_indices: torch.Tensor,  # [bs]
    q_start: torch.Tensor,  # [bs] first query row of each request
    prefix_lens: torch.Tensor,  # [bs]
    extend_lens: torch.Tensor,  # [bs]
    max_extend_len: int,
    sm_scale: float,
    causal: bool = True,
    sliding_window_size: int = -1,
    num_kv_splits: int | None = None,
    q_offset: int = 0,
    pack_gqa: bool = True,
) -> None:
    """`sliding_window_size` keys left of each query are seen (-1: all); `num_kv_splits=None`
    picks the split from the device for the case of one request holding every new token.
    `q_offset`: `q` and `out` start at that row of the batch `q_start` counts in (a MIXED
    batch's arrivals, after its step rows). `pack_gqa` (the default): a program per kv head,
    its tiles' rows (token, query head) token-major, so each K/V tile loaded serves the whole
    group; False, a program per query head. Measured on an H100 at Qwen2.5-1.5B's heads
    (`bench_extend_attention.py`, docs/kernels.md): 1.12-1.27x for the GSM8K harness's
    arrivals in a mixed graph, 0.99-1.00x for long prefills."""
    bs = req_pool_indices.shape[0]
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // k_buffer.shape[1]
    pack_gqa = pack_gqa and group > 1
    rows = max_extend_len * group if pack_gqa else max_extend_len
    block_m = tiling.q_block(rows, head_dim)
    m_tiles = triton.cdiv(rows, block_m)
    heads = num_heads // group if pack_gqa else num_heads
    if num_kv_splits is None:
        num_kv_splits = pick_num_kv_splits(heads * m_tiles, q.device)
    if num_kv_splits > 1:
        # Rows no program writes (a graph's padding) merge to 0: their splits saw no keys.
        partial_out = q.new_empty((num_tokens, num_heads, num_kv_splits, head_dim),
                                  dtype=torch.float32)
        partial_lse = q.new_full((num_tokens, num_heads, num_kv_splits), NO_KEYS.value,
                                 dtype=torch.float32)
    else:
        out.zero_()  # rows of no request (a graph's padding) stay finite
        partial_out, partial_lse = out, out  # unused: the kernel writes `out` directly
    grid = (bs, heads, m_tiles * num_kv_splits)
    _extend_attention_kernel[grid](
        q, k_buffer, v_buffer, out, partial_out, partial_lse,
        req_to_token, req_pool_indices, q_start, prefix_lens, extend_lens,
        q_offset, sm_scale * tiling.LOG2E,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1), out.stride(0), out.stride(1),
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1),
        req_to_token.stride(0),
        GROUP=group, PACK_GQA=pack_gqa, NUM_KV_SPLITS=num_kv_splits, CAUSAL=causal,
        SLIDING_WINDOW_SIZE=sliding_window_size,
        DOT_PRECISION=tiling.dot_precision(q.dtype), HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=tiling.kv_block(head_dim),
        num_warps=tiling.num_warps(block_m, head_dim), num_stages=tiling.NUM_STAGES,
    )
    if num_kv_splits > 1:
        merge_attn_states(partial_out, partial_lse, out)

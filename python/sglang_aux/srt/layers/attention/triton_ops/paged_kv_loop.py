"""The key loop both attention kernels share: online softmax over paged K/V."""

from __future__ import annotations

import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops.tiling import NO_KEYS


@triton.jit
def attend_paged_kv(
    q, q_pos, row_valid, K_Buf, V_Buf, Req_To_Token, req_row, kv_head, kv_start, kv_end,
    sm_scale_log2, stride_kt, stride_kh, stride_vt, stride_vh, stride_req,
    CAUSAL: tl.constexpr, SLIDING_WINDOW_SIZE: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    EARLY_LOADS: tl.constexpr,
):
    """A query tile `q` `[BLOCK_M, HEAD_DIM]` attends to key positions `[kv_start, kv_end)`
    of request row `req_row`; when CAUSAL, only to positions <= its `q_pos`, and with a
    window (SLIDING_WINDOW_SIZE >= 0) only to positions >= `q_pos - SLIDING_WINDOW_SIZE`.
    Callers start `kv_start` at the tile's window, so keys before it are never loaded.

    Returns the unnormalized `acc` `[BLOCK_M, HEAD_DIM]`, the softmax denominators `l_i` and
    the running maxima `m_i` (log2 domain; NO_KEYS for rows that saw no key).

    `EARLY_LOADS` (a bench-only candidate, docs/kernels.md): each tile's slot indices are
    loaded one iteration ahead and its V gather is issued with its K gather, so no gather
    waits on the index load or on the tile's softmax; the same arithmetic, the same result.
    """
    d = tl.arange(0, HEAD_DIM)
    m_i = tl.full([BLOCK_M], NO_KEYS, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if EARLY_LOADS:
        # The tile's slots are in registers before its K/V gathers are issued: the first ones
        # before the loop, each next tile's while this one's dots run; V is asked for with K.
        cols = kv_start + tl.arange(0, BLOCK_N)
        slots = tl.load(Req_To_Token + req_row * stride_req + cols, mask=cols < kv_end,
                        other=0).to(tl.int64)
        for _ in range(kv_start, kv_end, BLOCK_N):
            col_valid = cols < kv_end
            k = tl.load(K_Buf + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                        mask=col_valid[:, None], other=0.0).to(q.dtype)
            v = tl.load(V_Buf + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                        mask=col_valid[:, None], other=0.0).to(q.dtype)
            next_cols = cols + BLOCK_N
            slots = tl.load(Req_To_Token + req_row * stride_req + next_cols,
                            mask=next_cols < kv_end, other=0).to(tl.int64)
            p, alpha, m_i = _scores(q, k, q_pos, row_valid, cols, col_valid, m_i,
                                    sm_scale_log2, CAUSAL, SLIDING_WINDOW_SIZE, DOT_PRECISION)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
            cols = next_cols
    else:
        for n0 in range(kv_start, kv_end, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            col_valid = cols < kv_end
            slots = tl.load(Req_To_Token + req_row * stride_req + cols, mask=col_valid, other=0)
            slots = slots.to(tl.int64)  # slot * stride can pass 2**31 in large pools
            k = tl.load(K_Buf + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                        mask=col_valid[:, None], other=0.0).to(q.dtype)  # [BLOCK_N, HEAD_DIM]
            p, alpha, m_i = _scores(q, k, q_pos, row_valid, cols, col_valid, m_i,
                                    sm_scale_log2, CAUSAL, SLIDING_WINDOW_SIZE, DOT_PRECISION)
            v = tl.load(V_Buf + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                        mask=col_valid[:, None], other=0.0).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
            l_i = l_i * alpha + tl.sum(p, 1)
    return acc, l_i, m_i


@triton.jit
def _scores(q, k, q_pos, row_valid, cols, col_valid, m_i, sm_scale_log2,
            CAUSAL: tl.constexpr, SLIDING_WINDOW_SIZE: tl.constexpr,
            DOT_PRECISION: tl.constexpr):
    """(p, alpha, m_new) of one key tile: its unnormalized probabilities against the running
    max m_new, and the factor that rescales what came before."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
    visible = row_valid[:, None] & col_valid[None, :]
    if CAUSAL:
        visible = visible & (cols[None, :] <= q_pos[:, None])
    if SLIDING_WINDOW_SIZE >= 0:
        visible = visible & (q_pos[:, None] - cols[None, :] <= SLIDING_WINDOW_SIZE)
    qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    return tl.exp2(qk - m_new[:, None]), tl.exp2(m_i - m_new), m_new

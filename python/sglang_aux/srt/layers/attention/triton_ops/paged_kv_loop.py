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
):
    """A query tile `q` `[BLOCK_M, HEAD_DIM]` attends to key positions `[kv_start, kv_end)`
    of request row `req_row`; when CAUSAL, only to positions <= its `q_pos`, and with a
    window (SLIDING_WINDOW_SIZE >= 0) only to positions >= `q_pos - SLIDING_WINDOW_SIZE`.
    Callers start `kv_start` at the tile's window, so keys before it are never loaded.

    Returns the unnormalized `acc` `[BLOCK_M, HEAD_DIM]`, the softmax denominators `l_i` and
    the running maxima `m_i` (log2 domain; NO_KEYS for rows that saw no key).
    """
    d = tl.arange(0, HEAD_DIM)
    m_i = tl.full([BLOCK_M], NO_KEYS, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for n0 in range(kv_start, kv_end, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        col_valid = cols < kv_end
        slots = tl.load(Req_To_Token + req_row * stride_req + cols, mask=col_valid, other=0)
        slots = slots.to(tl.int64)  # slot * stride can pass 2**31 in large pools
        k = tl.load(K_Buf + slots[:, None] * stride_kt + kv_head * stride_kh + d[None, :],
                    mask=col_valid[:, None], other=0.0).to(q.dtype)  # [BLOCK_N, HEAD_DIM]
        qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2
        visible = row_valid[:, None] & col_valid[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= q_pos[:, None])
        if SLIDING_WINDOW_SIZE >= 0:
            visible = visible & (q_pos[:, None] - cols[None, :] <= SLIDING_WINDOW_SIZE)
        qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        p = tl.exp2(qk - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        v = tl.load(V_Buf + slots[:, None] * stride_vt + kv_head * stride_vh + d[None, :],
                    mask=col_valid[:, None], other=0.0).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v, input_precision=DOT_PRECISION)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new
    return acc, l_i, m_i

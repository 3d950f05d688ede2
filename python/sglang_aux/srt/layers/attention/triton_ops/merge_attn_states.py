"""Combines per-split attention results into one output (the second step of split-K).

Split s of a query head holds the softmax-normalized output `o_s` over its keys and the
log-sum-exp `lse_s` of its scores (base 2, scaled). The full result is
`sum_s w_s * o_s / sum_s w_s` with `w_s = 2 ** (lse_s - max_s lse_s)`; 0 where no split saw a
key (every lse_s is NO_KEYS).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.attention.triton_ops import tiling
from sglang_aux.srt.layers.attention.triton_ops.tiling import NO_KEYS


@triton.jit
def _merge_attn_states_kernel(
    Partial_Out, Partial_Lse, Out, num_heads,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_valid = h < num_heads
    s = tl.arange(0, BLOCK_S)
    valid = h_valid[:, None] & (s < NUM_SPLITS)[None, :]  # [BLOCK_H, BLOCK_S]
    d = tl.arange(0, HEAD_DIM)
    lse = tl.load(Partial_Lse + t * stride_lt + h[:, None] * stride_lh + s[None, :],
                  mask=valid, other=float("-inf"))
    lse_max = tl.max(lse, 1)
    w = tl.exp2(lse - lse_max[:, None])
    o = tl.load(Partial_Out + t * stride_pt + h[:, None, None] * stride_ph
                + s[None, :, None] * stride_ps + d[None, None, :],
                mask=valid[:, :, None], other=0.0)  # [BLOCK_H, BLOCK_S, HEAD_DIM]
    merged = tl.sum(w[:, :, None] * o, 1) / tl.sum(w, 1)[:, None]
    # no split saw a key (a padding row, whose partial outputs nobody wrote): 0, never NaN
    merged = tl.where((lse_max > NO_KEYS)[:, None], merged, 0.0)
    tl.store(Out + t * stride_ot + h[:, None] * stride_oh + d[None, :],
             merged.to(Out.dtype.element_ty), mask=h_valid[:, None])


def merge_attn_states(
    partial_out: torch.Tensor,  # [T, H, S, D] fp32
    partial_lse: torch.Tensor,  # [T, H, S] fp32
    out: torch.Tensor,  # [T, H, D], written in its own dtype
    heads_per_program: int = tiling.MERGE_HEADS,
) -> None:
    """`heads_per_program` (a power of two): the query heads of a token one program merges;
    fewer, larger programs than one a head for a verify step's many rows."""
    if heads_per_program < 1 or heads_per_program & (heads_per_program - 1):
        raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")
    num_tokens, num_heads, num_splits, head_dim = partial_out.shape
    block_h = min(heads_per_program, triton.next_power_of_2(num_heads))
    _merge_attn_states_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        partial_out, partial_lse, out, num_heads,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_H=block_h,
        HEAD_DIM=head_dim, num_warps=tiling.MERGE_NUM_WARPS,
    )

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
    Partial_Out, Partial_Lse, Out,
    stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ot, stride_oh,
    NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    t = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < NUM_SPLITS
    d = tl.arange(0, HEAD_DIM)
    lse = tl.load(Partial_Lse + t * stride_lt + h * stride_lh + s, mask=s_valid,
                  other=float("-inf"))  # [BLOCK_S]
    w = tl.exp2(lse - tl.max(lse, 0))
    o = tl.load(Partial_Out + t * stride_pt + h * stride_ph + s[:, None] * stride_ps + d[None, :],
                mask=s_valid[:, None], other=0.0)  # [BLOCK_S, HEAD_DIM]
    merged = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    # no split saw a key (a padding row, whose partial outputs nobody wrote): 0, never NaN
    merged = tl.where(tl.max(lse, 0) > NO_KEYS, merged, 0.0)
    tl.store(Out + t * stride_ot + h * stride_oh + d, merged.to(Out.dtype.element_ty))


def merge_attn_states(
    partial_out: torch.Tensor,  # [T, H, S, D] fp32
    partial_lse: torch.Tensor,  # [T, H, S] fp32
    out: torch.Tensor,  # [T, H, D], written in its own dtype
) -> None:
    num_tokens, num_heads, num_splits, head_dim = partial_out.shape
    _merge_attn_states_kernel[(num_tokens, num_heads)](
        partial_out, partial_lse, out,
        partial_out.stride(0), partial_out.stride(1), partial_out.stride(2),
        partial_lse.stride(0), partial_lse.stride(1), out.stride(0), out.stride(1),
        NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
        num_warps=tiling.MERGE_NUM_WARPS,
    )

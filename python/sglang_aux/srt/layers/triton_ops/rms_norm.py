"""RMSNorm of `[rows, n]`, optionally fused with the residual add before it.

One program per row, the whole row in one block (hidden sizes here are a few thousand at
most). fp32 math; the sum `x + residual` is rounded to the output dtype before it is
normalized, exactly as the unfused `norm(x + residual)` would see it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.grid_dependency import (
    resolve_pdl,
    wait_for_previous_kernel,
)


@triton.jit
def _rms_norm_kernel(X, R, W, Y, R_Out, stride_x, stride_r, stride_y, stride_ro, n, eps,
                     HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr, BLOCK: tl.constexpr):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        s = (x + r).to(R_Out.dtype.element_ty)
        tl.store(R_Out + row * stride_ro + cols, s, mask=mask)
        x = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None, pdl: bool | None = None
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[rows, n]` (last dim contiguous) -> normed `[rows, n]`; with `residual`, also the
    new residual `x + residual`. Outputs are new tensors in x's dtype; inputs are not written.
    `pdl`: launch dependent (`grid_dependency.py`; None reads its bench switch)."""
    if x.dim() != 2 or x.stride(-1) != 1:
        raise ValueError(f"rms_norm needs a [rows, n] input with a contiguous last dim, "
                         f"got shape {tuple(x.shape)} strides {x.stride()}")
    if residual is not None and (residual.shape != x.shape or residual.stride(-1) != 1):
        raise ValueError(f"residual {tuple(residual.shape)} (strides {residual.stride()}) "
                         f"does not match the input {tuple(x.shape)}")
    rows, n = x.shape
    pdl = resolve_pdl(pdl, x)
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    r_out = torch.empty_like(y) if residual is not None else y
    if rows:
        r = residual if residual is not None else x
        _rms_norm_kernel[(rows,)](
            x, r, weight, y, r_out, x.stride(0), r.stride(0), y.stride(0), r_out.stride(0),
            n, eps, HAS_RESIDUAL=residual is not None, PDL=pdl,
            BLOCK=triton.next_power_of_2(n), num_warps=4 if n <= 4096 else 8, launch_pdl=pdl,
        )
    return y if residual is None else (y, r_out)

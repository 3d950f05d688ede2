"""`silu(gate) * up` from one gate-up projection `[T, 2 * I]` (gate | up halves) -> `[T, I]`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.grid_dependency import (
    resolve_pdl,
    wait_for_previous_kernel,
)

BLOCK = 1024


@triton.jit
def _silu_and_mul_kernel(X, Y, stride_x, stride_y, n, PDL: tl.constexpr, BLOCK: tl.constexpr):
    wait_for_previous_kernel(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    gate = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + n + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
    """x `[T, 2 * I]` (last dim contiguous) -> a new `[T, I]` in x's dtype; fp32 math.
    `pdl`: launch dependent (`grid_dependency.py`; None reads its bench switch)."""
    if x.dim() != 2 or x.shape[1] % 2 or x.stride(-1) != 1:
        raise ValueError(f"silu_and_mul needs [tokens, 2 * I] with a contiguous last dim, got "
                         f"shape {tuple(x.shape)} strides {x.stride()}")
    rows, n = x.shape[0], x.shape[1] // 2
    pdl = resolve_pdl(pdl, x)
    y = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows:
        _silu_and_mul_kernel[(rows, triton.cdiv(n, BLOCK))](
            x, y, x.stride(0), y.stride(0), n, PDL=pdl, BLOCK=BLOCK, num_warps=4, launch_pdl=pdl)
    return y

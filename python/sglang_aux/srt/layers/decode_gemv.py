"""Decode GEMV: whether a dense projection of a small forward runs the skinny-GEMM kernel.

At 1..16 tokens (decode at small batch, a DFlash verify of one request) a projection reads its
weight once and computes little; `triton_ops/skinny_gemm.py` streams the weight with the
RMSNorm before it, the bias and the SiLU-mul after it fused in. The server flag
`--decode-gemv-backend` (`torch` by default until the H200 has measured the kernels) is set on
every layer that has the path (`gemv_backend`) when the runner builds the model; with `triton`,
the dispatch rules of `triton_ops/dispatch.py` still decide (CUDA in `auto`, everywhere in
`force`, never in `off` or while autograd records).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang_aux.srt.layers.layernorm import RMSNorm, add_norm
from sglang_aux.srt.layers.triton_ops.dispatch import (
    GEMV_BACKENDS,
    GEMV_DTYPES,
    GEMV_MAX_ROWS,
    use_triton,
)

if TYPE_CHECKING:
    from sglang_aux.srt.layers.activation import SiluAndMul


def set_decode_gemv_backend(model: nn.Module, backend: str) -> None:
    """Every layer of `model` with a decode GEMV path takes `backend`."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"decode GEMV backend {backend!r}; choose from {GEMV_BACKENDS}")
    for module in model.modules():
        if hasattr(module, "gemv_backend"):
            module.gemv_backend = backend


def use_gemv(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether `layer` (with `weight` and `gemv_backend`) runs the kernel on `x` `[rows, K]`."""
    w = layer.weight
    max_rows = 1 if layer.gemv_backend == "row" else GEMV_MAX_ROWS
    return (layer.gemv_backend != "torch" and x.dim() == 2 and 0 < x.shape[0] <= max_rows
            and x.dtype == w.dtype and w.dtype in GEMV_DTYPES and w.is_contiguous()
            and x.stride(-1) == 1 and use_triton(x))


def norm_linear(norm: RMSNorm, linear: nn.Module, hidden: torch.Tensor,
                residual: torch.Tensor | None, act: SiluAndMul | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(act(linear(norm(stream))), stream)` of the residual stream `hidden + residual`
    (`hidden` alone when residual is None), as `(norm(hidden, residual), linear, act)` run one
    after the other would give it; one kernel when the decode GEMV takes `hidden`. `linear`
    is a `linear.MergedColumnLinear` (not named in the annotation: that module imports this
    one)."""
    if use_gemv(linear, hidden) and linear.gemv_backend == "row":
        from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv

        y, stream = row_gemv(hidden, linear.weight, linear.bias, norm_weight=norm.weight,
                             eps=norm.variance_epsilon, residual=residual)
        return (y if act is None else act(y)), stream
    if use_gemv(linear, hidden):
        from sglang_aux.srt.layers.triton_ops.skinny_gemm import skinny_gemm

        return skinny_gemm(hidden, linear.weight, linear.bias, norm_weight=norm.weight,
                           eps=norm.variance_epsilon, residual=residual,
                           silu_mul=act is not None)
    x, stream = add_norm(norm, hidden, residual)
    y = linear(x)
    return (y if act is None else act(y)), stream

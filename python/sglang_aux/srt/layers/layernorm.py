"""RMSNorm, optionally fused with the residual add before it (SGLang's `norm(x, residual)`)."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.layers.triton_ops.dispatch import use_triton


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """`norm(x)`; with `residual`, `(norm(x + residual), x + residual)`. New tensors
        always: neither input is written, so callers may keep them."""
        if use_triton(x):
            from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm

            shape = x.shape
            res2d = residual.reshape(-1, shape[-1]) if residual is not None else None
            out = rms_norm(x.reshape(-1, shape[-1]), self.weight, self.variance_epsilon, res2d)
            if residual is None:
                return out.view(shape)
            return out[0].view(shape), out[1].view(shape)
        return self.forward_native(x, residual)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None
                       ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The torch twin of the kernel (and the CPU path)."""
        if residual is not None:
            x = x + residual
        # Normalize in fp32: bf16 sums of squares lose too much for wide hidden sizes.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        out = (xf * self.weight.float()).to(x.dtype)
        return out if residual is None else (out, x)


def add_norm(norm: RMSNorm, hidden: torch.Tensor, residual: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(norm(stream), stream)` of the residual stream `hidden + residual` (`hidden` alone
    when residual is None)."""
    return (norm(hidden), hidden) if residual is None else norm(hidden, residual)

"""SiLU-and-multiply of a merged gate-up projection (SGLang's `SiluAndMul`)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sglang_aux.srt.layers.triton_ops.dispatch import use_triton


class SiluAndMul(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x `[T, 2 * I]` (gate | up) -> `silu(gate) * up` `[T, I]`."""
        if use_triton(x) and x.dim() == 2:
            from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul

            return silu_and_mul(x)
        return self.forward_native(x)

    @staticmethod
    def forward_native(x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

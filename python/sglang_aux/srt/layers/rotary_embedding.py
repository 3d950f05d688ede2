"""Rotary position embedding (NeoX half-split layout, as HF Llama/Qwen3 checkpoints use)."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.layers.rope_scaling import RopeScaling


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, rope: RopeScaling):
        super().__init__()
        self.head_dim = head_dim
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32),
                            rope.inv_freq(head_dim))
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1) * rope.attention_factor
        # [max_position, head_dim] = cos | sin halves; a buffer so it follows .to(device)
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q `[T, H*D]`, k `[T, KVH*D]` rotated at `positions` `[T]`."""
        cos, sin = self._cos_sin(positions)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def rotate(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x `[T, heads * D]` rotated at `positions` `[T]`."""
        return self._rotate(x, *self._cos_sin(positions))

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
        return cos[:, None], sin[:, None]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.view(x.shape[0], -1, self.head_dim).float()
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype).view(x.shape)

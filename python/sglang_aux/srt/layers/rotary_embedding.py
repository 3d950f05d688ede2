"""Rotary position embedding (NeoX half-split layout, as HF Llama/Qwen3 checkpoints use),
with the per-head q/k RMSNorm before it (Qwen3) and the K/V store after it fused in."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.layers.kv_store import KVStore
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.layers.triton_ops.dispatch import use_triton


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, rope: RopeScaling):
        super().__init__()
        self.head_dim = head_dim
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32),
                            rope.inv_freq(head_dim))
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], -1) * rope.attention_factor
        # [max_position, head_dim] = cos | sin halves; a buffer so it follows .to(device)
        self.register_buffer("cos_sin_cache", cos_sin, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor | None, k: torch.Tensor,
                q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None
                ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """q `[T, H*D]` (or None) and k `[T, KVH*D]`, per-head normed when norms are given,
        rotated at `positions` `[T]`. The Triton path rotates in place: use the results."""
        if use_triton(k):
            from sglang_aux.srt.layers.triton_ops.rope_store import rope_store

            rope_store(positions, q, k, self.cos_sin_cache, *self._norm_args(q, q_norm, k_norm))
            return q, k
        return self.forward_native(positions, q, k, q_norm, k_norm)

    def forward_and_store(self, positions: torch.Tensor, q: torch.Tensor | None,
                          k: torch.Tensor, v: torch.Tensor, store: KVStore,
                          q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None
                          ) -> torch.Tensor | None:
        """As `forward`, then the rotated k and v `[T, KVH*D]` go to `store`; returns q."""
        if use_triton(k):
            from sglang_aux.srt.layers.triton_ops.rope_store import rope_store

            rope_store(positions, q, k, self.cos_sin_cache, *self._norm_args(q, q_norm, k_norm),
                       v=v, k_cache=store.k_cache, v_cache=store.v_cache, loc=store.loc)
            return q
        q, k = self.forward_native(positions, q, k, q_norm, k_norm)
        store.write(k, v)
        return q

    def forward_native(self, positions: torch.Tensor, q: torch.Tensor | None, k: torch.Tensor,
                       q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None
                       ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The torch twin of the kernel (and the CPU path); out of place."""
        d = self.head_dim
        if k_norm is not None:
            k = k_norm.forward_native(k.reshape(-1, d)).view(k.shape)
            if q is not None:
                q = q_norm.forward_native(q.reshape(-1, d)).view(q.shape)
        cos, sin = self.cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
        cos, sin = cos[:, None], sin[:, None]
        return (self._rotate(q, cos, sin) if q is not None else None), self._rotate(k, cos, sin)

    @staticmethod
    def _norm_args(q: torch.Tensor | None, q_norm: RMSNorm | None, k_norm: RMSNorm | None
                   ) -> tuple[torch.Tensor | None, torch.Tensor | None, float]:
        if k_norm is None:
            return None, None, 0.0
        q_weight = q_norm.weight if q is not None else None
        return q_weight, k_norm.weight, k_norm.variance_epsilon

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.reshape(x.shape[0], -1, self.head_dim).float()
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        return out.to(x.dtype).view(x.shape[0], -1)

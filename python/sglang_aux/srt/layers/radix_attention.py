"""The attention layer models call; the batch's attention backend does the work."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch


class RadixAttention(nn.Module):
    """Paged attention over the batch's KV pool for one layer (no weights of its own)."""

    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int,
                 layer_id: int):
        super().__init__()
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                forward_batch: ForwardBatch, save_kv_cache: bool = True) -> torch.Tensor:
        """q `[T, H*D]`, k/v `[T, KVH*D]` -> `[T, H*D]`; k/v are written to `out_cache_loc`."""
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)

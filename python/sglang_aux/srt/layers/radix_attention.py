"""The attention layer models call; the batch's attention backend does the work."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.configs.decoder_config import FULL_CONTEXT, AttentionType
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.kv_store import KVStore


class RadixAttention(nn.Module):
    """Paged attention over the batch's KV pool for one layer (no weights of its own).

    A query at position p sees key positions j < seq_len, with j <= p when `attn_type` is
    DECODER, and p - j <= `sliding_window_size` unless that is FULL_CONTEXT. As in SGLang the
    window counts the keys left of the query it still sees: HF's `sliding_window` W (the query
    plus W - 1 earlier keys) is `sliding_window_size = W - 1`.
    """

    def __init__(self, num_heads: int, head_dim: int, scaling: float, num_kv_heads: int,
                 layer_id: int, sliding_window_size: int = FULL_CONTEXT,
                 attn_type: AttentionType = AttentionType.DECODER):
        super().__init__()
        if sliding_window_size < FULL_CONTEXT:
            raise ValueError(f"sliding_window_size must be >= {FULL_CONTEXT} (full context), "
                             f"got {sliding_window_size}")
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.sliding_window_size = sliding_window_size
        self.attn_type = attn_type

    @property
    def is_causal(self) -> bool:
        return self.attn_type is AttentionType.DECODER

    def kv_store(self, forward_batch: ForwardBatch) -> KVStore | None:
        """Where this layer's new K/V go, for a caller that stores them itself (the fused
        RoPE) and then calls with `save_kv_cache=False`; None for a stand-in batch without
        a KV pool, whose backend takes k/v as arguments."""
        if not isinstance(forward_batch, ForwardBatch):
            return None
        return KVStore(forward_batch.token_to_kv_pool, self.layer_id, forward_batch.out_cache_loc)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                forward_batch: ForwardBatch, save_kv_cache: bool = True) -> torch.Tensor:
        """q `[T, H*D]`, k/v `[T, KVH*D]` -> `[T, H*D]`; k/v are written to `out_cache_loc`
        unless `save_kv_cache` is False (then they may be None: already stored)."""
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)

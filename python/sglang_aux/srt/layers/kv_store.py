"""Where a layer's new K/V go: its KV-pool buffers at the batch's slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool


@dataclass(frozen=True)
class KVStore:
    pool: MHATokenToKVPool
    layer_id: int
    loc: torch.Tensor  # [T] slots, one per token

    @property
    def k_cache(self) -> torch.Tensor:
        return self.pool.k_buffer[self.layer_id]  # [slots, KVH, D]

    @property
    def v_cache(self) -> torch.Tensor:
        return self.pool.v_buffer[self.layer_id]

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Unfused store of k/v `[T, KVH * D]` (the pool's own `set_kv`)."""
        shape = (-1, *self.k_cache.shape[1:])
        self.pool.set_kv(self.layer_id, self.loc, k.view(shape), v.view(shape))

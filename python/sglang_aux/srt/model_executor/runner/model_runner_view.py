"""What a graph runner or prologue reads from the `ModelRunner` that owns it, as a protocol:
model_runner.py builds the runners, so the runner package cannot import it back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from sglang_aux.srt.configs.model_config import ModelConfig
    from sglang_aux.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


class ModelRunnerView(Protocol):
    model: nn.Module
    model_config: ModelConfig
    device: torch.device
    attn_backend: AttentionBackend
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool


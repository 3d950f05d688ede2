"""Qwen3 (`Qwen3ForCausalLM`): the Llama decoder with per-head RMSNorm on q and k (fused into
the RoPE step by `LlamaAttention`) and transformers' Qwen sliding windows."""

from __future__ import annotations

from types import SimpleNamespace

from sglang_aux.srt.configs.decoder_config import LayerAttention, qwen_layer_attention
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class Qwen3Attention(LlamaAttention):
    def __init__(self, config: SimpleNamespace, layer_id: int):
        super().__init__(config, layer_id)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    @staticmethod
    def layer_attention(config: SimpleNamespace, layer_id: int) -> LayerAttention:
        return qwen_layer_attention(config)[layer_id]


class Qwen3DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen3Model


EntryClass = Qwen3ForCausalLM

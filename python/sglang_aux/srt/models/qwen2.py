"""Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): the Llama decoder with q/k/v biases (no o_proj bias)
and transformers' Qwen sliding windows (`use_sliding_window`, `max_window_layers`,
`layer_types`); Qwen2.5 checkpoints ship with them off.
"""

from __future__ import annotations

from types import SimpleNamespace

from sglang_aux.srt.configs.decoder_config import LayerAttention, qwen_layer_attention
from sglang_aux.srt.models.llama import (
    LlamaAttention,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
)


class Qwen2Attention(LlamaAttention):
    @staticmethod
    def projection_biases(config: SimpleNamespace) -> tuple[bool, bool]:
        return True, False

    @staticmethod
    def layer_attention(config: SimpleNamespace, layer_id: int) -> LayerAttention:
        return qwen_layer_attention(config)[layer_id]


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2Model(LlamaModel):
    layer_cls = Qwen2DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen2Model


EntryClass = Qwen2ForCausalLM

"""Qwen2 / Qwen2.5 (`Qwen2ForCausalLM`): the Llama decoder with q/k/v biases (no o_proj bias).

Sliding-window attention (`use_sliding_window`) is not implemented: such a config is refused
rather than run with full attention. Qwen2.5 checkpoints ship with it off.
"""

from __future__ import annotations

from types import SimpleNamespace

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


class Qwen2DecoderLayer(LlamaDecoderLayer):
    attention_cls = Qwen2Attention


class Qwen2Model(LlamaModel):
    layer_cls = Qwen2DecoderLayer


class Qwen2ForCausalLM(LlamaForCausalLM):
    model_cls = Qwen2Model

    def __init__(self, config: SimpleNamespace, pp_size: int = 1):
        if getattr(config, "use_sliding_window", False):
            raise ValueError("Qwen2 with use_sliding_window=true is not supported "
                             f"(sliding_window={getattr(config, 'sliding_window', None)})")
        super().__init__(config, pp_size)


EntryClass = Qwen2ForCausalLM

"""Fields of a Llama-family `config.json` that change what the decoder computes: read as
transformers reads them for the model type, or refused when the runtime does not compute them
(silently ignoring one would serve a different model).

What the decoder does implement is read where it is used: RoPE in `layers/rope_scaling.py`,
`head_dim` and `attention_bias` (q/k/v and o_proj biases, as HF Llama and Qwen3 define it) in
the attention constructor, and each layer's attention pattern (`LayerAttention`) here, by
the reading its model names (the DFlash draft's follows SGLang: `configs/dflash_config.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from types import SimpleNamespace

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
SUPPORTED_ACTIVATIONS = ("silu",)
# transformers' Qwen2Config / Qwen3Config defaults for keys a config.json leaves out
QWEN_DEFAULT_SLIDING_WINDOW = 4096
QWEN_DEFAULT_MAX_WINDOW_LAYERS = 28
FULL_CONTEXT = -1  # `sliding_window_size` of a layer that sees every earlier key


class AttentionType(Enum):
    """Which keys after a query it sees (SGLang's names; `RadixAttention.attn_type`)."""

    DECODER = "decoder"  # causal: none (targets; DFlash draft layers that are causal)
    ENCODER_ONLY = "encoder_only"  # bidirectional: all (DFlash draft layers in the block)


@dataclass(frozen=True)
class LayerAttention:
    """Which keys one layer's queries see: RadixAttention's `sliding_window_size` (keys left
    of the query, FULL_CONTEXT for all) and `attn_type` (causal or not)."""

    sliding_window_size: int = FULL_CONTEXT
    attn_type: AttentionType = AttentionType.DECODER

    @classmethod
    def sliding(cls, window: int, attn_type: AttentionType = AttentionType.DECODER
                ) -> LayerAttention:
        """HF's `sliding_window` W: the query and the W - 1 keys before it."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"sliding_window must be a positive integer, got {window!r}")
        return cls(window - 1, attn_type)


def check_decoder_config(config: SimpleNamespace) -> None:
    """ValueError naming the first field whose value this runtime cannot honour."""
    act = getattr(config, "hidden_act", None) or "silu"
    if act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported (only {SUPPORTED_ACTIVATIONS})")
    if getattr(config, "mlp_bias", False):
        raise ValueError("mlp_bias=true (biases on gate/up/down_proj) is not supported")


def layer_types_of(config: SimpleNamespace) -> list[str] | None:
    """`layer_types` as given (None when absent), one known type per layer."""
    types = getattr(config, "layer_types", None)
    if types is None:
        return None
    num_layers = config.num_hidden_layers
    if isinstance(types, str) or len(types) != num_layers:
        raise ValueError(f"layer_types {types!r} must list one type for each of the "
                         f"{num_layers} layers")
    unknown = sorted({t for t in types if t not in LAYER_TYPES})
    if unknown:
        raise ValueError(f"layer_types {unknown} are not supported (only {list(LAYER_TYPES)})")
    return list(types)


def full_attention_layers(config: SimpleNamespace) -> list[LayerAttention]:
    """transformers' Llama (and our Kimi-K3-style target): causal, no sliding window. Its
    modeling code ignores window fields, so one that asks for a window is refused rather than
    served either way."""
    _check_causal_target(config)
    types = layer_types_of(config) or []
    window = getattr(config, "sliding_window", None)
    use_window = getattr(config, "use_sliding_window", None)
    if SLIDING_ATTENTION in types or use_window or (use_window is None and window is not None):
        raise ValueError(
            f"sliding windows (layer_types {types or None}, sliding_window {window}, "
            f"use_sliding_window {use_window}) are not supported for model_type "
            f"{getattr(config, 'model_type', None)!r}: transformers computes full attention "
            "there (Qwen2 / Qwen3 configs get sliding windows)")
    return [LayerAttention()] * config.num_hidden_layers


def qwen_layer_attention(config: SimpleNamespace) -> list[LayerAttention]:
    """transformers' Qwen2 / Qwen3: `sliding_window` counts only with `use_sliding_window`;
    layers follow `layer_types` when given, else slide from `max_window_layers` on."""
    _check_causal_target(config)
    num_layers = config.num_hidden_layers
    window = None
    if getattr(config, "use_sliding_window", False):
        window = getattr(config, "sliding_window", QWEN_DEFAULT_SLIDING_WINDOW)
    types = layer_types_of(config)
    if types is None:
        first = getattr(config, "max_window_layers", QWEN_DEFAULT_MAX_WINDOW_LAYERS)
        types = [SLIDING_ATTENTION if window is not None and i >= first else FULL_ATTENTION
                 for i in range(num_layers)]
    if SLIDING_ATTENTION in types and window is None:
        raise ValueError(
            f"layer_types has {SLIDING_ATTENTION} layers but no window: use_sliding_window "
            f"{getattr(config, 'use_sliding_window', None)}, sliding_window "
            f"{getattr(config, 'sliding_window', None)} (transformers cannot run it either)")
    return [LayerAttention.sliding(window) if t == SLIDING_ATTENTION else LayerAttention()
            for t in types]


def _check_causal_target(config: SimpleNamespace) -> None:
    if getattr(config, "is_causal", True) is not True:
        raise ValueError(f"is_causal {config.is_causal!r}: a bidirectional target is not "
                         "supported (causal decoders only)")

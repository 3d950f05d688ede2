"""Fields of a Llama-family `config.json` that change what the decoder computes, refused when
the runtime does not compute them (silently ignoring one would serve a different model).

What the decoder does implement is read where it is used: RoPE in `layers/rope_scaling.py`,
`head_dim` and `attention_bias` (q/k/v and o_proj biases, as HF Llama and Qwen3 define it) in
the attention constructor.
"""

from __future__ import annotations

from types import SimpleNamespace

FULL_ATTENTION = "full_attention"
SUPPORTED_ACTIVATIONS = ("silu",)


def check_decoder_config(config: SimpleNamespace) -> None:
    """ValueError naming the first field whose value this runtime cannot honour."""
    act = getattr(config, "hidden_act", None) or "silu"
    if act not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"hidden_act {act!r} is not supported (only {SUPPORTED_ACTIVATIONS})")
    if getattr(config, "mlp_bias", False):
        raise ValueError("mlp_bias=true (biases on gate/up/down_proj) is not supported")
    check_full_attention(config)


def check_full_attention(config: SimpleNamespace) -> None:
    """Every layer attends to the whole context: no sliding windows.

    transformers decides per layer from `layer_types` when present; older Qwen-style configs
    switch windows on with `use_sliding_window` (for layers from `max_window_layers` on).
    """
    num_layers = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    if layer_types is not None:
        if len(layer_types) != num_layers:
            raise ValueError(f"layer_types has {len(layer_types)} entries for {num_layers} "
                             "layers")
        other = sorted({t for t in layer_types if t != FULL_ATTENTION})
        if other:
            raise ValueError(f"layer_types {other} (sliding_window {window}) are not supported: "
                             f"every layer must be {FULL_ATTENTION!r}")
        return
    use_window = getattr(config, "use_sliding_window", None)
    first_windowed = getattr(config, "max_window_layers", 0) or 0
    if use_window and window is not None and first_windowed < num_layers:
        raise ValueError(f"use_sliding_window with sliding_window {window} from layer "
                         f"{first_windowed} on is not supported (full attention only)")
    if use_window is None and window is not None:
        raise ValueError(f"sliding_window {window} is not supported (full attention only)")

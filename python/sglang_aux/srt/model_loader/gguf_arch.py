"""What a GGUF architecture (`general.architecture`) becomes in HF terms: the model class,
config.json from its `<arch>.*` metadata keys, tensor names, and llama.cpp's q/k row order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sglang_aux.srt.model_loader.gguf_reader import GGUFImportError, meta


@dataclass(frozen=True)
class GGUFArch:
    hf_architecture: str
    model_type: str
    # llama.cpp's converter interleaves the two RoPE halves of q/k rows per head for
    # architectures it runs with "normal" RoPE (llama); NeoX-RoPE ones (qwen2) keep HF order.
    permuted_qk: bool
    extra_config: dict  # HF config keys the architecture fixes
    # Tokens that also end generation besides the file's EOS (config.json then lists them):
    # Qwen2.5's own generation_config.json stops at <|endoftext|> as well as <|im_end|>.
    extra_eos: tuple[str, ...] = ()


ARCHS = {
    "llama": GGUFArch("LlamaForCausalLM", "llama", permuted_qk=True,
                      extra_config={"attention_bias": False}),
    # Qwen2 always has q/k/v biases (the tensors say so); llama.cpp runs it without windows.
    "qwen2": GGUFArch("Qwen2ForCausalLM", "qwen2", permuted_qk=False,
                      extra_config={"use_sliding_window": False, "sliding_window": None},
                      extra_eos=("<|endoftext|>",)),
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def arch_of(reader) -> tuple[str, GGUFArch]:
    name = meta(reader, "general.architecture")
    if name not in ARCHS:
        raise GGUFImportError(f"GGUF architecture {name!r} is not supported; this importer "
                              f"reads {', '.join(repr(a) for a in ARCHS)} models")
    return name, ARCHS[name]


def hf_config(reader, dtype: torch.dtype) -> dict:
    """config.json for the file's `<arch>.*` and `tokenizer.ggml.*` metadata."""
    name, arch = arch_of(reader)

    def key(suffix: str, *default):
        return meta(reader, f"{name}.{suffix}", *default)

    tokens = meta(reader, "tokenizer.ggml.tokens")
    heads = key("attention.head_count")
    hidden = key("embedding_length")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    eos = meta(reader, "tokenizer.ggml.eos_token_id", None)
    extra_eos = [tokens.index(t) for t in arch.extra_eos if t in tokens]
    eos_ids = [i for i in dict.fromkeys([eos, *extra_eos]) if i is not None]
    # float32 metadata: the shortest decimal that reads back as the same float32 (1e-05)
    eps = float(str(np.float32(key("attention.layer_norm_rms_epsilon"))))
    return {
        "architectures": [arch.hf_architecture],
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": key("rope.dimension_count", hidden // heads),
        "vocab_size": key("vocab_size", len(tokens)),
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": eps,
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        **arch.extra_config,
        "tie_word_embeddings": not has_output,
        "bos_token_id": meta(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else (eos_ids or None),
        "pad_token_id": meta(reader, "tokenizer.ggml.padding_token_id", None),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head it interleaves the two RoPE halves
    (rows 0, D/2, 1, D/2+1, ...); HF and our RotaryEmbedding keep them as two halves.
    `w` is a weight `[out, in]` or a bias `[out]`."""
    rows = w.reshape(w.shape[0], -1)
    d = rows.shape[0] // num_heads
    return rows.reshape(num_heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def hf_tensor_name(name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`, etc."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise GGUFImportError(f"GGUF tensor {name!r} has no place in a Llama-family model")

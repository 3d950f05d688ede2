"""Import a Llama-family GGUF file (`llama`, `qwen2`) into an HF-format folder that our loader
and transformers both read.

Weights are dequantized with the `gguf` package (plain floats, legacy and K-quants), renamed to
HF names (gguf_arch.py) and written as one safetensors file; `config.json` comes from the
architecture's metadata keys, the tokenizer (byte-level BPE, chat template, special ids) from
`tokenizer.ggml.*` (gguf_tokenizer.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from sglang_aux.srt.model_loader.gguf_arch import (
    arch_of,
    hf_config,
    hf_tensor_name,
    unpermute_rope_rows,
)
from sglang_aux.srt.model_loader.gguf_reader import GGUFImportError, open_gguf
from sglang_aux.srt.model_loader.gguf_tokenizer import build_tokenizer
from sglang_aux.srt.model_loader.model_cache import write_folder

# Types accepted: plain floats and the `gguf` package's llama.cpp quant dequantizers (numpy).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def check_supported(reader) -> None:
    """GGUFImportError unless the file is a supported architecture in types we dequantize."""
    arch_of(reader)
    bad = sorted({f"{t.name} ({t.tensor_type.name})" for t in reader.tensors
                  if t.tensor_type.name not in SUPPORTED_TYPES})
    if bad:
        more = " ..." if len(bad) > 3 else ""
        raise GGUFImportError(
            f"unsupported GGUF quantization type in {', '.join(bad[:3])}{more}; "
            f"supported: {', '.join(SUPPORTED_TYPES)}"
        )


def read_weights(reader, config: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor dequantized, under its HF name, q/k rows in HF order."""
    from gguf.quants import dequantize

    _, arch = arch_of(reader)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest dim first
        # a copy: the reader's arrays are read-only views of the memory-mapped file
        w = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32))
        w = w.reshape(shape)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if arch.permuted_qk and kind in heads:
            w = unpermute_rope_rows(w, heads[kind])
        out[hf_tensor_name(t.name)] = w.to(dtype).contiguous()
    return out


def import_gguf(gguf_path: str | Path, out_dir: str | Path,
                dtype: torch.dtype = torch.bfloat16, *, keep_existing: bool = False) -> Path:
    """Write `out_dir` (config.json, model.safetensors, tokenizer.json, tokenizer_config.json)
    from a GGUF file, atomically (`model_cache.write_folder`: an `out_dir` that holds files is
    kept with `keep_existing`, else an error); returns the folder."""
    reader = open_gguf(Path(gguf_path))
    check_supported(reader)
    config = hf_config(reader, dtype)
    tokenizer, tok_config = build_tokenizer(reader)
    weights = read_weights(reader, config, dtype)
    rows = weights["model.embed_tokens.weight"].shape[0]
    if rows != config["vocab_size"]:
        raise GGUFImportError(
            f"the embedding has {rows} rows but the metadata says vocab {config['vocab_size']}"
        )

    def write(tmp: Path) -> None:
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    return write_folder(Path(out_dir), write, keep_existing=keep_existing)

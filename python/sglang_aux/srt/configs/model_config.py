"""A checkpoint's `config.json`, read once, with the fields the runtime derives from it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose from {', '.join(_DTYPES)}")
    return _DTYPES[name]


@dataclass(frozen=True)
class ModelConfig:
    model_path: str
    hf_config: SimpleNamespace  # every key of config.json, as attributes
    architecture: str
    dtype: torch.dtype
    context_len: int

    @classmethod
    def from_pretrained(cls, model_path: str | Path, dtype: str = "auto",
                        context_length: int | None = None) -> ModelConfig:
        path = Path(model_path)
        config_file = path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{model_path} is not a model folder: no config.json")
        return cls.from_dict(json.loads(config_file.read_text()), str(path), dtype, context_length)

    @classmethod
    def from_dict(cls, raw: dict, model_path: str, dtype: str = "auto",
                  context_length: int | None = None) -> ModelConfig:
        """From config.json contents (a preset, or a folder's file)."""
        archs = raw.get("architectures") or []
        if len(archs) != 1:
            raise ValueError(f"{model_path}: expected one entry in 'architectures', got {archs}")
        # transformers 5.x writes `dtype`, older versions `torch_dtype`
        saved = raw.get("dtype") or raw.get("torch_dtype") or "float32"
        torch_dtype = parse_dtype(saved if dtype == "auto" else dtype)
        max_pos = raw.get("max_position_embeddings", 2048)
        return cls(
            model_path=model_path,
            hf_config=SimpleNamespace(**raw),
            architecture=archs[0],
            dtype=torch_dtype,
            context_len=min(context_length or max_pos, max_pos),
        )

    @property
    def logits_width(self) -> int:
        """Columns of the model's logits: its vocabulary, or a draft vocabulary's size
        (`hot_vocab_size`, SGLang's override for a draft cut by `--speculative-token-map`)."""
        return getattr(self.hf_config, "hot_vocab_size", None) or self.hf_config.vocab_size

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.hf_config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        c = self.hf_config
        return getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads

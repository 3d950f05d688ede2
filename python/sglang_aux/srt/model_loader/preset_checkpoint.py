"""HF-format model folders written from presets: random init with a fixed seed (what a
built-in preset name resolves to; `python -m sglang_aux.tools.make_checkpoint` writes one)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.model_loader.model_cache import write_folder
from sglang_aux.srt.model_loader.tokenizer import BYTE_TOKENIZER_CONFIG, byte_level_tokenizer
from sglang_aux.srt.models.registry import get_model_class
from sglang_aux.srt.models.weight_utils import checkpoint_tensors, init_random_weights


def write_checkpoint(preset: str, out: str | Path, seed: int = 0, *,
                     keep_existing: bool = False) -> Path:
    """The folder `out`, written atomically (`model_cache.write_folder`: an `out` that holds
    files is kept with `keep_existing`, else an error)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    config = dict(PRESETS[preset])

    def write(tmp: Path) -> None:
        model = get_model_class(config["architectures"][0])(SimpleNamespace(**config))
        init_random_weights(model, seed)
        dtype = getattr(torch, config["torch_dtype"])
        tensors = {k: v.to(dtype).contiguous() for k, v in checkpoint_tensors(model).items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        byte_level_tokenizer().save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(BYTE_TOKENIZER_CONFIG, indent=2) + "\n")

    return write_folder(Path(out), write, keep_existing=keep_existing)

"""Architecture name (config.json `architectures[0]`) to model class."""

from __future__ import annotations

import importlib

from torch import nn

_MODELS = {
    "LlamaForCausalLM": "sglang_aux.srt.models.llama",
    "Qwen2ForCausalLM": "sglang_aux.srt.models.qwen2",
    "Qwen3ForCausalLM": "sglang_aux.srt.models.qwen3",
    "KimiK3ForCausalLM": "sglang_aux.srt.models.kimi_k3",
    "DFlashDraftModel": "sglang_aux.srt.models.dflash",
    "DSparkDraftModel": "sglang_aux.srt.models.dspark",
    "Qwen3DSparkModel": "sglang_aux.srt.models.dspark",
}


def get_model_class(architecture: str) -> type[nn.Module]:
    if architecture not in _MODELS:
        raise ValueError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(_MODELS))}"
        )
    return getattr(importlib.import_module(_MODELS[architecture]), architecture)

"""Building a model from its config and loading its safetensors weights."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.models.registry import get_model_class
from sglang_aux.srt.models.weight_utils import (
    init_random_weights,
    safetensors_weights_iterator,
)


def get_model(model_config: ModelConfig, device: torch.device | str,
              load_format: str = "auto", seed: int = 0) -> nn.Module:
    """The model with its checkpoint weights, or random ones with `load_format="dummy"`
    (SGLang's name), seeded by the caller."""
    cls = get_model_class(model_config.architecture)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(model_config.dtype)
    try:
        with torch.device(device):
            model = cls(model_config.hf_config)
    finally:
        torch.set_default_dtype(default_dtype)
    if load_format == "dummy":
        init_random_weights(model, seed)
    else:
        model.load_weights(safetensors_weights_iterator(model_config.model_path))
    return model.eval()

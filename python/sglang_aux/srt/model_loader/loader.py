"""Building a model from its config and loading its safetensors weights."""

from __future__ import annotations

import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.model_loader.weight_utils import safetensors_weights_iterator
from sglang_aux.srt.models.registry import get_model_class


def get_model(model_config: ModelConfig, device: torch.device | str, pp_size: int = 1) -> nn.Module:
    cls = get_model_class(model_config.architecture)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(model_config.dtype)
    try:
        with torch.device(device):
            model = cls(model_config.hf_config, pp_size=pp_size)
    finally:
        torch.set_default_dtype(default_dtype)
    model.load_weights(safetensors_weights_iterator(model_config.model_path))
    return model.eval()

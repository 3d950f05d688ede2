"""Reading safetensors checkpoints into modules, with errors that name the mismatch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


def safetensors_weights_iterator(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_named_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       skip: set[str] | frozenset[str] = frozenset()) -> None:
    """Copy checkpoint tensors into `module`'s parameters by name.

    Raises ValueError for a tensor whose shape differs from its parameter, a checkpoint name
    the module does not have, or a parameter the checkpoint lacks.
    """
    params = dict(module.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if name in skip:
            continue
        if name not in params:
            raise ValueError(
                f"checkpoint tensor {name!r} has no parameter in {type(module).__name__}"
            )
        param = params[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(param.shape)} (does config.json match the weights?)"
            )
        with torch.no_grad():
            param.copy_(tensor.to(param.dtype))
        loaded.add(name)
    missing = sorted(set(params) - loaded - set(skip))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint lacks {len(missing)} tensors the model needs: {shown}")


RANDOM_INIT_GAIN = 2.0


def init_random_weights(model: nn.Module, seed: int = 0, gain: float = RANDOM_INIT_GAIN) -> None:
    """Seeded random weights, the same on every device: matrices ~ N(0, gain^2 / fan_in),
    embeddings ~ N(0, 1), constructor-randomized vectors (pseudo-queries) ~ N(0, 1 / n);
    constant vectors (norm weights, biases) keep their value.

    A gain above one lets every layer move the residual stream: with PyTorch's default init a
    random tiny model mostly repeats its input token, which makes a weak test subject.
    Each tensor draws from its own generator (never the global one): reseeding the global CUDA
    generator after CUDA graphs were captured breaks later random ops in the process.
    """
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            gen = torch.Generator(device=p.device).manual_seed(seed * 100_003 + i)
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, gain / p.shape[1] ** 0.5, generator=gen)
            elif p.dim() == 2:
                p.normal_(0.0, 1.0, generator=gen)
            elif p.numel() > 1 and not torch.all(p == p.view(-1)[0]):
                p.normal_(0.0, p.numel() ** -0.5, generator=gen)

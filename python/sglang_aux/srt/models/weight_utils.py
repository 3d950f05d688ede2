"""Reading safetensors checkpoints into modules, with errors that name the mismatch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from sglang_aux.srt.layers.linear import MergedColumnLinear


def safetensors_weights_iterator(model_dir: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {model_dir}")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def checkpoint_targets(module: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint tensor name -> the tensor it loads into: each parameter under its own name,
    except that a merged projection (`qkv_proj`, `gate_up_proj`) is addressed shard by shard
    under the checkpoint's names (`q_proj`, `k_proj`, ...), as writable views of its rows.

    This is SGLang's stacked-params mapping, read off the merged modules themselves so the
    shard names and order have one definition (`MergedColumnLinear.shard_sizes`).
    """
    return {name: t for name, (t, _) in _targets(module).items()}


Cut = tuple[int, int, int]  # (dim, this rank's start along it, the checkpoint's size there)


def _targets(module: nn.Module) -> dict[str, tuple[torch.Tensor, Cut | None]]:
    """`checkpoint_targets` with where each target's piece of the checkpoint tensor lies
    under tensor parallelism (`tp_slice`), None for the whole tensor."""
    merged = {name: m for name, m in module.named_modules() if isinstance(m, MergedColumnLinear)}
    targets: dict[str, tuple[torch.Tensor, Cut | None]] = {}
    for name, param in module.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if owner not in merged:
            targets[name] = param, getattr(param, "tp_slice", None)
            continue
        parent = owner.rpartition(".")[0]
        m = merged[owner]
        for shard in m.shard_sizes:
            targets[f"{parent}.{shard}.{leaf}" if parent else f"{shard}.{leaf}"] = (
                m.shard_param(shard, leaf), (0, *m.shard_slices[shard]))
    return targets


def checkpoint_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights under checkpoint (HF) names, detached: what `load_named_weights`
    reads back."""
    return {name: t.detach() for name, t in checkpoint_targets(module).items()}


def load_named_weights(module: nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       skip: set[str] | frozenset[str] = frozenset()) -> None:
    """Copy checkpoint tensors into `module`'s parameters by name (merged projections shard by
    shard, see `checkpoint_targets`).

    Under tensor parallelism each target takes this rank's piece of the checkpoint tensor.
    Raises ValueError for a tensor whose shape differs from its target, a checkpoint name
    the module does not have, or a tensor (or merged-projection shard) the checkpoint lacks.
    """
    targets = _targets(module)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name in skip:
            continue
        if name not in targets:
            raise ValueError(
                f"checkpoint tensor {name!r} has no parameter in {type(module).__name__}"
            )
        target, cut = targets[name]
        if cut is not None and tensor.dim() == target.dim() and tensor.shape[cut[0]] == cut[2]:
            tensor = tensor.narrow(cut[0], cut[1], target.shape[cut[0]])
        if tuple(tensor.shape) != tuple(target.shape):
            raise ValueError(
                f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, the model expects "
                f"{tuple(target.shape)} (does config.json match the weights?)"
            )
        with torch.no_grad():
            target.copy_(tensor.to(target.dtype))
        loaded.add(name)
    missing = sorted(set(targets) - loaded - set(skip))
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

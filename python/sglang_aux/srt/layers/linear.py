"""Linear layers split over the TP group (SGLang's `linear.py`).

`MergedColumnLinear`: one GEMM for several projections of the same input (SGLang's
`QKVParallelLinear` and `MergedColumnParallelLinear`). The weight `[sum(out_i), in]` stacks
this rank's rows of each shard's checkpoint weight row-wise in shard order (and the bias
likewise); the checkpoint keeps the shards under their own names, which
`weight_utils.checkpoint_targets` translates from, cutting each rank's rows at its offset.
Its output stays split (column-parallel): the row-parallel layer after it reduces.

`RowParallelLinear`: the weight's input columns split over ranks; each rank multiplies its
slice of the input and the partial products are summed over ranks (all-reduce), the bias added
once after.

A parameter cut from a larger checkpoint tensor carries `tp_slice = (dim, start, full)`: the
dimension, this rank's first index along it and the checkpoint's size there.

Both run a one-token forward through the decode GEMV kernel when `gemv_backend` is `triton`
(`decode_gemv.py`; the runner sets it from the server flag).
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch
from torch import nn
from torch.nn import functional as F

from sglang_aux.srt.distributed.communication_op import tensor_model_parallel_all_reduce
from sglang_aux.srt.distributed.parallel_state import (
    divide,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
)
from sglang_aux.srt.layers.decode_gemv import gemv_linear, use_gemv


def _linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + bias` of `layer`'s weight: the decode GEMV kernel or cuBLAS / the CPU GEMM."""
    if use_gemv(layer, x):
        return gemv_linear(layer, x, bias)
    return F.linear(x, layer.weight, bias)


class MergedColumnLinear(nn.Module):
    gemv_backend = "torch"

    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False,
                 shard_slices: dict[str, tuple[int, int]] | None = None):
        """`shard_sizes`: checkpoint shard name -> the rows this rank holds, in order;
        `shard_slices`: shard name -> (the checkpoint row its piece starts at, the
        checkpoint's rows), for shards cut from a larger checkpoint tensor."""
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = dict(shard_sizes)
        self.shard_slices = {name: (shard_slices or {}).get(name, (0, size))
                             for name, size in shard_sizes.items()}
        self.output_sizes = list(self.shard_sizes.values())
        ends = list(accumulate(self.output_sizes))
        self._rows = {name: slice(end - size, end)
                      for (name, size), end in zip(self.shard_sizes.items(), ends, strict=True)}
        out = ends[-1]
        self.weight = nn.Parameter(torch.empty(out, in_features))
        self.bias = nn.Parameter(torch.empty(out)) if bias else None
        # nn.Linear's default init, shard by shard alike (fan_in is the shared input width).
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(in_features)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(self, x, self.bias)

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The merged output `[T, sum(out_i)]` as per-shard views `[T, out_i]`."""
        return out.split(self.output_sizes, dim=-1)

    def shard_param(self, shard: str, param_name: str) -> torch.Tensor:
        """The rows of `weight` or `bias` that hold `shard` (a view, writable)."""
        return getattr(self, param_name)[self._rows[shard]]

    def shards(self) -> dict[tuple[str, str], torch.Tensor]:
        """`(shard, "weight" | "bias")` -> that shard's rows, for writing checkpoints."""
        names = ["weight"] + (["bias"] if self.bias is not None else [])
        return {(s, p): self.shard_param(s, p) for s in self.shard_sizes for p in names}


def column_shards(sizes: dict[str, int]) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """(rows per rank, `shard_slices`) of shards whose rows split evenly over ranks."""
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    local = {name: divide(size, tp, f"{name} rows") for name, size in sizes.items()}
    return local, {name: (rank * n, sizes[name]) for name, n in local.items()}


class RowParallelLinear(nn.Linear):
    """`y = x W^T + b` with W's input columns split over ranks; `x` arrives split the same
    way (a column-parallel output). `reduce_results=False` leaves the partial sum for a caller
    that adds several before one all-reduce (the MoE)."""

    gemv_backend = "torch"

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 reduce_results: bool = True):
        tp = get_tensor_model_parallel_world_size()
        local = divide(in_features, tp, "a row-parallel layer's input width")
        super().__init__(local, out_features, bias=bias)
        self.reduce_results = reduce_results
        self.weight.tp_slice = (1, get_tensor_model_parallel_rank() * local, in_features)
        self.tp_size = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return _linear(self, x, self.bias)
        if not self.reduce_results and self.bias is not None:
            raise ValueError("a row-parallel bias needs the reduced output (reduce_results)")
        out = _linear(self, x, None)
        if self.reduce_results:
            out = tensor_model_parallel_all_reduce(out)
        return out if self.bias is None else out + self.bias

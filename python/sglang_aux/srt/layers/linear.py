"""One GEMM for several projections of the same input (SGLang's `QKVParallelLinear` and
`MergedColumnParallelLinear`, single-rank).

The weight `[sum(out_i), in]` stacks the shards' checkpoint weights `[out_i, in]` row-wise in
shard order (and the bias likewise); the checkpoint keeps the shards under their own names,
which `load_shard` / `shards` translate from and to.
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch
from torch import nn
from torch.nn import functional as F


class MergedColumnLinear(nn.Module):
    def __init__(self, in_features: int, shard_sizes: dict[str, int], bias: bool = False):
        super().__init__()
        self.in_features = in_features
        self.shard_sizes = dict(shard_sizes)  # checkpoint shard name -> output rows, in order
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
        return F.linear(x, self.weight, self.bias)

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

"""Weights pulled into the L2 cache while a one-token decode step's memory bus would idle.

A bs-1 decode layer streams about 94 MB of Qwen2.5-1.5B weights through its projections,
but between qkv and o_proj its attention and merge read 1 MB of K/V in ~6 us: latency, not
bytes. The projections read next (o_proj, then the first rows of gate | up) can be on their
way into the L2 (50 MB on an H100) meanwhile, so that part of the layer's weight reads lands
in a window the bus otherwise wastes.

The qkv kernel (`paired_row_gemv.row_gemv_rope_store`) issues the prefetches once its own
loads are done: each program asks for its share of the `L2Prefetch` regions' 128-byte lines
(`prefetch.global.L2`: no register written, nothing waited on), and the attention launch
after it starts while they are in flight. Prefetches change no value: results are bitwise the
same with or without them.

`SGLANG_AUX_L2_PREFETCH` is the budget in MiB (0: none, the default until a device run shows
a gain); the decoder layer plans what to fetch within it (`plan_l2_prefetch`). Compiled
Triton on CUDA only: the interpreter and other back ends have no PTX.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import L2_PREFETCH_ENV_VAR, switch

LINE_BYTES = 128  # an L2 line: what one `prefetch.global.L2` asks for
MAX_REGIONS = 3


@dataclass(frozen=True)
class L2Region:
    """The first `lines` 128-byte lines from `start`'s first element."""

    start: torch.Tensor
    lines: int


@dataclass(frozen=True)
class L2Prefetch:
    """At most `MAX_REGIONS` regions of weights, fetched in order."""

    regions: tuple[L2Region, ...]

    def __post_init__(self):
        if not 0 < len(self.regions) <= MAX_REGIONS:
            raise ValueError(f"an L2 prefetch takes 1 to {MAX_REGIONS} regions, got "
                             f"{len(self.regions)}")
        dtypes = {r.start.dtype for r in self.regions}
        if len(dtypes) != 1:
            raise ValueError(f"the regions of one prefetch share a dtype, got "
                             f"{sorted(map(str, dtypes))}")

    @property
    def lines(self) -> int:
        return sum(r.lines for r in self.regions)

    def launch_args(self, programs: int) -> tuple[list, int]:
        """(the kernel's six region arguments, lines a program asks for: a power of 2 so
        `programs` of them cover every line)."""
        regions = list(self.regions) + [L2Region(self.regions[0].start, 0)] * (
            MAX_REGIONS - len(self.regions))
        args = [a for r in regions for a in (r.start, r.lines)]
        return args, triton.next_power_of_2(triton.cdiv(self.lines, programs))


def budget_bytes() -> int:
    """`SGLANG_AUX_L2_PREFETCH` in bytes (read at every call, so a bench may set it per
    process)."""
    return int(switch(L2_PREFETCH_ENV_VAR)) << 20


def can_prefetch(x: torch.Tensor) -> bool:
    """Whether kernels fed with `x` run compiled on an NVIDIA device (PTX)."""
    return (x.is_cuda and torch.version.hip is None
            and os.environ.get("TRITON_INTERPRET") != "1")


def _lines(t: torch.Tensor, rows: int) -> int:
    """Lines holding the first `rows` rows of the contiguous `t` (the last one partial)."""
    return triton.cdiv(rows * t.stride(0) * t.element_size(), LINE_BYTES)


def plan_l2_prefetch(budget: int, first: torch.Tensor, paired: torch.Tensor
                     ) -> L2Prefetch | None:
    """What to fetch with `budget` bytes: `first` `[N, K]` from its first row (read first,
    all of it if it fits), then what is left split between the first rows of the two halves
    of `paired` `[2 I, K]` (gate | up: the paired GEMV's programs read row c with row c + I).
    None for a budget under one line, weights not contiguous or of another dtype."""
    if budget < LINE_BYTES or not first.is_contiguous() or not paired.is_contiguous() \
            or first.dim() != 2 or paired.dim() != 2 or paired.shape[0] % 2 \
            or first.dtype != paired.dtype:
        return None
    row_bytes = first.stride(0) * first.element_size()
    first_rows = min(first.shape[0], budget // row_bytes)
    regions = [L2Region(first, _lines(first, first_rows))] if first_rows else []
    half = paired.shape[0] // 2
    left = budget - first_rows * row_bytes
    pair_rows = min(half, left // (2 * paired.stride(0) * paired.element_size()))
    if pair_rows:
        lines = _lines(paired, pair_rows)
        regions += [L2Region(paired, lines), L2Region(paired[half:], lines)]
    return L2Prefetch(tuple(regions)) if regions else None


@triton.jit
def _prefetch_line(ptr):
    """Ask the L2 for the line holding `ptr` (each element of a tensor of pointers)."""
    return tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                     [ptr], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_l2(P0, n0, P1, n1, P2, n2, pid, LINES: tl.constexpr):
    """Program `pid`'s share of the regions' lines: `LINES` of them from line `pid * LINES`
    of the three regions laid end to end (`L2Prefetch.launch_args`)."""
    LINE_ELEMS: tl.constexpr = 128 // P0.dtype.element_ty.primitive_bitwidth * 8
    i = (pid * LINES + tl.arange(0, LINES)).to(tl.int64)
    in0 = i < n0
    in1 = (i >= n0) & (i < n0 + n1)
    ptr = tl.where(in0, P0 + i * LINE_ELEMS,
                   tl.where(in1, P1 + (i - n0) * LINE_ELEMS, P2 + (i - n0 - n1) * LINE_ELEMS))
    live = i < n0 + n1 + n2
    _prefetch_line(tl.where(live, ptr, P0))

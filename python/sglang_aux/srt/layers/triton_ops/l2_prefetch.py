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
a gain); the decoder layer plans what to fetch within it (`plan_l2_prefetch`), asked line by
line or, with `SGLANG_AUX_L2_PREFETCH_BULK=1`, 16 KiB a request through sm_90's bulk copy
unit (fewer requests for the SMs to issue). Compiled Triton on CUDA only: the interpreter and
other back ends have no PTX.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import (
    L2_PREFETCH_BULK_ENV_VAR,
    L2_PREFETCH_ENV_VAR,
    switch,
)

LINE_BYTES = 128  # an L2 line: what one `prefetch.global.L2` asks for
BULK_BYTES = 16384  # what one `cp.async.bulk.prefetch.L2` asks for (sm_90's bulk copy unit)
MAX_REGIONS = 3


@dataclass(frozen=True)
class L2Region:
    """The first `nbytes` bytes from `start`'s first element (a multiple of 16)."""

    start: torch.Tensor
    nbytes: int


@dataclass(frozen=True)
class L2Prefetch:
    """At most `MAX_REGIONS` regions of weights of one dtype, fetched in order, `unit` bytes a
    request: `LINE_BYTES` (one `prefetch.global.L2` a line, any CUDA device) or `BULK_BYTES`
    (one `cp.async.bulk.prefetch.L2` a unit, sm_90+)."""

    regions: tuple[L2Region, ...]
    unit: int = LINE_BYTES

    def __post_init__(self):
        if not 0 < len(self.regions) <= MAX_REGIONS:
            raise ValueError(f"an L2 prefetch takes 1 to {MAX_REGIONS} regions, got "
                             f"{len(self.regions)}")
        dtypes = {r.start.dtype for r in self.regions}
        if len(dtypes) != 1:
            raise ValueError(f"the regions of one prefetch share a dtype, got "
                             f"{sorted(map(str, dtypes))}")
        if self.unit not in (LINE_BYTES, BULK_BYTES):
            raise ValueError(f"an L2 prefetch's unit is {LINE_BYTES} or {BULK_BYTES} bytes, "
                             f"got {self.unit}")
        if any(r.nbytes % 16 or r.nbytes <= 0 for r in self.regions):
            raise ValueError(f"region sizes must be positive multiples of 16 bytes, got "
                             f"{[r.nbytes for r in self.regions]}")

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.regions)

    @property
    def requests(self) -> int:
        return sum(triton.cdiv(r.nbytes, self.unit) for r in self.regions)

    def launch_args(self, programs: int, threads: int) -> tuple[list, int, int]:
        """(the kernel's six region arguments, requests a program issues, the power-of-2
        tile they are issued from: at least one lane for each of a program's `threads`, so
        that no lane repeats another's request)."""
        regions = list(self.regions) + [L2Region(self.regions[0].start, 0)] * (
            MAX_REGIONS - len(self.regions))
        args = [a for r in regions for a in (r.start, r.nbytes)]
        share = triton.cdiv(self.requests, programs)
        return args, share, triton.next_power_of_2(max(share, threads))


def budget_bytes() -> int:
    """`SGLANG_AUX_L2_PREFETCH` in bytes (read at every call, so a bench may set it per
    process)."""
    return int(switch(L2_PREFETCH_ENV_VAR)) << 20


def request_unit(x: torch.Tensor) -> int:
    """`SGLANG_AUX_L2_PREFETCH_BULK`: 1 asks in bulk units (a ValueError on a CUDA device
    older than sm_90, which has no bulk copy unit), 0 (the default) line by line."""
    if switch(L2_PREFETCH_BULK_ENV_VAR) == "0":
        return LINE_BYTES
    if x.is_cuda and torch.cuda.get_device_capability(x.device) < (9, 0):
        raise ValueError(f"{L2_PREFETCH_BULK_ENV_VAR}=1 needs a CUDA device of compute "
                         f"capability >= 9.0, got {torch.cuda.get_device_capability(x.device)}")
    return BULK_BYTES


def can_prefetch(x: torch.Tensor) -> bool:
    """Whether kernels fed with `x` run compiled on an NVIDIA device (PTX)."""
    return (x.is_cuda and torch.version.hip is None
            and os.environ.get("TRITON_INTERPRET") != "1")


def plan_l2_prefetch(budget: int, first: torch.Tensor, paired: torch.Tensor,
                     unit: int = LINE_BYTES) -> L2Prefetch | None:
    """What to fetch with `budget` bytes: `first` `[N, K]` from its first row (read first,
    all of it if it fits), then what is left split between the first rows of the two halves
    of `paired` `[2 I, K]` (gate | up: the paired GEMV's programs read row c with row c + I);
    whole rows only. None for a budget under a row, weights not contiguous, of two dtypes or
    rows not a multiple of 16 bytes."""
    if not first.is_contiguous() or not paired.is_contiguous() or first.dim() != 2 \
            or paired.dim() != 2 or paired.shape[0] % 2 or first.dtype != paired.dtype:
        return None
    first_row = first.stride(0) * first.element_size()
    pair_row = paired.stride(0) * paired.element_size()
    if first_row % 16 or pair_row % 16:
        return None
    first_rows = min(first.shape[0], budget // first_row)
    regions = [L2Region(first, first_rows * first_row)] if first_rows else []
    half = paired.shape[0] // 2
    pair_rows = min(half, (budget - first_rows * first_row) // (2 * pair_row))
    if pair_rows:
        regions += [L2Region(paired, pair_rows * pair_row),
                    L2Region(paired[half:], pair_rows * pair_row)]
    return L2Prefetch(tuple(regions), unit) if regions else None


@triton.jit
def _ask(ptr, size, UNIT: tl.constexpr):
    """One request of `size` bytes from `ptr` where size > 0 (each element of the tensors)."""
    if UNIT == 128:
        asm: tl.constexpr = ("{ .reg .pred p; setp.gt.s32 p, $2, 0; "
                             "@p prefetch.global.L2 [$1]; mov.u32 $0, 0; }")
    else:
        asm: tl.constexpr = ("{ .reg .pred p; setp.gt.s32 p, $2, 0; "
                             "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }")
    return tl.inline_asm_elementwise(asm, "=r,l,r", [ptr, size], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def prefetch_l2(P0, b0, P1, b1, P2, b2, pid, SHARE: tl.constexpr, TILE: tl.constexpr,
                UNIT: tl.constexpr):
    """Program `pid`'s share of the regions' requests: `SHARE` of them from request
    `pid * SHARE` of the three regions (b bytes each) laid end to end, issued from a tile of
    `TILE` lanes (`L2Prefetch.launch_args`), `UNIT` bytes each (the last of a region what is
    left)."""
    ELEMS: tl.constexpr = UNIT * 8 // P0.dtype.element_ty.primitive_bitwidth
    n0 = tl.cdiv(b0, UNIT)
    n1 = tl.cdiv(b1, UNIT)
    j = tl.arange(0, TILE)
    i = pid.to(tl.int64) * SHARE + j
    in0 = i < n0
    in1 = (i >= n0) & (i < n0 + n1)
    u = tl.where(in0, i, tl.where(in1, i - n0, i - n0 - n1))
    ptr = tl.where(in0, P0 + u * ELEMS, tl.where(in1, P1 + u * ELEMS, P2 + u * ELEMS))
    left = tl.where(in0, b0, tl.where(in1, b1, b2)) - u * UNIT
    _ask(ptr, tl.where(j < SHARE, tl.minimum(left, UNIT), 0).to(tl.int32), UNIT)

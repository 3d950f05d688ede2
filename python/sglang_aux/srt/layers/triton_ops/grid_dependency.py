"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start
while the kernel before it on the stream is still running, and waits for that kernel's writes
only where it calls `wait_for_previous_kernel`.

The default where the device has it (compiled Triton on CUDA sm_90+) for one-token launches:
the kernels that take `pdl` (the row GEMVs, RMSNorm, RoPE + KV store, SiLU-mul) launch
dependent at one token, measured on the H200 to take the Qwen2.5-1.5B-shaped bs-1 decode
replay from 1.365 to 1.295 ms; launched so between cuBLAS GEMMs of more rows, the
elementwise kernels cost the bs-8 and bs-32 decode 1.7% and 1.3% (docs/kernels.md), so those
stay plain. `SGLANG_AUX_PDL=0` turns it off (`1`: on, `auto`: the default);
`bench_graph_replay.py --pdl on|off` sets it for its process. Every kernel launched so must
call the wait before it reads or writes anything an earlier kernel touches: the row GEMV loads
its first weight tile (never written by a kernel) before it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import PDL_ENV_VAR as ENV_VAR
from sglang_aux.srt.layers.triton_ops.dispatch import switch

# griddepcontrol needs sm_90
MIN_CAPABILITY = (9, 0)


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL, block until the previous kernel has finished and its writes are visible, then
    let the next kernel launch: its programs take SM slots only as this kernel's free."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def _capable(x: torch.Tensor) -> bool:
    return (x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
            and _capability(x.device.index) >= MIN_CAPABILITY)


@functools.lru_cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def resolve_pdl(pdl: bool | None, x: torch.Tensor) -> bool:
    """The launch's PDL setting: `pdl`, or `SGLANG_AUX_PDL` when None (`auto`, the default: on
    for a one-token launch, `x` `[1, ...]` the kernel's token-major input, where the device has
    it; `0`; `1`). PDL needs compiled Triton on a CUDA device of compute capability 9.0 or more
    (Triton's interpreter has no griddepcontrol)."""
    if pdl is None:
        value = switch(ENV_VAR)
        if value == "auto":
            return x.shape[0] == 1 and _capable(x)
        pdl = value == "1"
    if pdl and not _capable(x):
        raise ValueError(f"programmatic dependent launch needs compiled Triton on a CUDA device "
                         f"of compute capability >= {MIN_CAPABILITY}, got {x.device}")
    return pdl

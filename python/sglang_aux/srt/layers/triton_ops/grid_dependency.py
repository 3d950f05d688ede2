"""Programmatic dependent launch (PDL, Hopper and later): a kernel launched with it may start
while the kernel before it on the stream is still running, and waits for that kernel's writes
only where it calls `wait_for_previous_kernel`.

A candidate, not a default: the kernels that take `pdl` (the row GEMVs, RMSNorm, RoPE + KV
store, SiLU-mul) run it only where a caller asks, which today only the benches do
(`bench_gemv.py`, and `bench_graph_replay.py --pdl on`, which sets `SGLANG_AUX_PDL=1` for its
process), until it beats the default on the H200 (docs/kernels.md). Every kernel launched so
must call the wait before it reads or writes anything an earlier kernel touches: the row GEMV
loads its first weight tile (never written by a kernel) before it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

ENV_VAR = "SGLANG_AUX_PDL"
# griddepcontrol needs sm_90
MIN_CAPABILITY = (9, 0)


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With PDL, block until the previous kernel has finished and its writes are visible, then
    let the next kernel launch: its programs take SM slots only as this kernel's free."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def resolve_pdl(pdl: bool | None, x: torch.Tensor) -> bool:
    """The launch's PDL setting: `pdl`, or `SGLANG_AUX_PDL` (0/1, default 0) when None. PDL
    needs a CUDA device of compute capability 9.0 or more (Triton's interpreter has no
    griddepcontrol)."""
    if pdl is None:
        value = os.environ.get(ENV_VAR, "0")
        if value not in ("0", "1"):
            raise ValueError(f"{ENV_VAR}={value!r}; choose 0 or 1")
        pdl = value == "1"
    if pdl and not (x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1"
                    and torch.cuda.get_device_capability(x.device) >= MIN_CAPABILITY):
        raise ValueError(f"programmatic dependent launch needs compiled Triton on a CUDA device "
                         f"of compute capability >= {MIN_CAPABILITY}, got {x.device}")
    return pdl

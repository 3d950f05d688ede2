"""Which path a fused layer takes: its Triton kernel or its torch twin.

`SGLANG_AUX_FUSED_KERNELS` (read at every call, so a benchmark may flip it per process):
- `auto` (default): Triton on CUDA tensors, the torch twin elsewhere;
- `off`: the torch twin everywhere (the unfused kernels, for before/after measurements);
- `force`: Triton everywhere, CPU included (tests run it under `TRITON_INTERPRET=1`).

The twin always runs while autograd records: the kernels have no backward, and DFlash
training calls the same layers with gradients on.

Callers import a kernel's module only once this says to run it: Triton has wheels for Linux
alone, and the torch twins serve a CPU elsewhere (the import costs ~0.2 us a call, on the
kernel path only).
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch

ENV_VAR = "SGLANG_AUX_FUSED_KERNELS"
MODES = ("auto", "off", "force")
# The kernels' environment switches and their values, checked when the server's arguments are
# (`check_kernel_switches`), so a typo stops the server before the model loads rather than at
# its first step: PDL (`grid_dependency.py`), the paired row GEMVs (`layers/decode_gemv.py`) and
# DSpark's Markov loop.
PDL_ENV_VAR = "SGLANG_AUX_PDL"
PDL_VALUES = ("auto", "0", "1")
PAIRED_GEMV_ENV_VAR = "SGLANG_AUX_PAIRED_GEMV"
PAIRED_GEMV_VALUES = ("1", "0")
# DSpark's greedy Markov loop as n + 1 launches (speculative/markov_argmax_kernel.py), the
# default since it beat the torch loop in the draft's block graph on both recipes' shapes
# (docs/benchmarks.md section 9j); "0" keeps the loop.
MARKOV_ARGMAX_ENV_VAR = "SGLANG_AUX_MARKOV_ARGMAX"
MARKOV_ARGMAX_VALUES = ("1", "0")
# Greedy proposals scored over each row's K largest base logits where a bound certifies they
# hold the winner, the exact kernel's elsewhere (speculative/markov_topk_kernel.py), for batches
# up to its MAX_REQUESTS: the exact tokens either way, off (0) until a trained head shows how
# often the bound holds.
MARKOV_TOPK_ENV_VAR = "SGLANG_AUX_MARKOV_TOPK"
MARKOV_TOPK_VALUES = ("0", "64", "256")
SWITCHES = {ENV_VAR: MODES, PDL_ENV_VAR: PDL_VALUES, PAIRED_GEMV_ENV_VAR: PAIRED_GEMV_VALUES,
            MARKOV_ARGMAX_ENV_VAR: MARKOV_ARGMAX_VALUES, MARKOV_TOPK_ENV_VAR: MARKOV_TOPK_VALUES}
# `--decode-gemv-backend`: the dense projections of one-row forwards on cuBLAS (torch) or on the
# row GEMV kernel (triton; layers/decode_gemv.py), which these rules then gate like any other.
GEMV_BACKENDS = ("torch", "triton")
# What the row GEMV takes (here, so the torch path decides without importing Triton): these
# weight dtypes.
GEMV_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def require_triton() -> None:
    """Raise a clear error where a Triton kernel is asked for and Triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        raise ModuleNotFoundError(
            "the fused kernels need Triton, which is not installed: `pip install triton` "
            "(wheels for Linux x86_64/aarch64 only), or run the torch twins with "
            f"{ENV_VAR}=off (a CPU needs neither)", name="triton")


def switch(name: str) -> str:
    """The value of the kernel switch `name` (its default unset), or a ValueError naming it."""
    choices = SWITCHES[name]
    value = os.environ.get(name, choices[0])
    if value not in choices:
        raise ValueError(f"{name}={value!r}; choose from {', '.join(choices)}")
    return value


def check_kernel_switches() -> None:
    for name in SWITCHES:
        switch(name)


def fused_kernels_mode() -> str:
    return switch(ENV_VAR)


def use_triton(x: torch.Tensor, differentiable: bool = True) -> bool:
    """Whether the layer fed with `x` runs its Triton kernel; a `differentiable` one never
    while autograd records (sampling is not: it has no backward to lose)."""
    if differentiable and torch.is_grad_enabled():
        return False
    mode = fused_kernels_mode()
    if mode == "force" or (mode == "auto" and x.is_cuda):
        require_triton()
        return True
    return False

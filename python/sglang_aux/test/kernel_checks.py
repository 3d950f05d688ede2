"""Helpers the kernel tests share: a logged fresh seed per test, the marks of tests that need
real (compiled) Triton kernels on CUDA, the default rope of a given base, a norm with random
weights and a closeness check that names its seed."""

from __future__ import annotations

import os
import random

import pytest
import torch

from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.rope_scaling import RopeScaling

# Compiled Triton kernels on the GPU: the interpreter (TRITON_INTERPRET=1) would run them on the
# host instead.
REAL_TRITON_ON_CUDA = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="real Triton kernels; unset TRITON_INTERPRET"),
]


def fresh_seed() -> int:
    """Seeds torch with a new random seed and returns it, so a failure names its inputs."""
    seed = random.randrange(2**31)
    torch.manual_seed(seed)
    return seed


def default_rope(theta: float, max_position: int) -> RopeScaling:
    return RopeScaling("default", theta, max_position)


def random_rms_norm(k: int, dtype: torch.dtype, device: str = "cpu", eps: float = 1e-6
                    ) -> RMSNorm:
    """An RMSNorm of width `k` with N(0, 1) weights, so a fused norm's weight matters."""
    norm = RMSNorm(k, eps).to(device=device, dtype=dtype)
    torch.nn.init.normal_(norm.weight)
    return norm


def assert_close_seeded(actual: torch.Tensor, expected: torch.Tensor, seed: int, what: str,
                        **tol: float) -> None:
    """`torch.testing.assert_close` in fp32, the failure naming the check and its seed."""
    torch.testing.assert_close(actual.float(), expected.float(), **tol,
                               msg=lambda m: f"{what} (seed {seed}): {m}")

"""Helpers the kernel tests share: a logged fresh seed per test, the marks of tests that need
real (compiled) Triton kernels on CUDA and the default rope of a given base."""

from __future__ import annotations

import os
import random

import pytest
import torch

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

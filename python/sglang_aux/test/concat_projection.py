"""The concat path the staged MXFP8 input replaces, as the baseline tests and benchmarks compare
it with: all K aux slices concatenated, then quantized, then the same GEMM."""

from __future__ import annotations

import torch

from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear


def concat_then_project(
    slices: list[torch.Tensor], linear: MXFP8Linear, out: torch.Tensor | None = None,
    candidate: str | None = None,
) -> torch.Tensor:
    """Cat the K slices [T, H] to [T, K*H], quantize, then `linear`'s MXFP8 GEMM."""
    return linear.forward(torch.cat(slices, dim=-1), out=out, candidate=candidate)

"""Staged MXFP8 input for the draft `fc`: quantize aux slices as they arrive, GEMM once.

The concat path holds K BF16 slices, their concatenation [T, K*H] and its quantization at the
same time. The staged path keeps only the retained MXFP8 input (1 byte per element plus one
scale byte per 32) and one live BF16 slice: the caller drops each slice after `accumulate`.
Quantization is row- and block-local, so the retained bytes equal those of quantizing the
concat, and the same GEMM on the same bytes gives bitwise-equal output.
"""

from dataclasses import dataclass

import torch

from sglang_aux.srt.layers.quantization.mxfp8 import mxfp8_gemm, quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK, SCALES_DTYPE, VALUES_DTYPE
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.slice_sequence import SliceSequence


def allocate_retained_input(
    num_tokens: int, width: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty retained MXFP8 input: values [T, width] e4m3fn, scales [T, width/32] uint8."""
    values = torch.empty(num_tokens, width, dtype=VALUES_DTYPE, device=device)
    scales = torch.empty(num_tokens, width // MXFP8_BLOCK, dtype=SCALES_DTYPE, device=device)
    return values, scales


@dataclass(frozen=True)
class DeferredOutput:
    """An `out` the accumulator allocates itself when its last slice arrives: in a large
    prefill the `[T, N]` output is then not live while the target forward that produces the
    slices peaks (the K3-shaped chunk step: 58.7 MB at 4,096 tokens)."""

    num_tokens: int
    dtype: torch.dtype
    device: torch.device


class MXFP8InputAccumulator(SliceSequence):
    """Quantizes K slices [T, H] into a retained MXFP8 input [T, K*H]; the K-th slice runs
    the GEMM once into the caller's `out` [T, N] (or one it allocates then, for a
    `DeferredOutput`): `linear`'s MXFP8 weight, or a bf16 fc weight [N, K*H] (MXFP8
    activations x BF16 weight, `mxfp8_gemm` with `ws=None`).

    Life cycle: `accumulate` x K -> `result()` once -> `reset()` before the next forward.
    All checks are on Python ints, dtypes and a Python slice counter, so the per-slice path is
    one in-place quantize op and is safe under CUDA graph capture and
    `torch.compile(fullgraph=True)`.
    NOTE: under graph replay the Python state reflects the capture; replays rewrite `out`
    in place, and the caller must consume it before the next replay.
    """

    def __init__(
        self,
        linear: MXFP8Linear | torch.Tensor,
        out: torch.Tensor | DeferredOutput,
        hidden_size: int,
        num_slices: int,
        dtype: torch.dtype | None = None,
        values: torch.Tensor | None = None,
        scales: torch.Tensor | None = None,
        candidate: str | None = None,
    ) -> None:
        width = hidden_size * num_slices
        n, in_features = ((linear.out_features, linear.in_features)
                          if isinstance(linear, MXFP8Linear) else tuple(linear.shape))
        if hidden_size % MXFP8_BLOCK != 0:
            raise ValueError(f"hidden_size must be a multiple of {MXFP8_BLOCK} so slices map "
                             f"to whole scale blocks, got {hidden_size}")
        if in_features != width:
            raise ValueError(f"fc in_features {in_features} != num_slices * "
                             f"hidden_size = {num_slices} * {hidden_size} = {width}")
        self.deferred = out if isinstance(out, DeferredOutput) else None
        if self.deferred is None and (out.dim() != 2 or out.shape[1] != n):
            raise ValueError(f"out must be [T, {n}], got {tuple(out.shape)}")
        num_tokens = out.num_tokens if self.deferred else out.shape[0]
        if values is None or scales is None:
            values, scales = allocate_retained_input(num_tokens, width, out.device)
        expected = ((num_tokens, width), (num_tokens, width // MXFP8_BLOCK))
        if (tuple(values.shape), tuple(scales.shape)) != expected:
            raise ValueError(f"retained input must be values {expected[0]} and scales "
                             f"{expected[1]}, got {tuple(values.shape)} and "
                             f"{tuple(scales.shape)}")
        if values.dtype != VALUES_DTYPE or scales.dtype != SCALES_DTYPE:
            raise ValueError(f"retained input must be {VALUES_DTYPE} values and {SCALES_DTYPE} "
                             f"scales, got {values.dtype} and {scales.dtype}")
        self.linear = linear
        self.candidate = candidate  # the GEMM candidate of `mxfp8_gemm_choice` (None: by T)
        self.out_features = n
        self.out = None if self.deferred else out  # [T, N], the caller's (or ours once run)
        self.values = values  # [T, K*H] e4m3fn
        self.scales = scales  # [T, K*H/32] uint8
        super().__init__(num_tokens, hidden_size, num_slices,
                         out.dtype if dtype is None else dtype)

    def accumulate(self, hidden: torch.Tensor) -> None:
        """Quantizes the next slice ([T, H], model dtype) into its columns of the retained
        input; the caller may free `hidden` afterwards. Runs the GEMM after the K-th slice."""
        lo, hi = self._next_columns(hidden)
        quantize_mxfp8(hidden, out=(self.values[:, lo:hi],
                                    self.scales[:, lo // MXFP8_BLOCK:hi // MXFP8_BLOCK]))
        if not self._slice_done():
            return
        if self.out is None:
            d = self.deferred
            self.out = torch.empty((d.num_tokens, self.out_features), dtype=d.dtype,
                                   device=d.device)
        if isinstance(self.linear, MXFP8Linear):
            self.linear.forward_quantized(self.values, self.scales, self.out, self.candidate)
        else:
            mxfp8_gemm(self.values, self.scales, self.linear, None, self.out,
                       candidate=self.candidate)

    def result(self) -> torch.Tensor:
        """The projected output [T, N] (the caller's `out`, or the one allocated for a
        `DeferredOutput`); readable once per forward."""
        self._consume()
        return self.out

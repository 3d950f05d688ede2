"""Streamed draft-fc projection: `fc(concat(a_1..a_K)) = sum_i W_i a_i`, one slice at a time.

`W_i = fc.weight[:, i*H:(i+1)*H]`. Each aux slice `a_i` [T, H] adds `W_i a_i` into a caller-owned
fp32 accumulator [T, N] the moment it is captured, so no [T, K*H] tensor exists: the live bytes
are the accumulator (4 per output element) and one slice (plus its MXFP8 copy with MXFP8
weights), against the concat's K slices + [T, K*H] + output, or the staged path's retained
MXFP8 [T, K*H] + output.

CUDA runs `accumulating_gemm` (the accumulator is loaded and stored between slices): the result
equals that kernel run once over the concat, bit for bit (see its module doc for when). CPU
runs torch fp32 math (exact MXFP8 dequant); there each slice is its own fp32 matmul, so the
sum is within fp32 rounding of, not bitwise equal to, one matmul over the concat.
"""

from __future__ import annotations

import torch

from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import (
    CHUNKED_CUBLAS_PREFIX,
    MXFP8_BLOCK,
    dequantize_mxfp8,
)
from sglang_aux.srt.layers.quantization.mxfp8_linear import MXFP8Linear
from sglang_aux.srt.layers.quantization.slice_sequence import SliceSequence


@torch.library.custom_op("sglang_aux::gemm_accumulate", mutates_args=("acc",))
def _dense_op(x: torch.Tensor, w: torch.Tensor, acc: torch.Tensor, accumulate: bool) -> None:
    if x.is_cuda:
        from sglang_aux.srt.layers.quantization.accumulating_gemm import dense_gemm_accumulate

        dense_gemm_accumulate(x, w, acc, acc if accumulate else None)
    elif accumulate:
        acc.addmm_(x.float(), w.float().T)
    else:
        torch.mm(x.float(), w.float().T, out=acc)


@_dense_op.register_fake
def _(x: torch.Tensor, w: torch.Tensor, acc: torch.Tensor, accumulate: bool) -> None:
    return None


@torch.library.custom_op("sglang_aux::mxfp8_gemm_accumulate", mutates_args=("acc",))
def _mxfp8_op(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
              acc: torch.Tensor, accumulate: bool, candidate: str) -> None:
    if xq.is_cuda or candidate.startswith(CHUNKED_CUBLAS_PREFIX):
        from sglang_aux.srt.layers.quantization.mxfp8_gemm_choice import mxfp8_gemm_accumulate

        mxfp8_gemm_accumulate(xq, xs, (wq, ws), acc, acc if accumulate else None,
                              candidate or None)
        return
    prod = dequantize_mxfp8(xq, xs) @ dequantize_mxfp8(wq, ws).T
    if accumulate:
        acc.add_(prod)
    else:
        acc.copy_(prod)


@_mxfp8_op.register_fake
def _(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
      acc: torch.Tensor, accumulate: bool, candidate: str) -> None:
    return None


class StreamedProjection(SliceSequence):
    """Accumulates `W_i a_i` for K slices [T, H] into `acc` [T, N] fp32 (caller-owned).

    `weight` is the fc weight [N, K*H] (dense) or an `MXFP8Linear` (each slice is quantized
    to MXFP8 as it arrives, as the concat path quantizes the concat: the same bytes; its GEMM
    is `candidate` of `mxfp8_gemm_choice`, a chunked-cuBLAS one also on CPU).
    Life cycle: `accumulate` x K -> `result()` once -> `reset()` before the next forward.
    A capture is one or two opaque in-place ops (no host syncs, see `SliceSequence`).
    NOTE: under graph replay the Python state reflects the capture; replays rewrite `acc` in
    place, and its consumer must read it before the next replay.
    """

    def __init__(self, weight: torch.Tensor | MXFP8Linear, acc: torch.Tensor, hidden_size: int,
                 num_slices: int, dtype: torch.dtype, out_dtype: torch.dtype,
                 candidate: str | None = None) -> None:
        mxfp8 = isinstance(weight, MXFP8Linear)
        n, width = ((weight.out_features, weight.in_features) if mxfp8
                    else tuple(weight.shape))
        if width != hidden_size * num_slices:
            raise ValueError(f"fc weight [N, K*H] = {(n, width)} does not match num_slices * "
                             f"hidden_size = {num_slices} * {hidden_size}")
        if mxfp8 and hidden_size % MXFP8_BLOCK != 0:
            raise ValueError(f"hidden_size {hidden_size} must be a multiple of {MXFP8_BLOCK} "
                             "for MXFP8 slices")
        if acc.dim() != 2 or acc.shape[1] != n or acc.dtype != torch.float32:
            raise ValueError(f"acc must be float32 [T, {n}], got {acc.dtype} "
                             f"{tuple(acc.shape)}")
        super().__init__(acc.shape[0], hidden_size, num_slices, dtype)
        self.weight = weight
        self.acc = acc  # [T, N] fp32; the first slice overwrites it
        self.out_dtype = out_dtype  # the fc output's dtype, as the concat path returns it
        self.candidate = candidate  # MXFP8 weights: the GEMM candidate (None: chosen from T)

    def accumulate(self, hidden: torch.Tensor) -> None:
        """Adds `W_i @ hidden` for slice i = the number of slices so far; `hidden` [T, H] may
        be freed right after."""
        lo, hi = self._next_columns(hidden)
        first = self.num_accumulated == 0
        if isinstance(self.weight, MXFP8Linear):
            xq, xs = quantize_mxfp8(hidden)
            g = slice(lo // MXFP8_BLOCK, hi // MXFP8_BLOCK)
            torch.ops.sglang_aux.mxfp8_gemm_accumulate(
                xq, xs, self.weight.weight_values[:, lo:hi], self.weight.weight_scales[:, g],
                self.acc, not first, self.candidate or "")
        else:
            w = self.weight[:, lo:hi]
            torch.ops.sglang_aux.gemm_accumulate(hidden.to(w.dtype), w, self.acc, not first)
        self._slice_done()

    def result(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The fc output [T, N] in `out_dtype` (written into `out` when given); once per
        forward. With `out_dtype` float32 and no `out`, the accumulator itself."""
        self._consume()
        if out is not None:
            if tuple(out.shape) != tuple(self.acc.shape) or out.dtype != self.out_dtype:
                raise ValueError(f"result: out must be {self.out_dtype} "
                                 f"{tuple(self.acc.shape)}, got {out.dtype} {tuple(out.shape)}")
            return out.copy_(self.acc)
        return self.acc.to(self.out_dtype)

"""Aux rows kept as MXFP8 (`--mxfp8-rows`): each token's hidden-state columns as E4M3 bytes with
one E8M0 scale byte per 32 (the format of `srt/layers/quantization/mxfp8_format.py`), the
trailing columns that are not hidden states (DSpark's kept logsumexp) as their own bytes.

Why: a training run keeps every sequence's rows for all its steps, and they bound how many
samples one machine trains on (the mix recipe's 32,000 took 110 GB of pinned host memory beside
40 GiB of the device on an H100). MXFP8 keeps 33 bytes per 32 bf16 columns (0.52x) and 33 per
32 fp32 ones (0.26x). A batch is gathered as bytes (prefix, own rows, zero padding: the
padding's zero bytes decode to zeros) and decoded once on its device, so what the step reads
is each row's MXFP8 round trip, exactly `dequantize_mxfp8(quantize_mxfp8(row))`: by torch
through an fp32 temporary of the batch, or by `dequant_gemm.dequantize_rows` (Triton: one
kernel writing the rows' dtype; e4m3 x 2^k is exact in bf16, so the same values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import (
    MXFP8_BLOCK,
    VALUES_DTYPE,
    dequantize_mxfp8,
)

MXFP8_ROWS_DECODES = ("torch", "triton")


@dataclass(frozen=True)
class MXFP8Rows:
    """Rows `[T, quantized + raw]` in `dtype`: the first `quantized` columns (a multiple of 32)
    are kept as MXFP8, the last `raw` as their bytes; `decoder` names how a batch is decoded
    (`MXFP8_ROWS_DECODES`)."""

    quantized: int
    raw: int
    dtype: torch.dtype
    decoder: str = "torch"

    def __post_init__(self) -> None:
        if self.decoder not in MXFP8_ROWS_DECODES:
            raise ValueError(f"MXFP8 rows: decoder must be one of {MXFP8_ROWS_DECODES}, got "
                             f"{self.decoder!r}")
        if self.quantized <= 0 or self.quantized % MXFP8_BLOCK:
            raise ValueError(f"MXFP8 rows need a positive multiple of {MXFP8_BLOCK} hidden-state "
                             f"columns, got {self.quantized}")
        if self.raw < 0:
            raise ValueError(f"raw columns must be >= 0, got {self.raw}")

    @property
    def columns(self) -> int:
        """Columns of a decoded row."""
        return self.quantized + self.raw

    @property
    def width(self) -> int:
        """Bytes of an encoded row: the E4M3 values, the scales, the raw columns' bytes."""
        return self.quantized + self.quantized // MXFP8_BLOCK + self.raw * self.dtype.itemsize

    def encode(self, rows: torch.Tensor) -> torch.Tensor:
        """`[T, columns]` in `dtype` -> `[T, width]` uint8, on the rows' device."""
        if rows.dim() != 2 or rows.shape[-1] != self.columns or rows.dtype != self.dtype:
            raise ValueError(f"MXFP8 rows: expected [T, {self.columns}] {self.dtype} rows "
                             f"({self.quantized} hidden-state + {self.raw} raw columns), got "
                             f"{list(rows.shape)} {rows.dtype}")
        q, g = self.quantized, self.quantized // MXFP8_BLOCK
        out = torch.empty((rows.shape[0], self.width), dtype=torch.uint8, device=rows.device)
        quantize_mxfp8(rows[:, :q], out=(out[:, :q].view(VALUES_DTYPE), out[:, q:q + g]))
        if self.raw:
            out[:, q + g:] = rows[:, q:].contiguous().view(torch.uint8)
        return out

    def decode(self, data: torch.Tensor) -> torch.Tensor:
        """`[..., width]` uint8 -> `[..., columns]` in `dtype`: the hidden states' exact MXFP8
        dequantization, the raw columns bit for bit."""
        if data.dtype != torch.uint8 or data.shape[-1] != self.width:
            raise ValueError(f"MXFP8 rows: expected [..., {self.width}] uint8 encoded rows, got "
                             f"{list(data.shape)} {data.dtype}")
        q, g = self.quantized, self.quantized // MXFP8_BLOCK
        out = torch.empty((*data.shape[:-1], self.columns), dtype=self.dtype, device=data.device)
        if self.decoder == "triton":
            from sglang_aux.srt.layers.quantization.dequant_gemm import dequantize_rows

            rows = data.reshape(-1, self.width)
            if len(rows):
                dequantize_rows(rows[:, :q].view(VALUES_DTYPE), rows[:, q:q + g],
                                out.view(-1, self.columns)[:, :q])
        else:
            out[..., :q] = dequantize_mxfp8(data[..., :q].view(VALUES_DTYPE),
                                            data[..., q:q + g], self.dtype)
        if self.raw:
            out[..., q:] = data[..., q + g:].contiguous().view(self.dtype)
        return out

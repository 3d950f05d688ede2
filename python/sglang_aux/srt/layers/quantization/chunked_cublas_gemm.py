"""MXFP8 GEMM as dequantize-then-cuBLAS in K chunks: `out = acc + dequant(xq, xs) @ W^T`.

Walking K from column 0 in chunks of `chunk_k` columns: the activation chunk [M, Kc] and, for
an MXFP8 weight, the weight chunk [R, Kc] (R = `weight_rows` rows at a time, default all N) are
dequantized into BF16 scratch (`dequant_gemm.dequantize_rows`), then cuBLAS adds their product
into an fp32 accumulator [M, N] (`torch.addmm(acc, a, w.T, out_dtype=float32, out=acc)`: beta 1
on an fp32 C, which cuBLAS reads in its epilogue; without an incoming `acc` the first chunk is
`torch.mm(..., out_dtype=float32, out=acc)`). A bf16 weight is read in place, a column slice
per chunk.

Exact operands: e4m3 x 2^(byte - 127) is exact in BF16 for every scale byte in [3, 246] (and
for every block quantized from in-range BF16 data, `mxfp8_kernels`); bytes above 246 overflow
and bytes below 3 may round. bf16 x bf16 products are exact in fp32 and cuBLAS sums in fp32, so
the only roundings are cuBLAS's fp32 sums inside a chunk and one fp32 add per chunk.

Bitwise: a call over K = num_slices * H columns makes the same cuBLAS calls (same shapes,
strides, scratch layout, weight columns) as a chain of one call per H-wide slice whenever
H % chunk_k == 0, and cuBLAS is deterministic for a given call on one GPU; so the staged,
streamed and concat calls agree bit for bit. Not bitwise with any other kernel, nor with one
cuBLAS call over all of K.

Memory: the scratch is 2 * Kc * (M + R) bytes (R = 0 for a bf16 weight), twice that with
`overlap`, plus 4 * M * N for an fp32 accumulator when `out` is not fp32 (`scratch_bytes`).
`overlap` dequantizes step s + 1 on a side stream while cuBLAS runs step s (double buffers).

CPU (CI): the same walk with fp32 scratch and fp32 `addmm_` (CPU has no out_dtype matmul);
the dequant runs the Triton kernel under TRITON_INTERPRET=1, else `dequantize_mxfp8`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from sglang_aux.srt.layers.quantization.accumulating_gemm import _INTERPRETED
from sglang_aux.srt.layers.quantization.dequant_gemm import check_weight_operands, dequantize_rows
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK, dequantize_mxfp8

_NAME = re.compile(r"cublas_kc(\d+)(?:_wr(\d+))?(_ov)?")


@dataclass(frozen=True)
class ChunkConfig:
    chunk_k: int  # K columns per cuBLAS call, a multiple of 32
    weight_rows: int = 0  # MXFP8 weight rows dequantized per cuBLAS call; 0: all N
    overlap: bool = False  # dequantize the next step on a side stream (double scratch)

    def __post_init__(self) -> None:
        if self.chunk_k <= 0 or self.chunk_k % MXFP8_BLOCK or self.weight_rows < 0:
            raise ValueError(f"chunk_k must be a positive multiple of {MXFP8_BLOCK} and "
                             f"weight_rows >= 0, got {self.chunk_k} and {self.weight_rows}")

    @property
    def name(self) -> str:
        rows = f"_wr{self.weight_rows}" if self.weight_rows else ""
        return f"cublas_kc{self.chunk_k}{rows}{'_ov' if self.overlap else ''}"


def parse(name: str) -> ChunkConfig | None:
    """The config a `cublas_kc<C>[_wr<R>][_ov]` name spells (any chunk size), else None."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    return ChunkConfig(int(m[1]), int(m[2] or 0), m[3] is not None)


# The sweep's set (benchmark/aux_memory/bench_mxfp8_gemm.py): one K3 slice per chunk, half and
# a quarter of one; the weight scratch bounded to 2,048 rows; the side-stream overlap.
CANDIDATES = {c.name: c for c in [
    ChunkConfig(7168), ChunkConfig(3584), ChunkConfig(1792),
    ChunkConfig(7168, weight_rows=2048), ChunkConfig(3584, weight_rows=2048),
    ChunkConfig(7168, overlap=True), ChunkConfig(3584, overlap=True),
]}


def _scratch_dims(n: int, k: int, config: ChunkConfig, w_mxfp8: bool,
                  overlap: bool) -> tuple[int, int, int]:
    """(columns per chunk, weight rows per step (0: a dense weight, read in place), buffers)."""
    rows = (min(n, config.weight_rows) if config.weight_rows else n) if w_mxfp8 else 0
    return min(config.chunk_k, k), rows, 2 if overlap else 1


def scratch_bytes(m: int, n: int, k: int, config: ChunkConfig, w_mxfp8: bool,
                  out_fp32: bool, element_bytes: int = 2) -> int:
    """Temporary bytes one call allocates: dequant scratch (+ an fp32 accumulator)."""
    kc, rows, bufs = _scratch_dims(n, k, config, w_mxfp8, config.overlap)
    return bufs * kc * (m + rows) * element_bytes + (0 if out_fp32 else 4 * m * n)


def _dequantize_into(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    if q.is_cuda or _INTERPRETED:
        dequantize_rows(q, s, out)
    else:
        out.copy_(dequantize_mxfp8(q, s))


def _mm_into(a: torch.Tensor, b: torch.Tensor, dst: torch.Tensor, accumulate: bool) -> None:
    """dst (fp32) [+]= a @ b^T."""
    if a.dtype == torch.float32:  # CPU twin, exact-comparison runs
        if accumulate:
            dst.addmm_(a, b.T)
        else:
            torch.mm(a, b.T, out=dst)
    elif accumulate:
        torch.addmm(dst, a, b.T, out_dtype=torch.float32, out=dst)
    else:
        torch.mm(a, b.T, out_dtype=torch.float32, out=dst)


def chunked_gemm_accumulate(xq: torch.Tensor, xs: torch.Tensor,
                            w: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                            out: torch.Tensor, acc: torch.Tensor | None,
                            config: ChunkConfig) -> None:
    """out[M, N] = acc + dequant(xq, xs)[M, K] @ W[N, K]^T, fp32 sums, one rounding into out.

    `w`: an MXFP8 pair (values [N, K] e4m3fn, scales [N, K/32] uint8) or a bf16 weight [N, K]
    (fp32 for exact runs). Operands may be column slices of wider buffers (offsets multiples
    of 32); `out` may be `acc`."""
    w_mxfp8, wv, ws, m, k, n = check_weight_operands(xq, xs, w, out, acc)
    fp32 = not xq.is_cuda or (not w_mxfp8 and wv.dtype == torch.float32)
    dtype = torch.float32 if fp32 else torch.bfloat16
    target = out if out.dtype == torch.float32 else torch.empty(m, n, device=out.device)
    if acc is not None and acc.data_ptr() != target.data_ptr():
        target.copy_(acc)
    kc, w_rows, bufs = _scratch_dims(n, k, config, w_mxfp8, config.overlap and xq.is_cuda)
    rows = w_rows or n  # output columns per step
    a_buf = [torch.empty(m, kc, device=xq.device, dtype=dtype) for _ in range(bufs)]
    w_buf = [torch.empty(w_rows, kc, device=xq.device, dtype=dtype)
             for _ in range(bufs if w_mxfp8 else 0)]
    steps = [(k0, n0) for k0 in range(0, k, kc) for n0 in range(0, n, rows)]

    def operands(s: int) -> tuple[torch.Tensor, torch.Tensor | None, slice, slice]:
        k0, n0 = steps[s]
        cols, outs = slice(k0, min(k, k0 + kc)), slice(n0, min(n, n0 + rows))
        a = a_buf[(k0 // kc) % bufs][:, :cols.stop - k0]
        b = w_buf[s % bufs][:outs.stop - n0, :cols.stop - k0] if w_mxfp8 else None
        return a, b, cols, outs

    def dequantize(s: int) -> None:
        a, b, cols, outs = operands(s)
        groups = slice(cols.start // MXFP8_BLOCK, cols.stop // MXFP8_BLOCK)
        if outs.start == 0:  # a new K chunk
            _dequantize_into(xq[:, cols], xs[:, groups], a)
        if b is not None:
            _dequantize_into(wv[outs, cols], ws[outs, groups], b)

    def multiply(s: int) -> None:
        a, b, cols, outs = operands(s)
        if b is None:
            b = wv[outs, cols] if wv.dtype == dtype else wv[outs, cols].to(dtype)
        _mm_into(a, b, target[:, outs], acc is not None or cols.start > 0)

    if bufs == 1:
        for s in range(len(steps)):
            dequantize(s)
            multiply(s)
    else:
        main, side = torch.cuda.current_stream(xq.device), _side_stream(xq.device)
        dequantize(0)
        for s in range(len(steps)):
            if s + 1 < len(steps):
                side.wait_stream(main)  # step s - 1, the last reader of buffer (s + 1) % 2
                with torch.cuda.stream(side):
                    dequantize(s + 1)
            multiply(s)
            main.wait_stream(side)
    if target is not out:
        out.copy_(target)


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]

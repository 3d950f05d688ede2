"""MXFP8 quantize and block GEMM as custom ops (the format and its torch reference:
`mxfp8_format.py`).

Devices: CUDA tensors run the Triton kernels (`mxfp8_kernels` quantizes, `mxfp8_gemm_choice`
picks the GEMM kernel), other devices the torch reference. Both are exposed as custom ops
so that CUDA graphs and `torch.compile(fullgraph=True)` see one opaque, in-place call per
quantize/GEMM.
"""

import torch

from sglang_aux.srt.layers.quantization.mxfp8_format import (
    CHUNKED_CUBLAS_PREFIX,
    MXFP8_BLOCK,
    SCALES_DTYPE,
    VALUES_DTYPE,
    check_quantized_pair,
    mxfp8_gemm_reference,
    quantize_mxfp8_reference,
)


@torch.library.custom_op("sglang_aux::mxfp8_quantize", mutates_args=("values", "scales"))
def _quantize_op(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
    if x.is_cuda:
        from sglang_aux.srt.layers.quantization.mxfp8_kernels import quantize_mxfp8_triton

        quantize_mxfp8_triton(x, values, scales)
    else:
        quantize_mxfp8_reference(x, values, scales)


@_quantize_op.register_fake
def _(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
    return None


@torch.library.custom_op("sglang_aux::mxfp8_gemm", mutates_args=("out",))
def _gemm_op(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor | None,
    out: torch.Tensor, candidate: str,
) -> None:
    if not xq.is_cuda and not candidate.startswith(CHUNKED_CUBLAS_PREFIX):
        mxfp8_gemm_reference(xq, xs, wq, ws, out)
        return
    from sglang_aux.srt.layers.quantization.mxfp8_gemm_choice import mxfp8_gemm_accumulate

    mxfp8_gemm_accumulate(xq, xs, wq if ws is None else (wq, ws), out,
                          candidate=candidate or None)


@_gemm_op.register_fake
def _(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor | None,
    out: torch.Tensor, candidate: str,
) -> None:
    return None


def quantize_mxfp8(
    x: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantizes `x` [..., K] to (values e4m3fn [..., K], scales uint8 [..., K/32]).

    `out=(values, scales)` may be column slices of larger retained buffers (last-dim stride 1):
    quantization is row- and block-local, so quantizing slice i into columns [i*H, (i+1)*H)
    gives the same bytes as quantizing the concatenation, whenever H % 32 == 0.
    """
    if not x.is_floating_point():
        raise ValueError(f"quantize_mxfp8: x must be floating point, got {x.dtype}")
    k = x.shape[-1]
    if k % MXFP8_BLOCK != 0:
        raise ValueError(f"quantize_mxfp8: last dim of x {tuple(x.shape)} must be a multiple "
                         f"of {MXFP8_BLOCK}, got {k}")
    if out is None:
        values = torch.empty(x.shape, dtype=VALUES_DTYPE, device=x.device)
        scales = torch.empty((*x.shape[:-1], k // MXFP8_BLOCK), dtype=SCALES_DTYPE,
                             device=x.device)
    else:
        values, scales = out
        if tuple(values.shape) != tuple(x.shape):
            raise ValueError(f"quantize_mxfp8: out values shape {tuple(values.shape)} != "
                             f"x shape {tuple(x.shape)}")
        check_quantized_pair(values, scales, "quantize_mxfp8 out")
        if values.stride(-1) != 1 or scales.stride(-1) != 1:
            raise ValueError("quantize_mxfp8: out tensors need a contiguous last dim, got "
                             f"strides {values.stride()} and {scales.stride()}")
    # The kernels see 2-D row-strided views: [rows, K] and [rows, K/32].
    torch.ops.sglang_aux.mxfp8_quantize(
        x.reshape(-1, k), values.view(-1, k), scales.view(-1, k // MXFP8_BLOCK)
    )
    return values, scales


def mxfp8_gemm(
    xq: torch.Tensor,
    xs: torch.Tensor,
    wq: torch.Tensor,
    ws: torch.Tensor | None,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    candidate: str | None = None,
) -> torch.Tensor:
    """out[M, N] = dequant(xq, xs)[M, K] @ W[N, K]^T, fp32 accumulation; W = dequant(wq, ws),
    or with `ws` None the bf16 weight `wq` itself.

    Deterministic for given bytes and shapes, so callers that feed identical bytes (the staged
    and the concat path) get identical bits. CUDA: the kernel and tile config that
    `mxfp8_gemm_choice` picks for M and the weight format, or the named `candidate`. CPU: the
    exact reference (a chunked-cuBLAS `candidate`: its CPU twin).
    """
    check_quantized_pair(xq, xs, "mxfp8_gemm input")
    if ws is not None:
        check_quantized_pair(wq, ws, "mxfp8_gemm weight")
    elif wq.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"mxfp8_gemm: a dense weight must be bfloat16 (float32 for exact "
                         f"runs), got {wq.dtype}")
    if xq.dim() != 2 or wq.dim() != 2 or xq.shape[1] != wq.shape[1]:
        raise ValueError(f"mxfp8_gemm: expected x [M, K] and w [N, K], got x {tuple(xq.shape)} "
                         f"and w {tuple(wq.shape)}")
    shape = (xq.shape[0], wq.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=xq.device)
    elif tuple(out.shape) != shape:
        raise ValueError(f"mxfp8_gemm: out shape {tuple(out.shape)} != expected {shape}")
    torch.ops.sglang_aux.mxfp8_gemm(xq, xs, wq, ws, out, candidate or "")
    return out

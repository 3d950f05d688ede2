"""MXFP8 (OCP MX, E4M3 elements, E8M0 block scales): quantize, dequantize and the block GEMM.

Format: every 32 consecutive elements along the last dim share one E8M0 scale byte (a power of
two, 2^(byte - 127)); elements are E4M3 (max 448), stored as `torch.float8_e4m3fn`. Scales are
stored as `uint8` (view them as `torch.float8_e8m0fnu` if an API wants that dtype).

Scale rule (RCEIL): byte = biased fp32 exponent of `t = amax * fp32(1/448)`, plus one when t's
mantissa is nonzero, i.e. scale = 2^ceil(log2(t)). fp32 and E8M0 share the bias 127, so the
exponent field is the scale byte. A nonzero block never gets a byte below 1 (fp32-subnormal t
rounds up to 2^-126). Elements are round-to-nearest-even(x / scale), saturated to +-448.

NOTE: all-zero blocks (including blocks of -0.0) get scale byte 0 (2^-127), which is what the
bit trick yields for amax == 0; their elements stay (signed) zeros. Non-finite inputs are out
of contract.

Devices: CUDA tensors run the Triton kernels (`mxfp8_kernels` quantizes, `mxfp8_gemm_choice`
picks the GEMM kernel), other devices the torch reference below. Both are exposed as custom ops
so that CUDA graphs and `torch.compile(fullgraph=True)` see one opaque, in-place call per
quantize/GEMM.
"""

import torch

MXFP8_BLOCK = 32  # elements per E8M0 scale along the last dim
E4M3_MAX = 448.0
E8M0_BIAS = 127
ZERO_BLOCK_SCALE_BYTE = 0
FP32_MANTISSA_BITS = 23
VALUES_DTYPE = torch.float8_e4m3fn
SCALES_DTYPE = torch.uint8
# GEMM candidates of `chunked_cublas_gemm`: on CPU they run its fp32 twin (the same chunk walk),
# every other candidate the reference below.
CHUNKED_CUBLAS_PREFIX = "cublas_"


def _check_quantized_pair(values: torch.Tensor, scales: torch.Tensor, name: str) -> None:
    if values.dtype != VALUES_DTYPE or scales.dtype != SCALES_DTYPE:
        raise ValueError(
            f"{name}: expected values {VALUES_DTYPE} and scales {SCALES_DTYPE}, "
            f"got {values.dtype} and {scales.dtype}"
        )
    k = values.shape[-1]
    if k % MXFP8_BLOCK != 0:
        raise ValueError(f"{name}: last dim {k} of values {tuple(values.shape)} is not a "
                         f"multiple of {MXFP8_BLOCK}")
    expected = (*values.shape[:-1], k // MXFP8_BLOCK)
    if tuple(scales.shape) != expected:
        raise ValueError(f"{name}: scales shape {tuple(scales.shape)} does not match values "
                         f"{tuple(values.shape)}; expected {expected}")


def _scale_bits(scales: torch.Tensor) -> torch.Tensor:
    """fp32 bit patterns of 2^(byte - 127); byte 0 (2^-127) is the fp32 subnormal 0x00400000."""
    s = scales.to(torch.int32)
    return torch.where(s == 0, 1 << (FP32_MANTISSA_BITS - 1), s << FP32_MANTISSA_BITS)


def quantize_mxfp8_reference(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
    """Torch reference quantizer; writes into `values` [..., K] and `scales` [..., K/32]."""
    blocks = x.float().unflatten(-1, (-1, MXFP8_BLOCK))  # [..., K/32, 32]
    amax = blocks.abs().amax(dim=-1)
    t_bits = (amax * torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)).view(torch.int32)
    exponent = t_bits >> FP32_MANTISSA_BITS  # t >= 0, so no sign bit
    mantissa = t_bits & ((1 << FP32_MANTISSA_BITS) - 1)
    byte = (exponent + (mantissa != 0).to(torch.int32)).clamp_(max=255)
    # 1/scale = 2^(127 - byte) is exact in fp32 for byte in [0, 254], so x * (1/scale) is exact.
    inv_scale = ((2 * E8M0_BIAS - byte) << FP32_MANTISSA_BITS).view(torch.float32)
    q = (blocks * inv_scale.unsqueeze(-1)).clamp_(-E4M3_MAX, E4M3_MAX)
    values.copy_(q.flatten(-2).to(VALUES_DTYPE))  # torch's fp32 -> e4m3fn cast is RNE
    scales.copy_(byte.to(SCALES_DTYPE))


def dequantize_mxfp8(
    values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """values * 2^(byte - 127), computed exactly in fp32, then cast to `dtype`."""
    _check_quantized_pair(values, scales, "dequantize_mxfp8")
    scale = _scale_bits(scales).view(torch.float32)
    blocks = values.float().unflatten(-1, (-1, MXFP8_BLOCK)) * scale.unsqueeze(-1)
    return blocks.flatten(-2).to(dtype)


def mxfp8_gemm_reference(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor | None,
    out: torch.Tensor,
) -> None:
    """CPU path: exact dequant to fp32, fp32 matmul, one cast into `out` [M, N]. `ws` None:
    `wq` is a bf16 weight."""
    w = wq.float() if ws is None else dequantize_mxfp8(wq, ws)
    out.copy_(dequantize_mxfp8(xq, xs) @ w.T)


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
        _check_quantized_pair(values, scales, "quantize_mxfp8 out")
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
    _check_quantized_pair(xq, xs, "mxfp8_gemm input")
    if ws is not None:
        _check_quantized_pair(wq, ws, "mxfp8_gemm weight")
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

"""The MXFP8 format (OCP MX, E4M3 elements, E8M0 block scales) and its torch reference:
quantize, dequantize and the block GEMM, on any device. `mxfp8.py` dispatches to these or to
the Triton kernels, which build on the constants here.

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


def check_quantized_pair(values: torch.Tensor, scales: torch.Tensor, name: str) -> None:
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


def scale_bits(scales: torch.Tensor) -> torch.Tensor:
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
    check_quantized_pair(values, scales, "dequantize_mxfp8")
    scale = scale_bits(scales).view(torch.float32)
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

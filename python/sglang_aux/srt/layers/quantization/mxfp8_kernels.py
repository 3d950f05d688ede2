"""Triton MXFP8 quantizer, and why dequantizing MXFP8 to BF16 is exact.

Hopper has no MX tensor cores (and `torch._scaled_mm` rejects 1x32 block scales there), so the
GEMMs are ours: `dequant_gemm` dequantizes tiles to BF16 in registers, `accumulating_gemm`
applies the scales to FP8 dots; `mxfp8_gemm_choice` picks one.
Dequantizing is exact whenever BF16 can hold value * 2^(byte - 127): an E4M3 value has
4 significant bits and an exponent in [-9, 8], so every scale byte in [3, 246] qualifies. So
does every block quantized from BF16 data with |x| < 2^127: its elements are multiples of
2^-133, so each rounded element is either the element itself or a multiple of a grid step
>= 2^-133 with at most 4 significant bits.

The quantizer also runs under TRITON_INTERPRET=1 on CPU tensors (CI). The interpreter's fp32 ->
fp8 rounding is unreliable, so it rounds to the E4M3 grid itself (the final cast only sees
representable values).
"""

import os

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.quantization.mxfp8_format import E4M3_MAX, E8M0_BIAS, MXFP8_BLOCK

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Biased fp32 exponent of 2^-6, the smallest normal E4M3 binade; below it the grid is 2^-9.
_E4M3_MIN_NORMAL_EXP_FIELD = E8M0_BIAS - 6
_E4M3_MANTISSA_BITS = 3
_QUANT_BLOCK_ROWS = 16
_QUANT_BLOCK_GROUPS = 8  # scale groups (of 32 elements) per program


@triton.jit
def _quantize_kernel(
    x_ptr, q_ptr, s_ptr, num_rows, num_groups,
    stride_x, stride_q, stride_s,
    BLOCK_ROWS: tl.constexpr, BLOCK_GROUPS: tl.constexpr, GROUP: tl.constexpr,
    MAX_VAL: tl.constexpr, MIN_NORMAL_FIELD: tl.constexpr, MANT_BITS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row64 = rows.to(tl.int64)  # row * stride can pass 2^31 for long prefills
    groups = tl.program_id(1) * BLOCK_GROUPS + tl.arange(0, BLOCK_GROUPS)
    lanes = tl.arange(0, GROUP)
    # [BLOCK_ROWS, BLOCK_GROUPS, GROUP] element tile; [BLOCK_ROWS, BLOCK_GROUPS] scale tile.
    row_ok = rows[:, None] < num_rows
    group_mask = row_ok & (groups[None, :] < num_groups)
    cols = groups[None, :, None] * GROUP + lanes[None, None, :]
    elem_mask = group_mask[:, :, None]
    x = tl.load(x_ptr + row64[:, None, None] * stride_x + cols, mask=elem_mask, other=0.0)
    x = x.to(tl.float32)
    x_bits = x.to(tl.int32, bitcast=True)

    # |x| and amax on the bit patterns: ordered like the floats, and immune to any flushing
    # of fp32 subnormals (BF16 subnormal inputs are fp32 subnormals).
    amax = tl.max(x_bits & 0x7FFFFFFF, axis=2).to(tl.float32, bitcast=True)
    t_bits = (amax * (1.0 / MAX_VAL)).to(tl.int32, bitcast=True)  # amax >= 0: no sign bit
    exponent = t_bits >> 23
    byte = exponent + ((t_bits & 0x7FFFFF) != 0).to(tl.int32)
    byte = tl.minimum(byte, 255)
    inv_scale = ((254 - byte) << 23).to(tl.float32, bitcast=True)  # 2^(127 - byte), exact

    v = tl.minimum(tl.abs(x * inv_scale[:, :, None]), MAX_VAL)
    # Round-to-nearest-even onto the E4M3 grid: adding 2^(q + 23), q the grid step's exponent,
    # makes the fp32 adder round at step 2^q; subtracting it back is exact.
    v_field = v.to(tl.int32, bitcast=True) >> 23
    magic = ((tl.maximum(v_field, MIN_NORMAL_FIELD) - MANT_BITS + 23) << 23)
    magic = magic.to(tl.float32, bitcast=True)
    rounded = (v + magic) - magic
    sign = x_bits & -2147483648  # keeps -0.0 as -0.0
    q = (rounded.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)

    tl.store(q_ptr + row64[:, None, None] * stride_q + cols, q.to(q_ptr.dtype.element_ty),
             mask=elem_mask)
    tl.store(s_ptr + row64[:, None] * stride_s + groups[None, :], byte.to(tl.uint8),
             mask=group_mask)


def quantize_mxfp8_triton(x: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> None:
    """Quantizes x [M, K] into values [M, K] e4m3fn and scales [M, K/32] uint8 (row-strided
    views allowed, last-dim stride 1); bytes equal `quantize_mxfp8_reference`."""
    num_rows, k = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    num_groups = k // MXFP8_BLOCK
    grid = (triton.cdiv(num_rows, _QUANT_BLOCK_ROWS), triton.cdiv(num_groups, _QUANT_BLOCK_GROUPS))
    _quantize_kernel[grid](
        x, values, scales, num_rows, num_groups,
        x.stride(0), values.stride(0), scales.stride(0),
        BLOCK_ROWS=_QUANT_BLOCK_ROWS, BLOCK_GROUPS=_QUANT_BLOCK_GROUPS, GROUP=MXFP8_BLOCK,
        MAX_VAL=E4M3_MAX, MIN_NORMAL_FIELD=_E4M3_MIN_NORMAL_EXP_FIELD,
        MANT_BITS=_E4M3_MANTISSA_BITS,
    )

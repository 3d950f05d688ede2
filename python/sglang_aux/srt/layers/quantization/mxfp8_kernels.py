"""Triton kernels for MXFP8: the quantizer and the exact-products block-scaled GEMM for sm_90.

Hopper has no MX tensor cores (and `torch._scaled_mm` rejects 1x32 block scales there). This
GEMM dequantizes each tile to BF16 in registers and runs a BF16 `tl.dot` with fp32 accumulation
(`mxfp8_gemm(kernel="bf16_dequant")`); the faster default applies the scales to FP8 dots
(`accumulating_gemm`).
That dequantization is exact whenever BF16 can hold value * 2^(byte - 127): an E4M3 value has
4 significant bits and an exponent in [-9, 8], so every scale byte in [3, 246] qualifies. So
does every block quantized from BF16 data with |x| < 2^127: its elements are multiples of
2^-133, so each rounded element is either the element itself or a multiple of a grid step
>= 2^-133 with at most 4 significant bits.

Both kernels also run under TRITON_INTERPRET=1 on CPU tensors (CI). The interpreter's BF16 math
and its fp32 -> fp8 rounding are unreliable, so the quantizer rounds to the E4M3 grid itself
(the final cast only sees representable values) and the GEMM uses fp32 dot operands there.
"""

import os

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.quantization.mxfp8 import E4M3_MAX, E8M0_BIAS, MXFP8_BLOCK

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


def _gemm_configs() -> list[triton.Config]:
    # All spill-free for sm_90 with triton 3.6 (cuobjdump -res-usage of offline builds); the
    # fp8 tile loads are cp.async-pipelined there once pointers are 16-byte aligned.
    if _INTERPRETED:  # autotuning times kernels with CUDA events; one small tile on CPU
        return [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}, num_warps=4)]
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
        for bm, bn, bk, w, s in [
            (128, 128, 64, 8, 3),
            (128, 128, 128, 8, 3),
            (128, 256, 64, 8, 3),
            (64, 128, 128, 4, 4),
            (64, 128, 64, 4, 4),
        ]
    ]


@triton.jit
def _dequant_tile(q_ptrs, s_ptrs, rows_ok, k_ok, g_ok,
                  ROWS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                  OPERAND: tl.constexpr):
    """Loads a [ROWS, BLOCK_K] e4m3 tile and its [ROWS, BLOCK_K/GROUP] scales; returns
    value * 2^(byte - 127) in OPERAND dtype. Byte 0 is 2^-127 (an fp32 subnormal)."""
    q = tl.load(q_ptrs, mask=rows_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
    byte = tl.load(s_ptrs, mask=rows_ok[:, None] & g_ok[None, :], other=0).to(tl.int32)
    scale = tl.where(byte == 0, 0x400000, byte << 23).to(tl.float32, bitcast=True)
    q = tl.reshape(q, (ROWS, BLOCK_K // GROUP, GROUP)) * scale[:, :, None]
    return tl.reshape(q, (ROWS, BLOCK_K)).to(OPERAND)


@triton.autotune(configs=_gemm_configs(), key=["N", "K"])
@triton.jit
def _gemm_kernel(
    xq_ptr, xs_ptr, wq_ptr, ws_ptr, out_ptr, M, N, K,
    stride_xq, stride_xs, stride_wq, stride_ws, stride_out,
    GROUP: tl.constexpr, OPERAND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    gs = tl.arange(0, BLOCK_K // GROUP)
    rows64 = rows.to(tl.int64)[:, None]  # T * K*H can pass 2^31 in long prefills
    cols64 = cols.to(tl.int64)[:, None]
    xq_ptrs = xq_ptr + rows64 * stride_xq + ks[None, :]
    xs_ptrs = xs_ptr + rows64 * stride_xs + gs[None, :]
    wq_ptrs = wq_ptr + cols64 * stride_wq + ks[None, :]
    ws_ptrs = ws_ptr + cols64 * stride_ws + gs[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + ks < K
        g_ok = k0 // GROUP + gs < K // GROUP
        a = _dequant_tile(xq_ptrs + k0, xs_ptrs + k0 // GROUP, rows < M, k_ok, g_ok,
                          BLOCK_M, BLOCK_K, GROUP, OPERAND)
        b = _dequant_tile(wq_ptrs + k0, ws_ptrs + k0 // GROUP, cols < N, k_ok, g_ok,
                          BLOCK_N, BLOCK_K, GROUP, OPERAND)
        acc = tl.dot(a, tl.trans(b), acc)
    out_ptrs = out_ptr + rows64 * stride_out + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def mxfp8_gemm_triton(
    xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, out: torch.Tensor
) -> None:
    """out[M, N] = dequant(xq, xs) @ dequant(wq, ws)^T with fp32 accumulation (all 2-D, last-dim
    stride 1). BF16 operands on GPU; fp32 operands under the interpreter (see module doc)."""
    for name, t in (("xq", xq), ("xs", xs), ("wq", wq), ("ws", ws), ("out", out)):
        if t.stride(-1) != 1:
            raise ValueError(f"mxfp8_gemm_triton: {name} needs last-dim stride 1, "
                             f"got strides {t.stride()}")
    m, k = xq.shape
    n = wq.shape[0]
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))
    _gemm_kernel[grid](
        xq, xs, wq, ws, out, m, n, k,
        xq.stride(0), xs.stride(0), wq.stride(0), ws.stride(0), out.stride(0),
        GROUP=MXFP8_BLOCK, OPERAND=tl.float32 if _INTERPRETED else tl.bfloat16,
    )

"""MXFP8 activations on BF16 tensor cores: `out = acc + dequant(xq, xs) @ w^T`, fp32 accumulator
carried through memory as in `accumulating_gemm`.

The activation tile is dequantized in registers (e4m3 -> fp32 * 2^(byte - 127) -> bf16) and feeds
the dot as its register operand. The weight is either
- bf16 (the draft fc kept in BF16): its tile goes from memory to shared memory and the dot as is;
- MXFP8 (values + E8M0 scales, as `quantize_mxfp8` writes them): its tile is dequantized in
  registers too and staged through shared memory (Hopper's wgmma reads B from shared only).

Exact products: e4m3 x 2^k is exact in BF16 for every scale byte in [3, 246] (see
`mxfp8_kernels`), and a bf16 x bf16 product is exact in fp32, so every rounding is the tensor
core's fp32 accumulation, in an order that only the config fixes. Hence a chain of slice calls
equals one concat call bit for bit whenever slice boundaries fall on BLOCK_K boundaries and the
config is the same (configs are picked from M and the weight format only, never K).

Variants (`DequantConfig`): pointer loads or TMA (host-built `TensorDescriptor`s, zero-filled
out of bounds); one program per output tile or a persistent grid of one program per SM walking
the tiles in grouped order (`flatten` lets the pipeliner start a tile's loads during the last
one's epilogue). Triton 3.6 accepts `tl.range(..., warp_specialize=True)` for sm_90 but leaves
this loop unpartitioned (offline build), so no variant asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sglang_aux.srt.layers.quantization.accumulating_gemm import (
    _INTERPRETED,
    _check_acc,
    _check_scaled_operands,
    _start_tile,
    _store_tile,
    _tile_coords,
)
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK


@dataclass(frozen=True)
class DequantConfig:
    block_m: int
    block_n: int
    block_k: int  # a multiple of the 32-wide scale group
    num_warps: int
    num_stages: int
    tma: bool = False
    persistent: bool = False
    group_m: int = 8
    # MXFP8 weights: 0 dequantizes weight tiles inside the GEMM loop (staged through shared
    # memory); R > 0 first dequantizes R weight rows at a time to a BF16 scratch [R, K], then
    # runs the bf16-weight loop on those output columns.
    weight_chunk: int = 0


def _name(c: DequantConfig) -> str:
    kind = ("tma_" if c.tma else "ptr_") + ("p_" if c.persistent else "")
    chunk = f"_wc{c.weight_chunk}" if c.weight_chunk else ""
    return f"{kind}m{c.block_m}n{c.block_n}k{c.block_k}w{c.num_warps}s{c.num_stages}{chunk}"


# Candidates for sm_90, from offline triton 3.6 builds (registers, spills, shared memory:
# benchmark/aux_memory/sm90_register_report.py). Each wgmma is waited for before the next
# dequant (its register operand is rewritten), so MMA/dequant overlap comes from a second
# resident CTA: m128n128k64w8s3 over TMA fits two per SM (128 registers, 96 KiB) with a bf16
# weight. The pointer-load m128n256 config is the probe's design (5.63 ms at 3 stages), the one
# to beat; on the H200 m128n256 fits 2 stages (3 need 240 KiB of the 227 KiB shared memory).
BF16_DOT_CANDIDATES = {_name(c): c for c in [
    DequantConfig(128, 128, 64, 8, 3, tma=True, persistent=True),
    DequantConfig(128, 128, 64, 8, 4, tma=True, persistent=True),
    DequantConfig(128, 128, 128, 8, 3, tma=True, persistent=True),
    DequantConfig(128, 256, 64, 8, 2, tma=True, persistent=True),
    DequantConfig(64, 128, 64, 4, 4, tma=True, persistent=True),
    DequantConfig(64, 256, 64, 4, 3, tma=True, persistent=True),
    DequantConfig(256, 128, 64, 8, 3, tma=True, persistent=True),  # MXFP8 w: half the B work
    DequantConfig(128, 128, 64, 8, 3, tma=True),
    DequantConfig(128, 256, 64, 8, 2),
    DequantConfig(128, 128, 64, 8, 3),
    DequantConfig(64, 64, 64, 4, 4),
]}
# MXFP8 weights through a BF16 scratch of 1024 / 2048 rows (14.7 / 29 MiB per 7168 columns of
# K): one extra pass over the weight (1 byte read, 2 written per element), and the GEMM loop
# is the bf16-weight one.
WEIGHT_CHUNK_CANDIDATES = {_name(c): c for c in [
    DequantConfig(128, 128, 64, 8, 3, tma=True, persistent=True, weight_chunk=1024),
    DequantConfig(128, 128, 64, 8, 3, tma=True, persistent=True, weight_chunk=2048),
    DequantConfig(128, 256, 64, 8, 2, tma=True, persistent=True, weight_chunk=2048),
]}
_DEQUANT_ROWS, _DEQUANT_COLS = 32, 256  # tile of the weight pre-pass


@triton.jit
def _dequant(q, byte, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
             OPERAND: tl.constexpr):
    """[ROWS, BLOCK_K] e4m3 values and their [ROWS, BLOCK_K / GROUP] scale bytes ->
    value * 2^(byte - 127) in OPERAND, exact (byte 0 is the fp32 subnormal 2^-127)."""
    scale = tl.where(byte == 0, 0x400000, byte.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    v = tl.reshape(q.to(OPERAND), (ROWS, BLOCK_K // GROUP, GROUP)) * scale.to(OPERAND)[:, :, None]
    return tl.reshape(v, (ROWS, BLOCK_K))


@triton.jit
def _dequant_dot_kernel(
    x_src, xs_ptr, w_src, ws_ptr, acc_ptr, out_ptr, M, N, K,
    stride_x, stride_xs, stride_w, stride_ws, stride_acc, stride_out, num_programs,
    LOAD_ACC: tl.constexpr, W_MXFP8: tl.constexpr, TMA: tl.constexpr,
    OPERAND: tl.constexpr, PRECISION: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    ks = tl.arange(0, BLOCK_K)
    gs = tl.arange(0, BLOCK_K // GROUP)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), num_tiles, num_programs, flatten=True):
        row0, col0 = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows, cols = row0 + tl.arange(0, BLOCK_M), col0 + tl.arange(0, BLOCK_N)
        row_ok, col_ok = rows < M, cols < N
        rows64, cols64 = rows.to(tl.int64)[:, None], cols.to(tl.int64)[:, None]
        if not TMA:
            x_ptrs = x_src + rows64 * stride_x + ks[None, :]
            w_ptrs = w_src + cols64 * stride_w + ks[None, :]
        xs_ptrs = xs_ptr + rows64 * stride_xs + gs[None, :]
        ws_ptrs = ws_ptr + cols64 * stride_ws + gs[None, :]
        acc = _start_tile(acc_ptr, stride_acc, rows, cols, M, N, LOAD_ACC, BLOCK_M, BLOCK_N)
        for k0 in range(0, K, BLOCK_K):
            k_ok = k0 + ks < K
            g_ok = (k0 // GROUP + gs < K // GROUP)[None, :]
            if TMA:  # zero-filled out of bounds
                xq = x_src.load([row0, k0])
                w = w_src.load([col0, k0])
            else:
                xq = tl.load(x_ptrs + k0, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_ptrs + k0, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
            xb = tl.load(xs_ptrs + k0 // GROUP, mask=row_ok[:, None] & g_ok, other=0)
            a = _dequant(xq, xb, BLOCK_M, BLOCK_K, GROUP, OPERAND)  # [BM, BK]
            if W_MXFP8:
                wb = tl.load(ws_ptrs + k0 // GROUP, mask=col_ok[:, None] & g_ok, other=0)
                b = _dequant(w, wb, BLOCK_N, BLOCK_K, GROUP, OPERAND)  # [BN, BK]
            else:
                b = w.to(OPERAND)
            acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        _store_tile(out_ptr, stride_out, rows, cols, M, N, acc)


@triton.jit
def _dequant_rows_kernel(q_ptr, s_ptr, out_ptr, R, K, stride_q, stride_s, stride_out,
                         GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
                         OPERAND: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    gs = tl.program_id(1) * (BLOCK_K // GROUP) + tl.arange(0, BLOCK_K // GROUP)
    rows64 = rows.to(tl.int64)[:, None]
    row_ok = rows[:, None] < R
    q = tl.load(q_ptr + rows64 * stride_q + ks[None, :], mask=row_ok & (ks < K)[None, :])
    b = tl.load(s_ptr + rows64 * stride_s + gs[None, :],
                mask=row_ok & (gs < K // GROUP)[None, :], other=0)
    tl.store(out_ptr + rows64 * stride_out + ks[None, :],
             _dequant(q, b, BLOCK_R, BLOCK_K, GROUP, OPERAND), mask=row_ok & (ks < K)[None, :])


def dequantize_rows(q: torch.Tensor, s: torch.Tensor, out: torch.Tensor) -> None:
    """out[R, K] = q * 2^(s - 127) per 32-wide group, exact (see `mxfp8_kernels`), into a bf16
    or (interpreter, exact runs) fp32 `out`; all three may be row-strided views."""
    r, k = q.shape
    _dequant_rows_kernel[(triton.cdiv(r, _DEQUANT_ROWS), triton.cdiv(k, _DEQUANT_COLS))](
        q, s, out, r, k, q.stride(0), s.stride(0), out.stride(0),
        GROUP=MXFP8_BLOCK, BLOCK_R=_DEQUANT_ROWS, BLOCK_K=_DEQUANT_COLS,
        OPERAND=tl.float32 if out.dtype == torch.float32 else tl.bfloat16)


def _num_programs(device: torch.device, num_tiles: int, cfg: DequantConfig) -> int:
    if not cfg.persistent:
        return num_tiles
    if _INTERPRETED:  # a few programs, so the persistent tile walk is exercised on CPU
        return min(num_tiles, 3)
    return min(num_tiles, torch.cuda.get_device_properties(device).multi_processor_count)


def _source(t: torch.Tensor, block_rows: int, cfg: DequantConfig
            ) -> torch.Tensor | TensorDescriptor:
    if not cfg.tma:
        return t
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], [block_rows, cfg.block_k])


def check_weight_operands(xq: torch.Tensor, xs: torch.Tensor,
                          w: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                          out: torch.Tensor, acc: torch.Tensor | None
                          ) -> tuple[bool, torch.Tensor, torch.Tensor, int, int, int]:
    """The checks every MXFP8-activation GEMM with either weight format makes; returns (the
    weight is MXFP8, its values, its scales (`xs` for a dense weight: never read), M, K, N)."""
    w_mxfp8 = isinstance(w, tuple)
    wv, ws = w if w_mxfp8 else (w, xs)
    m, k, n = _check_scaled_operands(xq, xs, ("w", wv), ws)
    if not w_mxfp8 and wv.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"a dense weight must be bfloat16 (float32 for exact runs), got "
                         f"{wv.dtype}: e4m3 x 2^k is exact in BF16, not in fp16")
    _check_acc(acc, out, m, n)
    return w_mxfp8, wv, ws, m, k, n


def bf16_dot_gemm_accumulate(xq: torch.Tensor, xs: torch.Tensor,
                             w: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                             out: torch.Tensor, acc: torch.Tensor | None,
                             config: DequantConfig) -> None:
    """out[M, N] = acc + dequant(xq, xs)[M, K] @ W[N, K]^T (fp32 sum, one rounding into out).

    `w`: a bf16 weight [N, K] (fp32 for exact-comparison runs), or an MXFP8 pair (values
    [N, K] e4m3fn, scales [N, K/32] uint8). Operands may be column slices of wider buffers
    (offsets multiples of 32); `out` may be `acc` (in place)."""
    w_mxfp8, wv, ws, m, k, n = check_weight_operands(xq, xs, w, out, acc)
    fp32 = _INTERPRETED or (not w_mxfp8 and wv.dtype == torch.float32)
    if not (w_mxfp8 and config.weight_chunk):
        _launch(xq, xs, wv, ws if w_mxfp8 else None, out, acc, config, fp32)
        return
    rows = min(n, config.weight_chunk)
    scratch = torch.empty(rows, k, device=wv.device,
                          dtype=torch.float32 if fp32 else torch.bfloat16)  # [R, K]
    for n0 in range(0, n, rows):
        n1 = min(n, n0 + rows)
        wb = scratch[:n1 - n0]
        dequantize_rows(wv[n0:n1], ws[n0:n1], wb)
        _launch(xq, xs, wb, None, out[:, n0:n1], None if acc is None else acc[:, n0:n1],
                config, fp32)


def _launch(xq: torch.Tensor, xs: torch.Tensor, wv: torch.Tensor, ws: torch.Tensor | None,
            out: torch.Tensor, acc: torch.Tensor | None, cfg: DequantConfig, fp32: bool) -> None:
    (m, k), n = xq.shape, wv.shape[0]
    num_tiles = triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n)
    programs = _num_programs(xq.device, num_tiles, cfg)
    _dequant_dot_kernel[(programs,)](
        _source(xq, cfg.block_m, cfg), xs, _source(wv, cfg.block_n, cfg),
        xs if ws is None else ws,  # never read for a bf16 weight
        out if acc is None else acc, out, m, n, k,
        xq.stride(0), xs.stride(0), wv.stride(0), 0 if ws is None else ws.stride(0),
        0 if acc is None else acc.stride(0), out.stride(0), programs,
        LOAD_ACC=acc is not None, W_MXFP8=ws is not None, TMA=cfg.tma,
        OPERAND=tl.float32 if fp32 else tl.bfloat16,
        PRECISION="ieee", GROUP=MXFP8_BLOCK, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )

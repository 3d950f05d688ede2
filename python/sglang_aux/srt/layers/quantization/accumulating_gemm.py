"""Triton GEMMs that carry their fp32 accumulator through memory: `out = acc + x @ w^T`.

A projection split along K into slices that arrive one at a time (the draft `fc` over streamed
aux states) runs one call per slice: the first starts each output tile from zeros, later ones
load the tile's fp32 partial sum from `acc`; every call stores the fp32 sum into `out` (the
accumulator itself between slices, in place; any float dtype for the final rounding). A call
over the concat visits the same K tiles in the same order and carries the same fp32 values in
registers, so a chain of slice calls and one concat call round identically and give equal bits,
provided every slice boundary falls on a K-tile boundary and all calls use one `GemmConfig`
(configs are chosen from M and N only, never from K, for this reason).

Two operand formats:
- dense (bf16/fp16/fp32): `tl.dot` over `DENSE_BLOCK_K` columns per step, the sum carried in
  the tensor-core accumulator. Bitwise slice == concat needs H % DENSE_BLOCK_K == 0.
- MXFP8 (e4m3 values, one E8M0 byte per 32 along K): one FP8 tensor-core dot per 32-wide scale
  group (a single k32 wgmma on sm_90), its fp32 result times 2^(sx + sw - 254) added to the fp32
  accumulator. The scales are powers of two, so the scaling itself is exact (unless fp32 under-
  or overflows); the roundings are the tensor core's inside one group and one fp32 add per group.
  The K step is one scale group, so any H % 32 == 0 gives bitwise slice == concat.
  Hopper's FP8 MMA accumulates with reduced precision; promoting to fp32 after every 32 products
  keeps that error at the group level instead of growing with K. Its cost bounds this design:
  an FMUL and an FFMA per output element and group are, at M 4096, N 7168, K 43008, 7.9e10
  lane instructions, ~2.4 ms of issue on all 528 H200 schedulers before any MMA.
`dequant_gemm` (MXFP8 on BF16 tensor cores) shares the tile walk and the accumulator load/store.

Under TRITON_INTERPRET=1 (CPU CI) operands are widened to fp32 before the dot (the interpreter's
fp8/bf16 math is unreliable); the tile walk, and so the bitwise property, is the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DENSE_BLOCK_K = 64


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    group_m: int = 8  # output-tile rows swept together, for L2 reuse of the weight tiles


# Hand-picked for sm_90 (H100/H200), not autotuned: the FP8-dot kernel holds the accumulator and
# a fresh dot result per tile (2 * BM * BN fp32 over the warps' registers), so BM * BN / num_warps
# stays at or below 2048 (128 registers a thread for both); BLOCK_K is one scale group, so
# 4-6 stages of (BM + BN) * 32 bytes stay small. `mxfp8_gemm_choice` names them and picks one;
# benchmark/aux_memory/bench_mxfp8_gemm.py times them. At M 4096, N 7168, K 43008 the H200 gave
# 7.67 / 9.65 / 10.89 ms for these three; m128n128w8s4/s6 and m64n256w8s4 (10.5-12.6) dropped.
FP8_DOT_CANDIDATES = {
    "m64n128w4s6": GemmConfig(64, 128, 4, 6),
    "m128n64w4s6": GemmConfig(128, 64, 4, 6),
    "m64n64w4s6": GemmConfig(64, 64, 4, 6),
}
DENSE_CANDIDATES = {
    "m128n128w8s4": GemmConfig(128, 128, 8, 4),
    "m128n256w8s3": GemmConfig(128, 256, 8, 3),
    "m64n64w4s4": GemmConfig(64, 64, 4, 4),
}
# Up to this many rows (verify-sized forwards) the GEMM streams the weight: narrow tiles give
# N/64 programs, enough to keep every SM loading.
SMALL_M = 64
_DENSE_DEFAULTS = {False: "m128n256w8s3", True: "m64n64w4s4"}  # key: fp32 or M <= SMALL_M
INTERPRETER_CONFIG = GemmConfig(16, 16, 4, 1, group_m=2)


def default_dense_config(m: int, fp32: bool = False) -> GemmConfig:
    """The dense tile config for an M-row GEMM: depends on M and the dtype, never on K (see
    the module doc). fp32 operands (exact-comparison runs) take the small tile: wide fp32
    tiles spill on sm_90."""
    if _INTERPRETED:
        return INTERPRETER_CONFIG
    return DENSE_CANDIDATES[_DENSE_DEFAULTS[fp32 or m <= SMALL_M]]


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """First row and column of output tile `pid` in grouped order: GROUP_M tile rows share
    each weight tile while it is in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _tile_origin(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Rows and columns of this program's output tile (one program per tile)."""
    row0, col0 = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return row0 + tl.arange(0, BLOCK_M), col0 + tl.arange(0, BLOCK_N)


@triton.jit
def _start_tile(acc_ptr, stride_acc, rows, cols, M, N, LOAD_ACC: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if LOAD_ACC:
        ptrs = acc_ptr + rows.to(tl.int64)[:, None] * stride_acc + cols[None, :]
        return tl.load(ptrs, mask=(rows[:, None] < M) & (cols[None, :] < N), other=0.0)
    return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def _store_tile(out_ptr, stride_out, rows, cols, M, N, acc):
    ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _dense_kernel(
    x_ptr, w_ptr, acc_ptr, out_ptr, M, N, K,
    stride_x, stride_w, stride_acc, stride_out,
    LOAD_ACC: tl.constexpr, PRECISION: tl.constexpr, OPERAND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    rows, cols = _tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + ks[None, :]
    w_ptrs = w_ptr + cols.to(tl.int64)[:, None] * stride_w + ks[None, :]
    acc = _start_tile(acc_ptr, stride_acc, rows, cols, M, N, LOAD_ACC, BLOCK_M, BLOCK_N)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + ks < K)[None, :]
        a = tl.load(x_ptrs + k0, mask=(rows < M)[:, None] & k_ok, other=0.0)
        b = tl.load(w_ptrs + k0, mask=(cols < N)[:, None] & k_ok, other=0.0)
        acc = tl.dot(a.to(OPERAND), tl.trans(b.to(OPERAND)), acc, input_precision=PRECISION)
    _store_tile(out_ptr, stride_out, rows, cols, M, N, acc)


@triton.jit
def _mxfp8_kernel(
    xq_ptr, sx_ptr, wq_ptr, sw_ptr, acc_ptr, out_ptr, M, N, K,
    stride_xq, stride_sx, stride_wq, stride_sw, stride_acc, stride_out,
    LOAD_ACC: tl.constexpr, OPERAND: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
):
    rows, cols = _tile_origin(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    row_ok, col_ok = rows < M, cols < N
    ks = tl.arange(0, GROUP)
    xq_ptrs = xq_ptr + rows.to(tl.int64)[:, None] * stride_xq + ks[None, :]
    wq_ptrs = wq_ptr + cols.to(tl.int64)[:, None] * stride_wq + ks[None, :]
    acc = _start_tile(acc_ptr, stride_acc, rows, cols, M, N, LOAD_ACC, BLOCK_M, BLOCK_N)
    # Scale factors 2^(byte - 127) per group for the tile's rows / columns: contiguous fp32
    # vectors (see _scale_factors), so no per-element address or bit work in the loop. The
    # pipeliner only stages dot operands, so group g + 1's factors are loaded by hand one
    # iteration ahead, hiding their L2 latency behind group g's dot.
    num_groups = K // GROUP
    sa = tl.load(sx_ptr + rows, mask=row_ok, other=0.0)
    sb = tl.load(sw_ptr + cols, mask=col_ok, other=0.0)
    for g in range(0, num_groups):
        a = tl.load(xq_ptrs + g * GROUP, mask=row_ok[:, None], other=0.0)  # [BM, 32] e4m3
        b = tl.load(wq_ptrs + g * GROUP, mask=col_ok[:, None], other=0.0)  # [BN, 32] e4m3
        nxt = tl.minimum(g + 1, num_groups - 1)  # the last iteration reloads its own group
        sa_next = tl.load(sx_ptr + nxt * stride_sx + rows, mask=row_ok, other=0.0)
        sb_next = tl.load(sw_ptr + nxt * stride_sw + cols, mask=col_ok, other=0.0)
        d = tl.dot(a.to(OPERAND), tl.trans(b.to(OPERAND)))  # fresh fp32 group sum
        # Row scale into d in place, then one FMA with the column scale: no third
        # [BM, BN] tile of registers (an outer product of the scales would need one).
        acc += (d * sa[:, None]) * sb[None, :]
        sa, sb = sa_next, sb_next
    _store_tile(out_ptr, stride_out, rows, cols, M, N, acc)


def _scale_factors(scales: torch.Tensor) -> torch.Tensor:
    """[R, G] E8M0 bytes -> [G, R] fp32 2^(byte - 127), exact (byte 0: the subnormal 2^-127).
    Transposed so a group's factors for a tile are one contiguous load."""
    s = scales.t().contiguous().to(torch.int32)
    return torch.where(s == 0, 1 << 22, s << 23).view(torch.float32)


def _check_rows(name: str, t: torch.Tensor) -> None:
    if t.dim() != 2 or t.stride(-1) != 1:
        raise ValueError(f"{name} must be 2-D with last-dim stride 1, got shape "
                         f"{tuple(t.shape)} strides {t.stride()}")


def _check_scaled_operands(xq: torch.Tensor, xs: torch.Tensor, w: tuple[str, torch.Tensor],
                           ws: torch.Tensor) -> tuple[int, int, int]:
    """(M, K, N) of an MXFP8 input `xq` [M, K] (scales `xs`) against a weight `w` (its name,
    [N, K]) with scales `ws`: rows of all four checked, K shared and a multiple of 32."""
    w_name, wt = w
    for name, t in (("xq", xq), ("xs", xs), (w_name, wt), ("ws", ws)):
        _check_rows(name, t)
    (m, k), n = xq.shape, wt.shape[0]
    if wt.shape[1] != k or k % MXFP8_BLOCK != 0:
        raise ValueError(f"xq {tuple(xq.shape)} and {w_name} {tuple(wt.shape)} must share a K "
                         f"that is a multiple of {MXFP8_BLOCK}")
    return m, k, n


def _check_acc(acc: torch.Tensor | None, out: torch.Tensor, m: int, n: int) -> None:
    _check_rows("out", out)
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out {tuple(out.shape)} != expected {(m, n)}")
    if acc is not None:
        _check_rows("acc", acc)
        if tuple(acc.shape) != (m, n) or acc.dtype != torch.float32:
            raise ValueError(f"acc must be float32 {(m, n)}, got {acc.dtype} "
                             f"{tuple(acc.shape)}")


def _grid(m: int, n: int, cfg: GemmConfig) -> tuple[int]:
    return (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)


def dense_gemm_accumulate(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor,
                          acc: torch.Tensor | None = None,
                          config: GemmConfig | None = None) -> None:
    """out[M, N] = acc + x[M, K] @ w[N, K]^T (fp32 sum, one rounding into out's dtype).
    `w` may be a column slice of a wider weight; `out` may be `acc` (in place)."""
    _check_rows("x", x)
    _check_rows("w", w)
    (m, k), n = x.shape, w.shape[0]
    if w.shape[1] != k or w.dtype != x.dtype:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} and w {tuple(w.shape)} {w.dtype} "
                         "must share K and dtype")
    _check_acc(acc, out, m, n)
    fp32 = x.dtype == torch.float32
    cfg = config or default_dense_config(m, fp32)
    _dense_kernel[_grid(m, n, cfg)](
        x, w, out if acc is None else acc, out, m, n, k,
        x.stride(0), w.stride(0), 0 if acc is None else acc.stride(0), out.stride(0),
        LOAD_ACC=acc is not None, PRECISION="ieee" if fp32 else "tf32",
        OPERAND=tl.float32 if _INTERPRETED else
        {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(x.dtype, tl.float32),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=DENSE_BLOCK_K, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def fp8_dot_gemm_accumulate(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor,
                            ws: torch.Tensor, out: torch.Tensor, acc: torch.Tensor | None,
                            config: GemmConfig) -> None:
    """out[M, N] = acc + dequant(xq, xs)[M, K] @ dequant(wq, ws)[N, K]^T with FP8 dots per
    scale group. Operands may be column slices of wider buffers (K and offsets multiples of 32)."""
    m, k, n = _check_scaled_operands(xq, xs, ("wq", wq), ws)
    _check_acc(acc, out, m, n)
    cfg = config
    sx, sw = _scale_factors(xs), _scale_factors(ws)  # [K/32, M], [K/32, N]
    _mxfp8_kernel[_grid(m, n, cfg)](
        xq, sx, wq, sw, out if acc is None else acc, out, m, n, k,
        xq.stride(0), sx.stride(0), wq.stride(0), sw.stride(0),
        0 if acc is None else acc.stride(0), out.stride(0),
        LOAD_ACC=acc is not None, OPERAND=tl.float32 if _INTERPRETED else tl.float8e4nv,
        GROUP=MXFP8_BLOCK, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )

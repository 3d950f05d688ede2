"""Row GEMV `y[1, N] = x[1, K] @ W[N, K]^T (+ bias)`: one row, as a bs-1 decode step has it.

At one row a projection is a weight read, and `tl.dot` pads the row to a 16-row operand; this
kernel streams `[BLOCK_N, BLOCK_K]` tiles of W along its contiguous K and multiplies them with
the row in fp32 registers (no tensor cores), one reduction at the end. Each program owns
BLOCK_N outputs and the whole K, so the sum is in one order on every run (deterministic) and
needs no second pass.

Fused variants (constexpr flags):
- `HAS_NORM`: x is the pre-norm stream; every program loads the whole row once (K_PAD
  elements, a few KB from L2), takes its RMS, then normalizes each K slice as it streams,
  rounded to the dtype as the unfused `linear(norm(x))` sees it. With `HAS_RESIDUAL` the stream
  is `x + residual` rounded to the dtype; program 0 writes it out (the new residual).
- `HAS_BIAS`: bias added to the fp32 sum before the one rounding.
The SiLU-mul stays its own launch: fused into gate_up's output or down's input it cost more on
the H200 than the launch it saves (docs/kernels.md).

The tile table (`row_gemv_config`) is fixed per shape, never autotuned, so a CUDA graph replays
what was captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_DTYPES
from sglang_aux.srt.layers.triton_ops.grid_dependency import (
    resolve_pdl,
    wait_for_previous_kernel,
)


@dataclass(frozen=True)
class RowGemvConfig:
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 1


@triton.jit
def _input_tile(X, R, NW, k, k_mask, rstd, HAS_NORM: tl.constexpr,
                HAS_RESIDUAL: tl.constexpr):
    """The row's columns k as the unfused layers would feed the GEMM, in fp32."""
    dtype = X.dtype.element_ty
    x = tl.load(X + k, mask=k_mask, other=0.0)
    if HAS_NORM:
        if HAS_RESIDUAL:
            x = (x.to(tl.float32) + tl.load(R + k, mask=k_mask, other=0.0).to(tl.float32)
                 ).to(dtype)
        nw = tl.load(NW + k, mask=k_mask, other=0.0).to(tl.float32)
        x = (x.to(tl.float32) * rstd * nw).to(dtype)
    return x.to(tl.float32)[None, :]


@triton.jit
def row_dot(X, R, NW, W, R_Out, rn, n_mask, K, stride_w, eps, WRITES_STREAM,
            HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, PDL: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PAD: tl.constexpr):
    """The fp32 sums `[BLOCK_N]` of W's rows `rn` with the (normed) row; the program with
    `WRITES_STREAM` stores the new residual stream. The kernels of the fused epilogues
    (`paired_row_gemv.py`) share it, so their sums are this kernel's."""
    rk = tl.arange(0, BLOCK_K)
    dtype = X.dtype.element_ty
    w_rows = W + rn[:, None].to(tl.int64) * stride_w
    # The first weight tile is in flight before the norm's reduction waits on the row (and,
    # launched dependent, before the previous kernel has finished: no kernel writes W), and
    # each later one before the tile ahead of it is multiplied (two tiles in registers).
    w = tl.load(w_rows + rk[None, :], mask=n_mask[:, None] & (rk < K)[None, :], other=0.0)
    wait_for_previous_kernel(PDL)
    rstd = 0.0
    if HAS_NORM:
        kk = tl.arange(0, K_PAD)
        kk_mask = kk < K
        s = tl.load(X + kk, mask=kk_mask, other=0.0)
        if HAS_RESIDUAL:
            s = (s.to(tl.float32) + tl.load(R + kk, mask=kk_mask, other=0.0).to(tl.float32)
                 ).to(dtype)
            if WRITES_STREAM:
                tl.store(R_Out + kk, s, mask=kk_mask)
        s = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_next = k0 + BLOCK_K + rk
        w_next = tl.load(w_rows + k_next[None, :],
                         mask=n_mask[:, None] & (k_next < K)[None, :], other=0.0)
        k = k0 + rk
        acc += w.to(tl.float32) * _input_tile(X, R, NW, k, k < K, rstd, HAS_NORM, HAS_RESIDUAL)
        w = w_next
    return tl.sum(acc, axis=1)


@triton.jit
def _row_gemv_kernel(X, R, NW, W, B, Y, R_Out, n_out, K, stride_w, eps,
                     HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     HAS_BIAS: tl.constexpr, PDL: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PAD: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < n_out
    y = row_dot(X, R, NW, W, R_Out, rn, n_mask, K, stride_w, eps, pid == 0, HAS_NORM,
                HAS_RESIDUAL, PDL, BLOCK_N, BLOCK_K, K_PAD)
    if HAS_BIAS:
        y += tl.load(B + rn, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(Y + rn, y.to(X.dtype.element_ty), mask=n_mask)


def check_row_gemv_inputs(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          norm_weight: torch.Tensor | None, residual: torch.Tensor | None
                          ) -> tuple[int, int]:
    """(N, K) of a row GEMV's inputs; a ValueError naming the first that does not fit."""
    if x.dim() != 2 or x.shape[0] != 1 or not x.is_contiguous():
        raise ValueError(f"row_gemv needs one contiguous row [1, K], got {tuple(x.shape)}")
    k = x.shape[1]
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} is not a contiguous [N, {k}] for "
                         f"the input {tuple(x.shape)}")
    if x.dtype != weight.dtype or x.dtype not in GEMV_DTYPES:
        raise ValueError(f"row_gemv takes x and weight of one dtype of {GEMV_DTYPES}, "
                         f"got {x.dtype} and {weight.dtype}")
    n = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} does not match the weight's {n} rows")
    if residual is not None and (norm_weight is None or residual.shape != x.shape
                                 or not residual.is_contiguous()):
        raise ValueError(f"a residual {tuple(residual.shape)} needs a norm and the input's "
                         f"shape {tuple(x.shape)}, contiguous")
    if norm_weight is not None and tuple(norm_weight.shape) != (k,):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} does not match K = {k}")
    return n, k


def row_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
             norm_weight: torch.Tensor | None = None, eps: float = 0.0,
             residual: torch.Tensor | None = None, config: RowGemvConfig | None = None,
             pdl: bool | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[1, K]` contiguous, weight `[N, K]` contiguous -> `[1, N]` in x's dtype.

    With `norm_weight` `[K]`, x is the residual stream before an RMSNorm of `eps` (plus
    `residual` when given) and the result is `(y, stream)`: the stream is a new tensor when
    `residual` is given, else x itself, as the unfused add + norm returns it. `pdl`: launch
    dependent (`grid_dependency.py`; None reads its bench switch)."""
    n, k = check_row_gemv_inputs(x, weight, bias, norm_weight, residual)
    pdl = resolve_pdl(pdl, x)
    cfg = config or row_gemv_config(n, norm_weight is not None)
    y = torch.empty((1, n), dtype=x.dtype, device=x.device)
    stream = torch.empty_like(x) if residual is not None else x
    _row_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, weight,
        bias if bias is not None else weight, y, stream, n, k, weight.stride(0), eps,
        HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, PDL=pdl, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, K_PAD=triton.next_power_of_2(k), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, launch_pdl=pdl)
    return y if norm_weight is None else (y, stream)


# Outputs from which a projection counts as wide (gate_up, the LM head): its many programs
# keep the device busy with short rows of 4 outputs.
WIDE_N = 8192


def row_gemv_config(n_out: int, fused_norm: bool = False) -> RowGemvConfig:
    """The tiles measured fastest on the H200 at Qwen2.5-1.5B's projections
    (`bench_gemv.py --row-configs`, docs/kernels.md): a fused norm amortizes its row
    statistics over 8 outputs a program unless the projection is wide."""
    if n_out >= WIDE_N:
        return RowGemvConfig(block_n=4, block_k=512, num_warps=4, num_stages=3)
    if fused_norm:
        return RowGemvConfig(block_n=8, block_k=1024, num_warps=8)
    return NARROW_TILE


# A narrow unfused projection's tile (o_proj, down): its 2,048-wide K requests more of the
# weight before a dependent launch's wait. Under PDL on an H100: o_proj 2.77 -> 2.54 us, down
# 11.66 -> 10.28 us against the 2 x 1,024 tile it replaced, and the bs-1 decode replay 1.526 ->
# 1.498 ms (docs/kernels.md).
NARROW_TILE = RowGemvConfig(block_n=4, block_k=2048, num_warps=8)

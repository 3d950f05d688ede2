"""Block GEMV `y[M, N] = x[M, K] @ W[N, K]^T (+ bias)` for a few rows (M <= 32), as a verify
step of one request (16 tokens) or the draft's block forward has them. A candidate: measured
against cuBLAS by `benchmark/spec_decode/bench_block_gemv.py`, routed nowhere by default.

At 16 rows a projection is still a weight read. Each program owns `BLOCK_N` weight rows and
streams `[BLOCK_N, BLOCK_K]` tiles of W along its contiguous K once for all rows: the tile is
the dot's wide operand and the rows of x, padded to 16 (32 above 16) and masked, its narrow one
(`tl.dot(W_tile, x_tile^T)`, fp32 accumulation on tensor cores). With the weight on the wide
side the dot keeps its natural shape at any row count (Hopper's wgmma wants 64 rows on that
side; a 16-row x there would be padded instead). As in the row GEMV, the next tile's load is
issued before the current one is multiplied (`prefetch`; off, Triton's pipeliner alone stages
the loads).

Split K (`split_k` > 1, for a long K and few weight rows: the down projection, the draft's fc):
program `(n, s)` takes the s-th slice of K and stores its fp32 partial; a second launch sums the
partials in slice order and applies the epilogue. One order on every launch: deterministic, and
a graph replay equals eager bitwise.

Fused variants (constexpr flags):
- `HAS_NORM`: x is the residual stream before an RMSNorm. Sixteen rows of statistics do not fit
  in registers the way one row does, and a first pass over them would wait in front of the
  stream, so the kernel takes them in the same pass: it multiplies `x * norm_weight` (rounded
  to the dtype) and accumulates each row's sum of squares as it streams, then scales the
  product's columns by `rsqrt(mean + eps)` in the epilogue (the split-K launch stores the sums
  beside the partials). The unfused path rounds `x * rstd * w` once where this rounds `x * w`
  once: the same error against fp64, not the same bits; in fp16, `x * w` must be finite.
  With `HAS_RESIDUAL` the stream is `x + residual` rounded to the dtype, written out by the
  programs of the first weight rows (the new residual, the fused add + norm's contract).
- `HAS_BIAS`: the bias added to the fp32 sum before the one rounding.

The tiles come from a table by N and K (`block_gemv_config`), fixed per shape, never autotuned,
so a CUDA graph replays what was captured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_DTYPES

# Rows ride in one narrow dot operand of 16, or 32 above 16; more rows are a GEMM, cuBLAS's job.
MIN_BLOCK_M = 16
MAX_ROWS = 32
# Outputs from which a projection counts as wide (gate_up, the LM head): enough programs with
# long tiles to keep every SM streaming.
WIDE_N = 8192
# K from which a narrow projection (down 8960, the draft's fc 5 x 1536) splits K: its few
# programs would each stream too long a row alone.
LONG_K = 4096


@dataclass(frozen=True)
class BlockGemvConfig:
    block_n: int  # weight rows (outputs) a program owns, >= 16 (the dot's minimum)
    block_k: int
    split_k: int = 1  # slices of K, each its own program; > 1 adds the reduce launch
    num_warps: int = 4
    num_stages: int = 1
    prefetch: bool = True  # issue the next tile's load before the current dot

    def __post_init__(self):
        for name in ("block_n", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} {value} is not a power of two >= 16")
        if self.split_k < 1:
            raise ValueError(f"split_k {self.split_k} < 1")


def block_gemv_config(n_out: int, k: int) -> BlockGemvConfig:
    """The table's tiles for an `[n_out, k]` weight. Not yet measured: the starting points of
    the H200 sweep (`bench_block_gemv.py --configs`, docs/kernels.md), which replaces them."""
    if n_out >= WIDE_N:
        return BlockGemvConfig(block_n=64, block_k=128, num_warps=4, num_stages=3)
    if k >= LONG_K:
        return BlockGemvConfig(block_n=32, block_k=256, split_k=4, num_warps=4)
    return BlockGemvConfig(block_n=16, block_k=256, num_warps=4)


@triton.jit
def _dot(w, xt, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(w, xt, acc, input_precision="ieee")
    return tl.dot(w, xt, acc)


@triton.jit
def _input_tile(X, R, NW, R_Out, stride_x, rm, m_mask, k, k_mask, ss, stream_rows,
                HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Columns k of the rows rm, transposed `[BLOCK_K, BLOCK_M]`, as the dot takes them
    (times the norm weight, rstd pending), and the rows' sums of squares so far."""
    dtype = X.dtype.element_ty
    offs = rm[None, :] * stride_x + k[:, None]
    mask = k_mask[:, None] & m_mask[None, :]
    x = tl.load(X + offs, mask=mask, other=0.0)
    if HAS_NORM:
        if HAS_RESIDUAL:
            x = (x.to(tl.float32) + tl.load(R + offs, mask=mask, other=0.0).to(tl.float32)
                 ).to(dtype)
            tl.store(R_Out + offs, x, mask=k_mask[:, None] & (rm < stream_rows)[None, :])
        s = x.to(tl.float32)
        ss += tl.sum(s * s, axis=0)
        nw = tl.load(NW + k, mask=k_mask, other=0.0)
        x = (s * nw.to(tl.float32)[:, None]).to(dtype)
    return x, ss


@triton.jit
def _epilogue(acc, ss, B, Y, rn, rm, out_mask, n_out, K, stride_y, eps,
              HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc `[BLOCK_N, BLOCK_M]`: scaled by each row's rstd, plus the bias, one rounding."""
    if HAS_NORM:
        acc = acc * tl.rsqrt(ss / K + eps)[None, :]
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=rn < n_out, other=0.0).to(tl.float32)[:, None]
    tl.store(Y + rm[None, :] * stride_y + rn[:, None], acc.to(Y.dtype.element_ty), mask=out_mask)


@triton.jit
def _block_gemv_kernel(X, R, NW, W, B, Y, R_Out, Partial, SumSq,
                       M, n_out, K, k_per_split, stride_x, stride_w, stride_y, eps,
                       HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                       HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr,
                       IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < n_out
    rm = tl.arange(0, BLOCK_M)
    m_mask = rm < M
    rk = tl.arange(0, BLOCK_K)
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    stream_rows = tl.where(pid_n == 0, M, 0)  # the first weight rows' programs write it
    w_rows = W + rn[:, None].to(tl.int64) * stride_w
    if PREFETCH:
        w = tl.load(w_rows + (k_start + rk)[None, :],
                    mask=n_mask[:, None] & (k_start + rk < k_end)[None, :], other=0.0)
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + rk
        k_mask = k < k_end
        if PREFETCH:
            k_next = k + BLOCK_K
            w_next = tl.load(w_rows + k_next[None, :],
                             mask=n_mask[:, None] & (k_next < k_end)[None, :], other=0.0)
        else:
            w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        xt, ss = _input_tile(X, R, NW, R_Out, stride_x, rm, m_mask, k, k_mask, ss,
                             stream_rows, HAS_NORM, HAS_RESIDUAL)
        acc = _dot(w, xt.to(w.dtype), acc, IEEE)
        if PREFETCH:
            w = w_next
    out_mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        _epilogue(acc, ss, B, Y, rn, rm, out_mask, n_out, K, stride_y, eps, HAS_NORM, HAS_BIAS)
    else:
        # Partial [SPLIT_K, M, n_out] fp32; SumSq [SPLIT_K, M]
        tl.store(Partial + pid_k * M * n_out + rm[None, :] * n_out + rn[:, None], acc,
                 mask=out_mask)
        if HAS_NORM:
            tl.store(SumSq + pid_k * M + rm, ss, mask=rm < stream_rows)


@triton.jit
def _split_k_reduce_kernel(Partial, SumSq, B, Y, M, n_out, K, stride_y, eps,
                           HAS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                           SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    out_mask = (rn < n_out)[:, None] & (rm < M)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):  # slice order: one sum order on every launch
        acc += tl.load(Partial + s * M * n_out + rm[None, :] * n_out + rn[:, None],
                       mask=out_mask, other=0.0)
        if HAS_NORM:
            ss += tl.load(SumSq + s * M + rm, mask=rm < M, other=0.0)
    _epilogue(acc, ss, B, Y, rn, rm, out_mask, n_out, K, stride_y, eps, HAS_NORM, HAS_BIAS)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
           norm_weight: torch.Tensor | None, residual: torch.Tensor | None,
           out: torch.Tensor | None) -> None:
    if x.dim() != 2 or not 1 <= x.shape[0] <= MAX_ROWS or not x.is_contiguous():
        raise ValueError(f"block_gemv needs contiguous rows [1..{MAX_ROWS}, K], got "
                         f"{tuple(x.shape)} (contiguous: {x.is_contiguous()})")
    m, k = x.shape
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} is not a contiguous [N, {k}] for "
                         f"the input {tuple(x.shape)}")
    if x.dtype != weight.dtype or x.dtype not in GEMV_DTYPES:
        raise ValueError(f"block_gemv takes x {tuple(x.shape)} and weight "
                         f"{tuple(weight.shape)} of one dtype of {GEMV_DTYPES}, got "
                         f"{x.dtype} and {weight.dtype}")
    n = weight.shape[0]
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias {tuple(bias.shape)} {bias.dtype} does not match the weight "
                         f"{tuple(weight.shape)} {weight.dtype}")
    if residual is not None and (norm_weight is None or residual.shape != x.shape
                                 or residual.dtype != x.dtype or not residual.is_contiguous()):
        raise ValueError(f"a residual {tuple(residual.shape)} {residual.dtype} needs a norm "
                         f"and the input's shape {tuple(x.shape)} and dtype {x.dtype}, "
                         f"contiguous")
    if norm_weight is not None and tuple(norm_weight.shape) != (k,):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} does not match the input "
                         f"{tuple(x.shape)}")
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != x.dtype
                            or not out.is_contiguous()):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} is not a contiguous [{m}, {n}] "
                         f"{x.dtype} for the input {tuple(x.shape)} and weight "
                         f"{tuple(weight.shape)}")


def block_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               norm_weight: torch.Tensor | None = None, eps: float = 0.0,
               residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
               config: BlockGemvConfig | None = None
               ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[M, K]` (M <= 32) contiguous, weight `[N, K]` contiguous -> `[M, N]` in x's dtype
    (into `out` when given: a graph's static buffer).

    With `norm_weight` `[K]`, x is the residual stream before an RMSNorm of `eps` (plus
    `residual` when given) and the result is `(y, stream)`: the stream is a new tensor when
    `residual` is given, else x itself, as the unfused add + norm returns it."""
    _check(x, weight, bias, norm_weight, residual, out)
    (m, k), n = x.shape, weight.shape[0]
    cfg = config or block_gemv_config(n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device) if out is None else out
    stream = torch.empty_like(x) if residual is not None else x
    k_per_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split_k = triton.cdiv(k, k_per_split)
    partial = sum_sq = y
    if split_k > 1:
        partial = torch.empty((split_k, m, n), dtype=torch.float32, device=x.device)
        sum_sq = torch.empty((split_k, m), dtype=torch.float32, device=x.device)
    has_norm, has_bias = norm_weight is not None, bias is not None
    block_m = max(MIN_BLOCK_M, triton.next_power_of_2(m))
    _block_gemv_kernel[(triton.cdiv(n, cfg.block_n), split_k)](
        x, residual if residual is not None else x, norm_weight if has_norm else x, weight,
        bias if has_bias else weight, y, stream, partial, sum_sq,
        m, n, k, k_per_split, x.stride(0), weight.stride(0), y.stride(0), eps,
        HAS_NORM=has_norm, HAS_RESIDUAL=residual is not None, HAS_BIAS=has_bias,
        SPLIT_K=split_k, PREFETCH=cfg.prefetch, IEEE=x.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split_k > 1:
        _split_k_reduce_kernel[(triton.cdiv(n, cfg.block_n),)](
            partial, sum_sq, bias if has_bias else weight, y, m, n, k, y.stride(0), eps,
            HAS_NORM=has_norm, HAS_BIAS=has_bias, SPLIT_K=split_k, BLOCK_M=block_m,
            BLOCK_N=cfg.block_n, num_warps=cfg.num_warps)
    return y if norm_weight is None else (y, stream)

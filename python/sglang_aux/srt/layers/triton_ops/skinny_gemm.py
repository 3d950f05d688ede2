"""Skinny GEMM `y[M, N] = x[M, K] @ W[N, K]^T (+ bias)` for M <= 16 rows (decode, verify).

At a few rows a projection is a weight read: the kernel streams W once, in `[BLOCK_N, BLOCK_K]`
tiles along its contiguous K (wide coalesced loads, software-pipelined), against the rows of x
padded to one 16-row `tl.dot` operand, accumulating in fp32.

Grid `(N tiles, SPLIT_K)`. When N alone gives fewer tiles than the device has SMs, K splits
over programs; the split is reduced inside the kernel by the last program to finish a tile
(a semaphore): every program stores its fp32 partial, takes a ticket from the tile's counter,
and the one holding the last ticket sums the partials in split order, so the result does not
depend on which program finished when (deterministic), applies the epilogue, and puts the
counter back to zero for the next launch or graph replay. The counters are cached per device
and stream (launches on one stream are ordered, so they never share a counter at once); a
graph keeps those of the stream it was captured on, so graphs captured on one stream must not
replay concurrently (the runner's graphs replay one at a time on its stream).

Fused variants (constexpr flags):
- `HAS_NORM`: x is the pre-norm stream; each program computes the RMSNorm statistics of the
  whole rows itself (x is a few KB), normalizes its K slice on the fly and rounds it to the
  weight dtype, as the unfused `linear(norm(x))` sees it. With `HAS_RESIDUAL` the stream is
  `x + residual`, rounded to the dtype first; the first program writes it out (the new
  residual, the fused add + norm's contract).
- `HAS_BIAS`: the bias added to the fp32 sum before the one rounding.
- `SILU_MUL`: W is a merged gate | up `[2 I, K]`; a program reads gate rows n and up rows
  I + n and writes `silu(gate) * up` `[M, I]`, each half rounded to the dtype first (as the
  unfused projection output would be), fp32 math, one rounding at the end.

The tile choice is a table by (N, K, M) (`gemv_config`), fixed per shape, never autotuned, so
a CUDA graph replays what was captured.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_DTYPES, GEMV_MAX_ROWS

BLOCK_M = GEMV_MAX_ROWS  # one tl.dot operand; more rows are a GEMM, cuBLAS's job
# The H200's SMs: the table's target off CUDA (the CPU interpreter), so CI runs the choices
# the H200 would make.
H200_SMS = 132
# Tiles per SM the table aims at before it shrinks BLOCK_N further: several waves keep the
# last wave's tail a small part of the call.
TARGET_WAVES = 4
# Programs per SM a split K aims at.
SPLIT_WAVES = 2
BLOCK_N_CHOICES = (128, 64, 32, 16)
# Bytes of one W row a program loads per step (128 bf16 elements: 16 B per thread, 16 lanes).
ROW_BYTES_PER_STEP = 256
MAX_COUNTERS = 4096


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int  # programs along K (after rounding K per split to whole blocks)
    k_per_split: int  # a multiple of block_k
    num_warps: int = 4
    num_stages: int = 4


def gemv_config(n_out: int, k: int, elem_bytes: int, num_sms: int,
                split_k: int | None = None) -> GemvConfig:
    """The tiles for `n_out` output columns (I for a gate | up pair) of a K-wide weight.
    Rows do not enter: all of them ride in one 16-row operand, so M changes the compute, not
    the bytes. `split_k` overrides the table's split (tests force the split path)."""
    block_k = max(16, min(ROW_BYTES_PER_STEP // elem_bytes, triton.next_power_of_2(k)))
    block_n = next((b for b in BLOCK_N_CHOICES if triton.cdiv(n_out, b) >= TARGET_WAVES * num_sms),
                   BLOCK_N_CHOICES[-1])
    tiles = triton.cdiv(n_out, block_n)
    k_blocks = triton.cdiv(k, block_k)
    if split_k is None:
        split_k = 1 if tiles >= num_sms else triton.cdiv(SPLIT_WAVES * num_sms, tiles)
    per_split = triton.cdiv(k_blocks, max(1, min(split_k, k_blocks)))
    return GemvConfig(block_n, block_k, triton.cdiv(k_blocks, per_split), per_split * block_k)


@functools.cache
def device_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


_counters: dict[tuple, torch.Tensor] = {}


def _split_counters(device: torch.device) -> torch.Tensor:
    """This device's and stream's tile counters, all zero between launches."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    if key not in _counters:
        _counters[key] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
    return _counters[key]


@triton.jit
def _stream_tile(X, R, stride_x, stride_r, rm, k, mask, HAS_RESIDUAL: tl.constexpr):
    """The stream `x (+ residual)` at rows rm, columns k, rounded to x's dtype, in fp32."""
    x = tl.load(X + rm[:, None] * stride_x + k[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rm[:, None] * stride_r + k[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
    return x


@triton.jit
def _epilogue(acc, acc_up, B, Y, stride_y, rm, rn, mask, n_out,
              HAS_BIAS: tl.constexpr, SILU_MUL: tl.constexpr):
    if HAS_BIAS:
        acc += tl.load(B + rn, mask=rn < n_out, other=0.0).to(tl.float32)[None, :]
    if SILU_MUL:
        if HAS_BIAS:
            acc_up += tl.load(B + n_out + rn, mask=rn < n_out, other=0.0).to(tl.float32)[None, :]
        gate = acc.to(Y.dtype.element_ty).to(tl.float32)
        up = acc_up.to(Y.dtype.element_ty).to(tl.float32)
        acc = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Y + rm[:, None] * stride_y + rn[None, :], acc.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _skinny_gemm_kernel(
    X, R, NW, W, B, Y, R_Out, Partial, Counter,
    M, n_out, K, k_per_split, stride_x, stride_r, stride_w, stride_y, stride_ro, eps,
    HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr, SPLIT_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    m_mask = rm < M
    rk = tl.arange(0, BLOCK_K)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rn < n_out
    w_ty = W.dtype.element_ty

    if HAS_NORM:
        stream_rows = tl.where((pid_n + pid_k) == 0, M, 0)  # the first program writes it
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            mask = m_mask[:, None] & (k < K)[None, :]
            s = _stream_tile(X, R, stride_x, stride_r, rm, k, mask, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                tl.store(R_Out + rm[:, None] * stride_ro + k[None, :], s,
                         mask=(rm < stream_rows)[:, None] & (k < K)[None, :])
            s = s.to(tl.float32)
            sum_sq += tl.sum(s * s, axis=1)
        rstd = tl.rsqrt(sum_sq / K + eps)

    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = pid_k * k_per_split
    for k0 in range(k_start, k_start + k_per_split, BLOCK_K):
        k = k0 + rk
        k_mask = k < K
        mask = m_mask[:, None] & k_mask[None, :]
        if HAS_NORM:
            s = _stream_tile(X, R, stride_x, stride_r, rm, k, mask, HAS_RESIDUAL).to(tl.float32)
            nw = tl.load(NW + k, mask=k_mask, other=0.0).to(tl.float32)
            x = (s * rstd[:, None] * nw[None, :]).to(X.dtype.element_ty).to(w_ty)
        else:
            x = tl.load(X + rm[:, None] * stride_x + k[None, :], mask=mask, other=0.0).to(w_ty)
        w_mask = n_mask[:, None] & k_mask[None, :]
        w_ptrs = W + rn[:, None].to(tl.int64) * stride_w + k[None, :]
        w = tl.load(w_ptrs, mask=w_mask, other=0.0)
        if IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        if SILU_MUL:
            w_up = tl.load(w_ptrs + n_out * stride_w, mask=w_mask, other=0.0)
            if IEEE:
                acc_up = tl.dot(x, tl.trans(w_up), acc_up, input_precision="ieee")
            else:
                acc_up = tl.dot(x, tl.trans(w_up), acc_up)

    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT_K == 1:
        _epilogue(acc, acc_up, B, Y, stride_y, rm, rn, out_mask, n_out, HAS_BIAS, SILU_MUL)
    else:
        # Partial [SPLIT_K, BLOCK_M, 2 * n_out if SILU_MUL else n_out] fp32
        width = 2 * n_out if SILU_MUL else n_out
        p_offs = rm[:, None] * width + rn[None, :]
        tl.store(Partial + pid_k * BLOCK_M * width + p_offs, acc, mask=out_mask)
        if SILU_MUL:
            tl.store(Partial + pid_k * BLOCK_M * width + n_out + p_offs, acc_up, mask=out_mask)
        # All of this program's partial stores precede its ticket (release); the last
        # ticket's holder sees every other program's partials (acquire).
        tl.debug_barrier()
        ticket = tl.atomic_add(Counter + pid_n, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in range(SPLIT_K):
                base = Partial + s * BLOCK_M * width + p_offs
                acc += tl.load(base, mask=out_mask, other=0.0, cache_modifier=".cg")
                if SILU_MUL:
                    acc_up += tl.load(base + n_out, mask=out_mask, other=0.0,
                                      cache_modifier=".cg")
            tl.atomic_xchg(Counter + pid_n, 0)
            _epilogue(acc, acc_up, B, Y, stride_y, rm, rn, out_mask, n_out, HAS_BIAS, SILU_MUL)


def skinny_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                residual: torch.Tensor | None = None, silu_mul: bool = False,
                split_k: int | None = None, config: GemvConfig | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """x `[M, K]` (M <= 16, last dim contiguous), weight `[N, K]` contiguous, bias `[N]` ->
    a new `[M, N]` (`[M, N / 2]` with `silu_mul`) in x's dtype.

    With `norm_weight` `[K]`, x is the residual stream before an RMSNorm of `eps` (plus
    `residual` when given) and the result is `(y, stream)`: the stream is a new tensor when
    `residual` is given, else x itself, as the unfused add + norm returns it. `split_k`
    overrides the table's split along K."""
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[0] > GEMV_MAX_ROWS:
        raise ValueError(f"skinny_gemm needs [rows <= {GEMV_MAX_ROWS}, K] with a contiguous last "
                         f"dim, got shape {tuple(x.shape)} strides {x.stride()}")
    m, k = x.shape
    if weight.dim() != 2 or weight.shape[1] != k or not weight.is_contiguous():
        raise ValueError(f"weight {tuple(weight.shape)} (contiguous: {weight.is_contiguous()}) "
                         f"is not a contiguous [N, {k}] for the input {tuple(x.shape)}")
    if x.dtype != weight.dtype or x.dtype not in GEMV_DTYPES:
        raise ValueError(f"skinny_gemm takes x and weight of one dtype of {GEMV_DTYPES}, "
                         f"got {x.dtype} and {weight.dtype}")
    n = weight.shape[0]
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"bias {tuple(bias.shape)} does not match the weight's {n} rows")
    if silu_mul and n % 2:
        raise ValueError(f"silu_mul needs a gate | up weight of even rows, got {n}")
    if residual is not None and (norm_weight is None or residual.shape != x.shape
                                 or residual.stride(-1) != 1):
        raise ValueError(f"a residual {tuple(residual.shape)} (strides {residual.stride()}) "
                         f"needs a norm and the input's shape {tuple(x.shape)}")
    if norm_weight is not None and tuple(norm_weight.shape) != (k,):
        raise ValueError(f"norm weight {tuple(norm_weight.shape)} does not match K = {k}")
    n_out = n // 2 if silu_mul else n
    y = torch.empty((m, n_out), dtype=x.dtype, device=x.device)
    stream = torch.empty((m, k), dtype=x.dtype, device=x.device) if residual is not None else x
    if m == 0:
        return y if norm_weight is None else (y, stream)
    cfg = config or gemv_config(n_out, k, weight.element_size(), device_sms(x.device), split_k)
    tiles = triton.cdiv(n_out, cfg.block_n)
    if cfg.split_k > 1:
        if tiles > MAX_COUNTERS:
            raise ValueError(f"a split K over {tiles} tiles exceeds {MAX_COUNTERS} counters")
        partial = torch.empty((cfg.split_k, BLOCK_M, n), dtype=torch.float32, device=x.device)
        counters = _split_counters(x.device)
    else:
        partial = counters = y
    r = residual if residual is not None else x
    _skinny_gemm_kernel[(tiles, cfg.split_k)](
        x, r, norm_weight if norm_weight is not None else x, weight,
        bias if bias is not None else weight, y, stream, partial, counters,
        m, n_out, k, cfg.k_per_split, x.stride(0), r.stride(0), weight.stride(0), y.stride(0),
        stream.stride(0), eps,
        HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, SILU_MUL=silu_mul, SPLIT_K=cfg.split_k,
        IEEE=x.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return y if norm_weight is None else (y, stream)

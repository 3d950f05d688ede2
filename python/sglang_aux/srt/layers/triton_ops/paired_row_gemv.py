"""Row GEMVs whose programs own rows in pairs, so the op after the projection runs in the
same kernel: a bs-1 decode step's qkv and gate_up under the row GEMV backend
(`layers/decode_gemv.py`; the step 1.359 -> 1.310 ms on the H200 against the two launches
each, docs/kernels.md).

A program owns `BLOCK_N // 2` consecutive rows `c` of the first half of a group of
`2 * half` output rows and the rows `c + half` paired with them, interleaved in the tile
(pair j at 2j, 2j + 1): the sums are the row GEMV's own (`row_gemv.row_dot`, the same
tiles), so only the epilogue differs.
- `row_gemv_rope_store`: the qkv projection (with the RMSNorm before it, residual and bias
  fused as the row GEMV has them) whose groups are the heads; q and k pairs are NeoX-rotated
  at the token's position, q goes out, k and v into the paged KV pool at `loc`. Replaces
  `row_gemv` + `rope_store` (no per-head q/k norm: Qwen2 and Llama shapes).
- `row_gemv_silu_mul`: the gate | up projection (one group, half = I) writing
  `silu(gate) * up` `[1, I]`. Replaces `row_gemv` + `silu_and_mul`. Unlike the variant removed
  before (docs/kernels.md), no element is read twice.
Every intermediate is rounded to the dtype where the unfused launches round it, so they agree
exactly where the arithmetic is the same (the interpreter; on the GPU up to the compiler's
contraction of the rotation and SiLU into FMAs: see the CUDA test's tolerance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.grid_dependency import resolve_pdl
from sglang_aux.srt.layers.triton_ops.row_gemv import (
    RowGemvConfig,
    check_row_gemv_inputs,
    row_dot,
    row_gemv_config,
)


@triton.jit
def _pair_tile(X, R, NW, W, B, R_Out, K, stride_w, eps, half,
               HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
               PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               K_PAD: tl.constexpr):
    """(group, columns c `[BLOCK_N // 2]` in its first half, their mask, the outputs of rows
    c and c + half in fp32 after rounding to the dtype) of this program."""
    PAIRS: tl.constexpr = BLOCK_N // 2
    pid = tl.program_id(0)
    tiles_per_group = tl.cdiv(half, PAIRS)
    group = pid // tiles_per_group
    c0 = (pid % tiles_per_group) * PAIRS
    i = tl.arange(0, BLOCK_N)
    rn = group * 2 * half + (i % 2) * half + c0 + i // 2
    y = row_dot(X, R, NW, W, R_Out, rn, c0 + i // 2 < half, K, stride_w, eps, pid == 0,
                HAS_NORM, HAS_RESIDUAL, PDL, BLOCK_N, BLOCK_K, K_PAD)
    c = c0 + tl.arange(0, PAIRS)
    c_mask = c < half
    if HAS_BIAS:
        y += tl.load(B + rn, mask=c0 + i // 2 < half, other=0.0).to(tl.float32)
    first, second = tl.split(tl.reshape(y.to(X.dtype.element_ty).to(tl.float32), [PAIRS, 2]))
    return group, c, c_mask, first, second


@triton.jit
def _rope_store_gemv_kernel(X, R, NW, W, B, Q_Out, R_Out, Positions, Cos_Sin, K_Cache,
                            V_Cache, Loc, K, stride_w, stride_cs, stride_kc, stride_kh,
                            stride_vc, stride_vh, eps, num_q_heads, num_kv_heads,
                            HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                            HAS_BIAS: tl.constexpr, PDL: tl.constexpr, HALF: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_PAD: tl.constexpr):
    head, c, c_mask, x1, x2 = _pair_tile(X, R, NW, W, B, R_Out, K, stride_w, eps, HALF,
                                         HAS_NORM, HAS_RESIDUAL, HAS_BIAS, PDL, BLOCK_N,
                                         BLOCK_K, K_PAD)
    dtype = X.dtype.element_ty
    slot = tl.load(Loc).to(tl.int64)
    if head < num_q_heads + num_kv_heads:
        pos = tl.load(Positions).to(tl.int64)
        cos = tl.load(Cos_Sin + pos * stride_cs + c, mask=c_mask, other=0.0).to(tl.float32)
        sin = tl.load(Cos_Sin + pos * stride_cs + HALF + c, mask=c_mask, other=0.0
                      ).to(tl.float32)
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if head < num_q_heads:
            out = Q_Out + head * 2 * HALF + c
        else:
            out = K_Cache + slot * stride_kc + (head - num_q_heads) * stride_kh + c
    else:
        o1, o2 = x1, x2
        out = V_Cache + slot * stride_vc + (head - num_q_heads - num_kv_heads) * stride_vh + c
    tl.store(out, o1.to(dtype), mask=c_mask)
    tl.store(out + HALF, o2.to(dtype), mask=c_mask)


@triton.jit
def _silu_mul_gemv_kernel(X, R, NW, W, Y, R_Out, K, stride_w, eps, inter,
                          HAS_NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                          PDL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          K_PAD: tl.constexpr):
    _, c, c_mask, gate, up = _pair_tile(X, R, NW, W, W, R_Out, K, stride_w, eps, inter,
                                        HAS_NORM, HAS_RESIDUAL, False, PDL, BLOCK_N, BLOCK_K,
                                        K_PAD)
    y = gate / (1.0 + tl.exp(-gate)) * up  # silu_and_mul.py's expression
    tl.store(Y + c, y.to(X.dtype.element_ty), mask=c_mask)


def _pair_config(n: int, norm_weight: torch.Tensor | None,
                 config: RowGemvConfig | None) -> RowGemvConfig:
    cfg = config or row_gemv_config(n, norm_weight is not None)
    if cfg.block_n < 2 or cfg.block_n % 2:
        raise ValueError(f"a paired row GEMV needs an even block_n >= 2, got {cfg.block_n}")
    return cfg


def _stream(x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    return torch.empty_like(x) if residual is not None else x


def row_gemv_rope_store(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor,
                        num_q_heads: int, *, norm_weight: torch.Tensor | None = None,
                        eps: float = 0.0, residual: torch.Tensor | None = None,
                        config: RowGemvConfig | None = None, pdl: bool | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """One token's qkv projection `x [1, K] @ weight [(H + 2 * KVH) * D, K]^T` (+ bias; the
    norm and residual as `row_gemv` takes them), q and k rotated at `positions` `[1]` by
    `cos_sin_cache` `[max_pos, D]` (cos | sin), k and v stored in `k_cache` / `v_cache`
    `[slots, KVH, D]` at `loc` `[1]`. Returns `(q [1, H * D], stream)`: the stream as
    `row_gemv` returns it (x itself without a norm)."""
    n, _ = check_row_gemv_inputs(x, weight, bias, norm_weight, residual)
    num_kv_heads, head_dim = k_cache.shape[1], cos_sin_cache.shape[1]
    if n != (num_q_heads + 2 * num_kv_heads) * head_dim:
        raise ValueError(f"weight rows {n} are not (q heads {num_q_heads} + 2 x kv heads "
                         f"{num_kv_heads}) x head_dim {head_dim}")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.dim() != 3 or tuple(cache.shape[1:]) != (num_kv_heads, head_dim) \
                or cache.stride(-1) != 1 or cache.dtype != x.dtype:
            raise ValueError(f"{name} {tuple(cache.shape)} {cache.dtype} is not [slots, "
                             f"{num_kv_heads}, {head_dim}] {x.dtype} with contiguous heads")
    if positions.numel() != 1 or loc.numel() != 1:
        raise ValueError(f"one token: positions {tuple(positions.shape)} and loc "
                         f"{tuple(loc.shape)} must hold one element each")
    cfg = _pair_config(n, norm_weight, config)
    pdl = resolve_pdl(pdl, x)
    q = torch.empty((1, num_q_heads * head_dim), dtype=x.dtype, device=x.device)
    stream = _stream(x, residual)
    grid = (num_q_heads + 2 * num_kv_heads) * triton.cdiv(head_dim // 2, cfg.block_n // 2)
    _rope_store_gemv_kernel[(grid,)](
        x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, weight,
        bias if bias is not None else weight, q, stream, positions, cos_sin_cache, k_cache,
        v_cache, loc, x.shape[1], weight.stride(0), cos_sin_cache.stride(0), k_cache.stride(0),
        k_cache.stride(1), v_cache.stride(0), v_cache.stride(1), eps, num_q_heads,
        num_kv_heads, HAS_NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        HAS_BIAS=bias is not None, PDL=pdl, HALF=head_dim // 2, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, K_PAD=triton.next_power_of_2(x.shape[1]),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, launch_pdl=pdl)
    return q, stream


def row_gemv_silu_mul(x: torch.Tensor, weight: torch.Tensor, *,
                      norm_weight: torch.Tensor | None = None, eps: float = 0.0,
                      residual: torch.Tensor | None = None, config: RowGemvConfig | None = None,
                      pdl: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`silu(gate) * up` `[1, I]` of the gate | up projection `x [1, K] @ weight [2 * I, K]^T`
    (the norm and residual as `row_gemv` takes them), and the stream as `row_gemv` returns
    it."""
    n, _ = check_row_gemv_inputs(x, weight, None, norm_weight, residual)
    if n % 2:
        raise ValueError(f"a gate | up weight has an even number of rows, got {n}")
    cfg = _pair_config(n, norm_weight, config)
    pdl = resolve_pdl(pdl, x)
    y = torch.empty((1, n // 2), dtype=x.dtype, device=x.device)
    stream = _stream(x, residual)
    _silu_mul_gemv_kernel[(triton.cdiv(n // 2, cfg.block_n // 2),)](
        x, residual if residual is not None else x,
        norm_weight if norm_weight is not None else x, weight, y, stream, x.shape[1],
        weight.stride(0), eps, n // 2, HAS_NORM=norm_weight is not None,
        HAS_RESIDUAL=residual is not None, PDL=pdl, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        K_PAD=triton.next_power_of_2(x.shape[1]), num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, launch_pdl=pdl)
    return y, stream

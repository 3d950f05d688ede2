"""Per-head q/k RMSNorm (optional), NeoX RoPE at `positions`, and the K/V store, in one pass.

One program per token handles all of its q heads and kv heads: q is rotated in place; the
rotated k goes either back in place or, with a store, into the KV cache at the token's slot,
together with v. fp32 math; each normalized head is rounded to the model dtype before it is
rotated, as the unfused `rotate(norm(x))` sees it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sglang_aux.srt.layers.triton_ops.grid_dependency import (
    resolve_pdl,
    wait_for_previous_kernel,
)


@triton.jit
def _norm_rotate_heads(ptr_in, ptr_out, W, cos, sin, num_heads, eps,
                       NORM: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_HALF: tl.constexpr):
    """Heads `[num_heads, 2 * HALF]` contiguous at ptr_in -> rotated at ptr_out."""
    h = tl.arange(0, BLOCK_H)[:, None]
    c = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < num_heads) & (c < HALF)
    offs = h * (2 * HALF) + c
    x1 = tl.load(ptr_in + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr_in + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
        rstd = tl.rsqrt(ss / (2 * HALF) + eps)[:, None]
        cm = c < HALF
        w1 = tl.load(W + c, mask=cm, other=0.0).to(tl.float32)
        w2 = tl.load(W + c + HALF, mask=cm, other=0.0).to(tl.float32)
        x1 = (x1 * rstd * w1).to(ptr_in.dtype.element_ty).to(tl.float32)
        x2 = (x2 * rstd * w2).to(ptr_in.dtype.element_ty).to(tl.float32)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    tl.store(ptr_out + offs, o1.to(ptr_out.dtype.element_ty), mask=mask)
    tl.store(ptr_out + offs + HALF, o2.to(ptr_out.dtype.element_ty), mask=mask)


@triton.jit
def _rope_store_kernel(Q, K, V, Positions, Cos_Sin, QW, KW, K_Out, V_Out, Loc,
                       stride_q, stride_k, stride_v, stride_cs, stride_ko, stride_vo,
                       num_q_heads, num_kv_heads, eps,
                       HAS_Q: tl.constexpr, NORM: tl.constexpr, STORE: tl.constexpr,
                       PDL: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr):
    wait_for_previous_kernel(PDL)
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + t).to(tl.int64)
    c = tl.arange(0, BLOCK_HALF)[None, :]
    cos = tl.load(Cos_Sin + pos * stride_cs + c, mask=c < HALF, other=0.0).to(tl.float32)
    sin = tl.load(Cos_Sin + pos * stride_cs + HALF + c, mask=c < HALF, other=0.0).to(tl.float32)
    if HAS_Q:
        q = Q + t * stride_q
        _norm_rotate_heads(q, q, QW, cos, sin, num_q_heads, eps, NORM, HALF, BLOCK_HQ, BLOCK_HALF)
    if STORE:
        slot = tl.load(Loc + t).to(tl.int64)
        k_out = K_Out + slot * stride_ko
        d = tl.arange(0, BLOCK_HK)[:, None] * (2 * HALF) + tl.arange(0, 2 * BLOCK_HALF)[None, :]
        dm = (tl.arange(0, BLOCK_HK)[:, None] < num_kv_heads) & (
            tl.arange(0, 2 * BLOCK_HALF)[None, :] < 2 * HALF)
        v = tl.load(V + t * stride_v + d, mask=dm, other=0.0)
        tl.store(V_Out + slot * stride_vo + d, v.to(V_Out.dtype.element_ty), mask=dm)
    else:
        k_out = K + t * stride_k
    _norm_rotate_heads(K + t * stride_k, k_out, KW, cos, sin, num_kv_heads, eps, NORM, HALF,
                       BLOCK_HK, BLOCK_HALF)


def _check_heads(name: str, x: torch.Tensor, head_dim: int) -> int:
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[1] % head_dim:
        raise ValueError(f"{name} must be [tokens, heads * {head_dim}] with a contiguous last "
                         f"dim, got shape {tuple(x.shape)} strides {x.stride()}")
    return x.shape[1] // head_dim


def rope_store(positions: torch.Tensor, q: torch.Tensor | None, k: torch.Tensor,
               cos_sin_cache: torch.Tensor, q_weight: torch.Tensor | None = None,
               k_weight: torch.Tensor | None = None, eps: float = 0.0,
               v: torch.Tensor | None = None, k_cache: torch.Tensor | None = None,
               v_cache: torch.Tensor | None = None, loc: torch.Tensor | None = None,
               pdl: bool | None = None) -> None:
    """In place: q `[T, H * D]` and, without a store, k `[T, KVH * D]` are (normed and)
    rotated at `positions` `[T]` by `cos_sin_cache` `[max_pos, D]` (cos | sin halves).

    With `k_cache`/`v_cache` `[slots, KVH, D]` and `loc` `[T]`, the rotated k and v go to
    those slots instead and k is left as it was. Norm weights `[D]` come together or not at all.
    `pdl`: launch dependent (`grid_dependency.py`; None reads its bench switch).
    """
    head_dim = cos_sin_cache.shape[1]
    num_kv_heads = _check_heads("k", k, head_dim)
    num_q_heads = _check_heads("q", q, head_dim) if q is not None else 0
    norm = k_weight is not None
    if (q_weight is not None) != (norm and q is not None):
        raise ValueError("pass q and k norm weights together (k's alone when q is None)")
    store = k_cache is not None
    if store:
        if v is None or v_cache is None or loc is None:
            raise ValueError("a K/V store needs v, k_cache, v_cache and loc")
        _check_heads("v", v, head_dim)
        if tuple(k_cache.shape[1:]) != (num_kv_heads, head_dim):
            raise ValueError(f"k_cache {tuple(k_cache.shape)} does not hold [*, {num_kv_heads}, "
                             f"{head_dim}] rows")
    if k.shape[0] == 0:
        return
    half = head_dim // 2
    pdl = resolve_pdl(pdl, k)
    dummy = k
    _rope_store_kernel[(k.shape[0],)](
        q if q is not None else dummy, k, v if store else dummy, positions, cos_sin_cache,
        q_weight if q_weight is not None else dummy, k_weight if norm else dummy,
        k_cache if store else dummy, v_cache if store else dummy, loc if store else positions,
        q.stride(0) if q is not None else 0, k.stride(0), v.stride(0) if store else 0,
        cos_sin_cache.stride(0), k_cache.stride(0) if store else 0,
        v_cache.stride(0) if store else 0, num_q_heads, num_kv_heads, eps,
        HAS_Q=q is not None, NORM=norm, STORE=store, PDL=pdl, HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HQ=triton.next_power_of_2(max(num_q_heads, 1)),
        BLOCK_HK=triton.next_power_of_2(num_kv_heads), num_warps=4, launch_pdl=pdl,
    )

"""Decode GEMV: whether a dense projection of a one-row forward runs the row GEMV kernel.

At one token (a bs-1 decode step) a projection reads its weight once and computes little;
`triton_ops/row_gemv.py` streams the weight with the RMSNorm before it (and the residual add)
and the bias fused in. The server flag `--decode-gemv-backend` is set on every layer that has
the path (`gemv_backend`) when the runner builds the model; with `triton`, the dispatch rules of
`triton_ops/dispatch.py` still decide (CUDA in `auto`, everywhere in `force`, never in `off` or
while autograd records). Forwards of more rows stay on cuBLAS: measured on the H200 at the
Qwen2.5-1.5B shapes, a 16-row tensor-core kernel lost to it at 8 and 16 rows
(docs/kernels.md), and the SiLU-mul fused into either side of the MLP cost more than its own
launch.

Under the row GEMV the two projections that feed an elementwise step pair their rows so the step
runs in the projection's kernel (`triton_ops/paired_row_gemv.py`): qkv with RoPE and the K/V
store (`norm_qkv_store`), gate | up with the SiLU-mul (`norm_linear` given the act).
`SGLANG_AUX_PAIRED_GEMV=0` keeps the unpaired launches, for before/after measurements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang_aux.srt.layers.layernorm import RMSNorm, add_norm
from sglang_aux.srt.layers.triton_ops.dispatch import (
    GEMV_BACKENDS,
    GEMV_DTYPES,
    PAIRED_GEMV_ENV_VAR,
    switch,
    use_triton,
)

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
    from sglang_aux.srt.layers.activation import SiluAndMul
    from sglang_aux.srt.layers.radix_attention import RadixAttention
    from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding


def paired_gemv() -> bool:
    """Whether the row GEMV runs the paired kernels (`SGLANG_AUX_PAIRED_GEMV`: 1, the
    default, or 0; read at every call, so a benchmark may flip it per process)."""
    return switch(PAIRED_GEMV_ENV_VAR) == "1"


def set_decode_gemv_backend(model: nn.Module, backend: str) -> None:
    """Every layer of `model` with a decode GEMV path takes `backend`."""
    if backend not in GEMV_BACKENDS:
        raise ValueError(f"decode GEMV backend {backend!r}; choose from {GEMV_BACKENDS}")
    for module in model.modules():
        if hasattr(module, "gemv_backend"):
            module.gemv_backend = backend


def use_gemv(layer: nn.Module, x: torch.Tensor) -> bool:
    """Whether `layer` (with `weight` and `gemv_backend`) runs the kernel on `x` `[rows, K]`."""
    w = layer.weight
    return (layer.gemv_backend == "triton" and x.dim() == 2 and x.shape[0] == 1
            and x.dtype == w.dtype and w.dtype in GEMV_DTYPES and w.is_contiguous()
            and x.is_contiguous() and use_triton(x))


def gemv_linear(layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`x W^T + bias` of `layer` on the kernel (`use_gemv` said yes)."""
    from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv

    return row_gemv(x, layer.weight, bias)


def norm_linear(norm: RMSNorm, linear: nn.Module, hidden: torch.Tensor,
                residual: torch.Tensor | None, act: SiluAndMul | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """`(act(linear(norm(stream))), stream)` of the residual stream `hidden + residual`
    (`hidden` alone when residual is None), as `(norm(hidden, residual), linear, act)` run one
    after the other would give it; the norm and the projection one kernel when the decode
    GEMV takes `hidden`. `linear` is a `linear.MergedColumnLinear` (not named in the
    annotation: that module imports this one)."""
    if use_gemv(linear, hidden) and (residual is None or residual.is_contiguous()):
        if act is not None and linear.bias is None and paired_gemv():
            from sglang_aux.srt.layers.triton_ops.paired_row_gemv import row_gemv_silu_mul

            return row_gemv_silu_mul(hidden, linear.weight, norm_weight=norm.weight,
                                     eps=norm.variance_epsilon, residual=residual)
        from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv

        y, stream = row_gemv(hidden, linear.weight, linear.bias, norm_weight=norm.weight,
                             eps=norm.variance_epsilon, residual=residual)
    else:
        x, stream = add_norm(norm, hidden, residual)
        y = linear(x)
    return (y if act is None else act(y)), stream


def norm_qkv_store(norm: RMSNorm, qkv_proj: nn.Module, rotary: RotaryEmbedding,
                   attn: RadixAttention, positions: torch.Tensor, hidden: torch.Tensor,
                   residual: torch.Tensor | None, forward_batch: ForwardBatch
                   ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`(q, stream)` of one decode token in one kernel: the norm of the stream, the qkv
    projection, RoPE on q and k at `positions`, k and v written to `attn`'s KV store; as
    `norm_linear` then `rotary.forward_and_store` would give them. None where the paired kernel
    does not apply (more tokens, the torch backend, no KV pool, a cache in another dtype): the
    caller runs those two steps. No per-head q/k norm: the caller has none (Qwen3 has)."""
    if not use_gemv(qkv_proj, hidden) or not paired_gemv() \
            or (residual is not None and not residual.is_contiguous()):
        return None
    store = attn.kv_store(forward_batch)
    if store is None:
        return None
    k_cache, v_cache = store.k_cache, store.v_cache
    if k_cache.dtype != hidden.dtype or v_cache.dtype != hidden.dtype \
            or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or rotary.head_dim % 2:
        return None
    from sglang_aux.srt.layers.triton_ops.paired_row_gemv import row_gemv_rope_store

    return row_gemv_rope_store(hidden, qkv_proj.weight, qkv_proj.bias, positions,
                               rotary.cos_sin_cache, k_cache, v_cache, store.loc,
                               attn.tp_q_head_num,
                               norm_weight=norm.weight, eps=norm.variance_epsilon,
                               residual=residual)

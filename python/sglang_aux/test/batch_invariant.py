"""Batch-invariant CPU kernels for tests: every row of a result computed as if it were alone.

CPU GEMMs choose their blocking, and so their reduction order, by the number of rows (a
`[16, H]` DFlash verify GEMM and a `[1, H]` decode GEMV round differently), and SDPA's by the
number of queries and keys (a verify's queries see its block's masked keys too). Inside
`batch_invariant_kernels()` each linear / 2-D matmul runs one row at a time and each attention
query attends to exactly its visible keys, so a token's logits are the same bits whatever else
the forward computes. Row at a time is far too slow to serve: this isolates the rounding
of batching from everything else a test compares.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn import functional as F

from sglang_aux.srt.layers.attention import torch_native_backend


def _rows(fn, x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    return torch.cat([fn(flat[i:i + 1]) for i in range(flat.shape[0])])


@contextmanager
def batch_invariant_kernels() -> Iterator[None]:
    linear, matmul, sdpa = F.linear, torch.matmul, torch_native_backend._sdpa

    def row_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None):
        if not x.numel():
            return linear(x, w, b)
        return _rows(lambda r: linear(r, w, b), x).reshape(*x.shape[:-1], w.shape[0])

    def row_matmul(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None):
        if a.dim() != 2 or b.dim() != 2 or not a.shape[0]:
            return matmul(a, b) if out is None else matmul(a, b, out=out)
        result = _rows(lambda r: matmul(r, b), a)
        return result if out is None else out.copy_(result)

    def query_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scaling: float) -> torch.Tensor:
        out = torch.zeros_like(q)  # [B, Q, H, D]
        for b in range(q.shape[0]):
            for i in range(q.shape[1]):
                keys = mask[b, min(i, mask.shape[1] - 1)].nonzero()[:, 0]
                if keys.numel():
                    seen = torch.ones(1, 1, keys.numel(), dtype=torch.bool, device=q.device)
                    out[b, i] = sdpa(q[b:b + 1, i:i + 1], k[b:b + 1, keys], v[b:b + 1, keys],
                                     seen, scaling)[0, 0]
        return out

    F.linear, torch.matmul, torch_native_backend._sdpa = row_linear, row_matmul, query_sdpa
    try:
        yield
    finally:
        F.linear, torch.matmul, torch_native_backend._sdpa = linear, matmul, sdpa

"""Route a model's few-row projections through the block GEMV candidate: measurement only.

Inside `route_block_gemv()`, three call sites are patched: the dense layers' `_linear`
(`layers/linear.py`), the decoder layer's fused norm + projection `norm_linear` (as
`models/llama.py` names it) and the LM head's `lm_head_logits` (as
`layers/logits_processor.py` names it). A forward of 2 to 32 rows (a bs-1 verify step, the
draft's block forward, a decode step of up to 32 requests) that the dispatch rules give to
Triton (CUDA in `auto`) then runs `block_gemv`; any other takes the original. CUDA graphs
captured inside keep the candidate's kernels after the context closes, so an engine built
inside it replays them. `bench_graph_replay.py --block-gemv` times the decode and verify
graphs with and without it in one call. No server flag: the candidate becomes one only after
it beats cuBLAS on the H200 in the same run (docs/kernels.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from sglang_aux.srt.distributed.parallel_state import get_tensor_model_parallel_world_size
from sglang_aux.srt.layers import linear, logits_processor
from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_DTYPES, use_triton
from sglang_aux.srt.models import llama

# One row is the row GEMV's (`--decode-gemv-backend`); a verify of one request is 16; the
# kernel takes up to 32 (a bs-32 decode step).
ROUTED_ROWS = range(2, 33)


def _takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and x.shape[0] in ROUTED_ROWS and x.dtype == weight.dtype
            and weight.dtype in GEMV_DTYPES and x.is_contiguous() and weight.is_contiguous()
            and use_triton(x))


@contextmanager
def route_block_gemv() -> Iterator[Counter]:
    """While open, 2..32-row projections run the candidate; yields the routed calls counted
    by (site, rows)."""
    from sglang_aux.srt.layers.triton_ops.block_gemv import block_gemv

    routed: Counter = Counter()
    plain, fused, head = linear._linear, llama.norm_linear, logits_processor.lm_head_logits

    def routed_linear(layer, x, bias):
        if not _takes(x, layer.weight):
            return plain(layer, x, bias)
        routed["linear", x.shape[0]] += 1
        return block_gemv(x, layer.weight, bias)

    def routed_norm_linear(norm, layer, hidden, residual, act=None):
        if not _takes(hidden, layer.weight) or (residual is not None
                                                and not residual.is_contiguous()):
            return fused(norm, layer, hidden, residual, act)
        routed["norm_linear", hidden.shape[0]] += 1
        y, stream = block_gemv(hidden, layer.weight, layer.bias, norm_weight=norm.weight,
                               eps=norm.variance_epsilon, residual=residual)
        return (y if act is None else act(y)), stream

    def routed_lm_head(rows, weight, out=None):
        if get_tensor_model_parallel_world_size() != 1 or not _takes(rows, weight):
            return head(rows, weight, out)
        routed["lm_head", rows.shape[0]] += 1
        return block_gemv(rows, weight, out=out)

    linear._linear, llama.norm_linear = routed_linear, routed_norm_linear
    logits_processor.lm_head_logits = routed_lm_head
    try:
        yield routed
    finally:
        linear._linear, llama.norm_linear = plain, fused
        logits_processor.lm_head_logits = head

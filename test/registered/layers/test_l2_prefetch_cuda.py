"""The L2 prefetch (`triton_ops/l2_prefetch.py`) on the GPU at the Qwen2.5-Coder-1.5B shapes in
bf16: the qkv kernel that issues it writes the same bits as without it (q, the stream, the K/V
pool) at every budget, and its CUDA graph replays equal eager. The whole decode step with it:
`SGLANG_AUX_L2_PREFETCH=16` over `test_decode_cuda_graph_runner_cuda.py` (docs/kernels.md)."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding
from sglang_aux.srt.layers.triton_ops.dispatch import L2_PREFETCH_VALUES
from sglang_aux.srt.layers.triton_ops.l2_prefetch import BULK_BYTES, LINE_BYTES, plan_l2_prefetch
from sglang_aux.srt.layers.triton_ops.paired_row_gemv import row_gemv_rope_store
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 1536, 8960, 12, 2, 128
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM


def _bf16(*shape, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).bfloat16()


def _case():
    x, residual, norm = _bf16(1, HIDDEN, scale=4), _bf16(1, HIDDEN, scale=4), _bf16(HIDDEN)
    w, b = _bf16(QKV, HIDDEN, scale=HIDDEN**-0.5), _bf16(QKV)
    rope = RotaryEmbedding(HEAD_DIM, 4096, RopeScaling("default", 1e6, 4096)).cuda()
    pos, loc = torch.tensor([900], device="cuda"), torch.tensor([5], device="cuda")
    o, gu = _bf16(HIDDEN, HIDDEN), _bf16(2 * INTER, HIDDEN)
    return (x, w, b, pos, rope.cos_sin_cache), dict(norm_weight=norm, eps=1e-6,
                                                    residual=residual), loc, (o, gu)


def _run(args, kw, loc, prefetch):
    caches = [torch.zeros(8, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
              for _ in range(2)]
    x, w, b, pos, cos_sin = args
    q, stream = row_gemv_rope_store(x, w, b, pos, cos_sin, *caches, loc, HEADS, **kw,
                                    prefetch=prefetch)
    return [q, stream, *caches]


def test_the_prefetch_changes_no_bit():
    seed = fresh_seed()
    args, kw, loc, (o, gu) = _case()
    ref = _run(args, kw, loc, None)
    for mib in map(int, L2_PREFETCH_VALUES[1:]):
        for unit in (LINE_BYTES, BULK_BYTES):
            got = _run(args, kw, loc, plan_l2_prefetch(mib << 20, o, gu, unit))
            for a, r in zip(got, ref, strict=True):
                assert torch.equal(a, r), f"seed {seed}, {mib} MiB in {unit}-byte requests"


@pytest.mark.parametrize("unit", [LINE_BYTES, BULK_BYTES])
def test_graph_replay_with_the_prefetch_equals_eager(unit):
    fresh_seed()
    args, kw, loc, (o, gu) = _case()
    plan = plan_l2_prefetch(16 << 20, o, gu, unit)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _run(args, kw, loc, plan)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        outs = _run(args, kw, loc, plan)
    for i in range(3):
        args[0].copy_(_bf16(1, HIDDEN, scale=4))
        args[3].fill_(100 + i)
        graph.replay()
        for got, ref in zip(outs, _run(args, kw, loc, None), strict=True):
            assert torch.equal(got, ref)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

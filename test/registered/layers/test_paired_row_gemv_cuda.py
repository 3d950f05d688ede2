"""The paired row GEMVs (`triton_ops/paired_row_gemv.py`, the bs-1 decode's qkv and gate_up) on the
H200 at the Qwen2.5-Coder-1.5B shapes in bf16: equal to the default launches they would replace
(norm + qkv + bias then RoPE + KV store; norm + gate_up then SiLU-mul) within one bf16 rounding
(the sums are the same; the compiler may contract the rotation or the SiLU into FMAs differently
in two kernels), the same with PDL, deterministic, and CUDA graph replay == eager bitwise."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding
from sglang_aux.srt.layers.triton_ops.paired_row_gemv import (
    row_gemv_rope_store,
    row_gemv_silu_mul,
)
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store
from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 1536, 8960, 12, 2, 128  # Qwen2.5-Coder-1.5B
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM
# one bf16 rounding of O(1) values
ONE_ROUNDING = {"atol": 1.6e-2, "rtol": 8e-3}


def _inputs():
    x = torch.randn(1, HIDDEN, device="cuda").bfloat16() * 4
    return x, torch.randn_like(x) * 4, torch.randn(HIDDEN, device="cuda").bfloat16()


def _weight(n):
    return (torch.randn(n, HIDDEN, device="cuda") / HIDDEN**0.5).bfloat16()


def _caches():
    return [torch.zeros(8, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            for _ in range(2)]


def _rope_cases():
    rope = RotaryEmbedding(HEAD_DIM, 4096, RopeScaling("default", 1e6, 4096)).cuda()
    return rope.cos_sin_cache, torch.tensor([900], device="cuda"), torch.tensor([5],
                                                                               device="cuda")


def test_qkv_rope_store_equals_default_launches():
    seed = fresh_seed()
    x, residual, norm = _inputs()
    w, b = _weight(QKV), torch.randn(QKV, device="cuda").bfloat16()
    cos_sin, pos, loc = _rope_cases()
    ref_caches, caches = _caches(), _caches()
    qkv, ref_stream = row_gemv(x, w, b, norm_weight=norm, eps=1e-6, residual=residual)
    q_ref, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    rope_store(pos, q_ref, k, cos_sin, v=v, k_cache=ref_caches[0], v_cache=ref_caches[1],
               loc=loc)
    msg = lambda s: f"seed {seed}: {s}"  # noqa: E731
    for pdl in (False, True):
        q, stream = row_gemv_rope_store(x, w, b, pos, cos_sin, *caches, loc, HEADS,
                                        norm_weight=norm, eps=1e-6, residual=residual, pdl=pdl)
        assert torch.equal(stream, ref_stream)
        torch.testing.assert_close(q, q_ref, **ONE_ROUNDING, msg=msg)
        for got, ref in zip(caches, ref_caches, strict=True):
            torch.testing.assert_close(got, ref, **ONE_ROUNDING, msg=msg)
        assert torch.equal(caches[1], ref_caches[1]), "v is not rotated: the same bits"
        for _ in range(5):
            again, _ = row_gemv_rope_store(x, w, b, pos, cos_sin, *caches, loc, HEADS,
                                           norm_weight=norm, eps=1e-6, residual=residual,
                                           pdl=pdl)
            assert torch.equal(again, q), "deterministic"


def test_gate_up_silu_mul_equals_default_launches():
    seed = fresh_seed()
    x, residual, norm = _inputs()
    w = _weight(2 * INTER)
    gate_up, ref_stream = row_gemv(x, w, norm_weight=norm, eps=1e-6, residual=residual)
    ref = silu_and_mul(gate_up)
    for pdl in (False, True):
        y, stream = row_gemv_silu_mul(x, w, norm_weight=norm, eps=1e-6, residual=residual,
                                      pdl=pdl)
        assert torch.equal(stream, ref_stream)
        torch.testing.assert_close(y, ref, **ONE_ROUNDING, msg=lambda s: f"seed {seed}: {s}")


def test_graph_replay_equals_eager_bitwise():
    fresh_seed()
    x, residual, norm = _inputs()
    w_qkv, b, w_gu = _weight(QKV), torch.randn(QKV, device="cuda").bfloat16(), _weight(2 * INTER)
    cos_sin, pos, loc = _rope_cases()
    caches = _caches()

    def step():
        q, stream = row_gemv_rope_store(x, w_qkv, b, pos, cos_sin, *caches, loc, HEADS,
                                        norm_weight=norm, eps=1e-6, residual=residual)
        act, _ = row_gemv_silu_mul(q, w_gu, norm_weight=norm,
                                   eps=1e-6, residual=stream)
        return [q, act, *(c.clone() for c in caches)]

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = step()
    for i in range(3):
        x.copy_(torch.randn_like(x))
        pos.fill_(100 + i)
        graph.replay()
        for got, ref in zip(outs, step(), strict=True):
            assert torch.equal(got, ref)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

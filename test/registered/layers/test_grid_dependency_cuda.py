"""Programmatic dependent launch (`triton_ops/grid_dependency.py`, the default where the device
has it) on the H200: a chain of our kernels in which each reads what the one before it wrote
(fused norm + qkv, RoPE + KV store, o_proj, fused norm + gate_up, SiLU-mul, down, RMSNorm),
launched dependent, equals the same chain launched plainly, bitwise, eagerly and replayed from
a CUDA graph on new inputs (a kernel that read before its wait would read stale data); the
switch's bad values and devices are named."""

import sys

import pytest
import torch

from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding
from sglang_aux.srt.layers.triton_ops.grid_dependency import ENV_VAR, resolve_pdl
from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store
from sglang_aux.srt.layers.triton_ops.row_gemv import row_gemv
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import REAL_TRITON_ON_CUDA, fresh_seed

register_cuda_ci(est_time=30, suite="default")

pytestmark = REAL_TRITON_ON_CUDA
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 1536, 8960, 12, 2, 128  # Qwen2.5-Coder-1.5B
QKV = (HEADS + 2 * KV_HEADS) * HEAD_DIM


class Layer:
    """One decoder layer's kernels at one token (attention left out: q stands for its output)."""

    def __init__(self):
        def w(n, k):
            return (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()

        self.w_qkv, self.w_o = w(QKV, HIDDEN), w(HIDDEN, HEADS * HEAD_DIM)
        self.w_gu, self.w_down = w(2 * INTER, HIDDEN), w(HIDDEN, INTER)
        self.bias = torch.randn(QKV, device="cuda").bfloat16()
        self.norm = torch.randn(HIDDEN, device="cuda").bfloat16()
        self.rope = RotaryEmbedding(HEAD_DIM, 4096, RopeScaling("default", 1e6, 4096)).cuda()
        self.caches = [torch.zeros(8, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                       for _ in range(2)]
        self.position = torch.tensor([900], device="cuda")
        self.loc = torch.tensor([5], device="cuda")

    def __call__(self, x, residual, pdl):
        qkv, stream = row_gemv(x, self.w_qkv, self.bias, norm_weight=self.norm, eps=1e-6,
                               residual=residual, pdl=pdl)
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        rope_store(self.position, q, k, self.rope.cos_sin_cache, v=v, k_cache=self.caches[0],
                   v_cache=self.caches[1], loc=self.loc, pdl=pdl)
        o = row_gemv(q.contiguous(), self.w_o, pdl=pdl)
        gate_up, stream2 = row_gemv(o, self.w_gu, norm_weight=self.norm, eps=1e-6,
                                    residual=stream, pdl=pdl)
        down = row_gemv(silu_and_mul(gate_up, pdl=pdl), self.w_down, pdl=pdl)
        out, _ = rms_norm(down, self.norm, 1e-6, residual=stream2, pdl=pdl)
        return [qkv, o, gate_up, down, out, *(c.clone() for c in self.caches)]


def test_dependent_chain_equals_plain_eager_and_replayed():
    seed = fresh_seed()
    layer = Layer()
    x = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    residual = torch.randn_like(x)
    plain = layer(x, residual, pdl=False)
    for got, ref in zip(layer(x, residual, pdl=True), plain, strict=True):
        assert torch.equal(got, ref), f"eager, seed {seed}"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        layer(x, residual, pdl=True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = layer(x, residual, pdl=True)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        residual.copy_(torch.randn_like(x))
        graph.replay()
        for got, ref in zip(outs, layer(x, residual, pdl=False), strict=True):
            assert torch.equal(got, ref), f"replay, seed {seed}"


def test_switch_values_and_devices(monkeypatch):
    x = torch.zeros(1, device="cuda")
    monkeypatch.setenv(ENV_VAR, "1")
    assert resolve_pdl(None, x) and not resolve_pdl(False, x)
    monkeypatch.setenv(ENV_VAR, "0")
    assert not resolve_pdl(None, x)
    monkeypatch.delenv(ENV_VAR)  # auto: one token where the device has it, off on the CPU
    assert resolve_pdl(None, x) == (torch.cuda.get_device_capability() >= (9, 0))
    assert not resolve_pdl(None, torch.zeros(1))
    assert not resolve_pdl(None, torch.zeros(2, 8, device="cuda"))  # lost at bs 8 and 32
    monkeypatch.setenv(ENV_VAR, "yes")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='yes'; choose from auto, 0, 1"):
        resolve_pdl(None, x)
    with pytest.raises(ValueError, match="needs compiled Triton on a CUDA device"):
        resolve_pdl(True, torch.zeros(1))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

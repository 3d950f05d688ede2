"""Fused-layer kernels on the H200: bf16 outputs vs fp32 references at SmolLM2's shapes,
fp32 kernels vs their torch twins, and a tiny model fused vs unfused on CUDA."""

import sys

import pytest
import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.activation import SiluAndMul
from sglang_aux.srt.layers.layernorm import RMSNorm
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding
from sglang_aux.srt.layers.triton_ops.attn_res_mix import MAX_SOURCES, attn_res_mix
from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR
from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul
from sglang_aux.srt.models.kimi_k3 import attn_res_mix as attn_res_mix_twin
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.kernel_checks import default_rope, fresh_seed
from sglang_aux.test.runtime_utils import (
    eager_forward,
    fixed_batch,
    make_runner,
    prefill_random,
    tiny_checkpoint,
)

register_cuda_ci(est_time=60, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64  # SmolLM2-135M
K3_HIDDEN = 7168
# bf16 output rounding (2^-8 relative) on O(1..10) values; fp32: summation order only.
BF16_TOL = {"atol": 4e-2, "rtol": 1.6e-2}
FP32_TOL = {"atol": 1e-5, "rtol": 1e-5}


@pytest.mark.parametrize("tokens", [1, 8, 256])
def test_rms_norm_bf16_vs_fp32(tokens):
    seed = fresh_seed()
    norm = RMSNorm(HIDDEN, 1e-5).cuda()
    norm.weight.data.normal_()
    x = torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16) * 4
    residual = torch.randn_like(x) * 4
    out, new_res = rms_norm(x, norm.weight, 1e-5, residual)
    ref_res = x + residual  # one bf16 rounding of the exact sum, as the kernel stores
    assert torch.equal(new_res, ref_res), f"seed {seed}"
    ref = norm.forward_native(ref_res.float())
    torch.testing.assert_close(out.float(), ref, **BF16_TOL, msg=lambda m: f"seed {seed}: {m}")
    x32, r32 = x.float(), residual.float()
    out32, _ = rms_norm(x32, norm.weight, 1e-5, r32)
    torch.testing.assert_close(out32, norm.forward_native(x32, r32)[0], **FP32_TOL)


@pytest.mark.parametrize("tokens", [1, 8, 256])
def test_silu_and_mul_bf16_vs_fp32(tokens):
    seed = fresh_seed()
    x = torch.randn(tokens, 2 * INTER, device="cuda", dtype=torch.bfloat16) * 3
    ref = SiluAndMul.forward_native(x.float())
    torch.testing.assert_close(silu_and_mul(x).float(), ref, **BF16_TOL,
                               msg=lambda m: f"seed {seed}: {m}")
    torch.testing.assert_close(silu_and_mul(x.float()), ref, **FP32_TOL)


@pytest.mark.parametrize("tokens", [1, 8, 256])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_bf16_vs_fp32(tokens, qk_norm):
    seed = fresh_seed()
    rope = RotaryEmbedding(HEAD_DIM, 8192, default_rope(100000.0, 8192)).cuda()
    norms = [RMSNorm(HEAD_DIM, 1e-6).cuda() for _ in range(2)] if qk_norm else [None, None]
    for n in norms:
        if n is not None:
            n.weight.data.normal_()
    qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda",
                      dtype=torch.bfloat16)
    q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    loc = torch.randperm(4 * tokens, device="cuda")[:tokens]
    k_cache = torch.full((4 * tokens, KV_HEADS, HEAD_DIM), float("nan"), device="cuda",
                         dtype=torch.bfloat16)
    v_cache = torch.full_like(k_cache, float("nan"))
    ref_q, ref_k = rope.forward_native(positions, q.float(), k.float(), *norms)
    args = (norms[0].weight, norms[1].weight, 1e-6) if qk_norm else ()
    rope_store(positions, q, k, rope.cos_sin_cache, *args, v=v, k_cache=k_cache,
               v_cache=v_cache, loc=loc)
    msg = lambda m: f"seed {seed}: {m}"  # noqa: E731
    torch.testing.assert_close(q.float(), ref_q, **BF16_TOL, msg=msg)
    torch.testing.assert_close(k_cache[loc].view(tokens, -1).float(), ref_k, **BF16_TOL, msg=msg)
    assert torch.equal(v_cache[loc].view(tokens, -1), v)


@pytest.mark.parametrize("tokens", [1, 32])
@pytest.mark.parametrize("num_sources", [1, 4, MAX_SOURCES])
def test_attn_res_mix_bf16_vs_fp32(tokens, num_sources):
    seed = fresh_seed()
    sources = [torch.randn(tokens, K3_HIDDEN, device="cuda", dtype=torch.bfloat16) * (1 + i)
               for i in range(num_sources)]
    norm = RMSNorm(K3_HIDDEN, 1e-6).cuda()
    norm.weight.data.normal_()
    query = torch.randn(K3_HIDDEN, device="cuda") * 3 / K3_HIDDEN**0.5
    ref = attn_res_mix_twin([s.float() for s in sources], query, norm)
    out = attn_res_mix(sources, query, norm.weight, 1e-6)
    torch.testing.assert_close(out.float(), ref, **BF16_TOL, msg=lambda m: f"seed {seed}: {m}")
    out32 = attn_res_mix([s.float() for s in sources], query, norm.weight, 1e-6)
    torch.testing.assert_close(out32, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-k3"])
def test_model_fused_equals_unfused_on_cuda(tmp_path, monkeypatch, preset):
    path = tiny_checkpoint(preset, tmp_path)
    outs = {}
    for mode in ("off", "auto"):
        monkeypatch.setenv(ENV_VAR, mode)
        runner = make_runner(path, device="cuda", max_total_tokens=1024,
                             max_running_requests=4, context_length=256)
        reqs = prefill_random(runner, [9, 40], seed=1)
        fb = fixed_batch(runner, reqs, ForwardMode.TARGET_VERIFY, 4, seed=2)
        outs[mode] = eager_forward(runner, fb).next_token_logits.float()
    torch.testing.assert_close(outs["auto"], outs["off"], atol=1e-4, rtol=1e-4)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

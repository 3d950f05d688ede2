"""Fused-layer Triton kernels == their torch twins == the unfused math, via Triton's CPU
interpreter (fp32 and fp16; bf16 is broken there, the H200 file checks it).

Fresh random inputs every run (the seed is in every failure message), outputs poisoned
before each kernel, strided views as the merged projections produce them.
"""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang_aux.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang_aux.srt.layers.triton_ops.attn_res_mix import MAX_SOURCES, attn_res_mix  # noqa: E402
from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm  # noqa: E402
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store  # noqa: E402
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul  # noqa: E402
from sglang_aux.srt.models.kimi_k3 import attn_res_mix as attn_res_mix_twin  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import default_rope, fresh_seed

register_cpu_ci(est_time=30, suite="default")

# fp32: summation order only; fp16: one rounding of the output (twins round intermediates too).
TOL = {torch.float32: {"atol": 1e-5, "rtol": 1e-5}, torch.float16: {"atol": 2e-3, "rtol": 2e-3}}
DTYPES = [torch.float32, torch.float16]
POISON = float("nan")
# The cos/sin cache holds fp32 angles: at positions < 512 they are off by ~512 * 2^-24 rad.
# the float32 cache rounds each angle pos * inv_freq: a few ulps of the largest angle, which
# moves an output by that much times its pair's magnitude (a wrong rotation moves it by O(1))
CACHE_ANGLE_ERR = 512 * 2.0**-20


def assert_near(actual, expected, dtype, seed, what, atol: float = 0.0):
    tol = {k: max(v, atol) for k, v in TOL[dtype].items()}
    torch.testing.assert_close(actual.float(), expected.float(), **tol,
                               msg=lambda m: f"{what} (seed {seed}): {m}")


def ref_rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def ref_rope(x: torch.Tensor, positions: torch.Tensor, head_dim: int, base: float):
    """HF's rotate_half form in float64, `[T, heads * D]` -> `[T, heads, D]`."""
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = positions.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    x = x.double().reshape(x.shape[0], -1, head_dim)
    half = torch.cat([-x[..., head_dim // 2:], x[..., : head_dim // 2]], -1)
    return x * cos + half * sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 100])  # a power of two and not
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_kernel(dtype, n, with_residual):
    seed = fresh_seed()
    norm = RMSNorm(n, eps=1e-5)
    norm.weight.data.normal_()
    wide = torch.randn(7, n + 24, dtype=dtype)
    x = wide[:, 5:5 + n]  # rows strided like a slice of a wider buffer
    residual = torch.randn(7, n, dtype=dtype) if with_residual else None
    x_in, r_in = x.clone(), None if residual is None else residual.clone()
    out = rms_norm(x, norm.weight, norm.variance_epsilon, residual)
    twin = norm.forward_native(x, residual)
    assert torch.equal(x, x_in) and (residual is None or torch.equal(residual, r_in))
    if residual is None:
        assert_near(out, twin, dtype, seed, "normed vs twin")
        assert_near(out, ref_rms(x, norm.weight, 1e-5), dtype, seed, "normed vs fp64")
        return
    assert_near(out[0], twin[0], dtype, seed, "normed vs twin")
    assert torch.equal(out[1], twin[1]), f"new residual is the exact sum (seed {seed})"
    assert_near(out[0], ref_rms(x + residual, norm.weight, 1e-5), dtype, seed, "normed vs fp64")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [96, 1536])  # one column block and two
def test_silu_and_mul_kernel(dtype, inter):
    seed = fresh_seed()
    x = torch.randn(5, 2 * inter, dtype=dtype) * 3
    out = silu_and_mul(x)
    assert_near(out, SiluAndMul.forward_native(x), dtype, seed, "vs twin")
    g, u = x.double().chunk(2, -1)
    assert_near(out, g * torch.sigmoid(g) * u, dtype, seed, "vs fp64")


def _qkv(tokens: int, heads: int, kv_heads: int, d: int, dtype):
    """q, k, v views of one merged projection output, as `qkv_proj.split` returns them."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, dtype=dtype)
    return qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 2, 16), (2, 1, 24)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_kernel_in_place(dtype, heads, kv_heads, d, qk_norm):
    seed = fresh_seed()
    rope = RotaryEmbedding(d, 512, default_rope(10000.0, 512))
    norms = [RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)] if qk_norm else [None, None]
    for n in norms:
        if n is not None:
            n.weight.data.normal_()
    q, k, _ = _qkv(6, heads, kv_heads, d, dtype)
    positions = torch.randint(0, 512, (6,))
    twin_q, twin_k = rope.forward_native(positions, q.clone(), k.clone(), *norms)
    ref_in = [n.forward_native(t.reshape(-1, d)).view(t.shape) if n is not None else t.clone()
              for n, t in zip(norms, (q, k), strict=True)]
    args = (norms[0].weight, norms[1].weight, 1e-6) if qk_norm else ()
    rope_store(positions, q, k, rope.cos_sin_cache, *args)
    for name, got, twin, src in (("q", q, twin_q, ref_in[0]), ("k", k, twin_k, ref_in[1])):
        assert_near(got, twin, dtype, seed, f"{name} vs twin")
        assert_near(got.reshape(6, -1, d), ref_rope(src, positions, d, 10000.0), dtype, seed,
                    f"{name} vs fp64 rotate_half",
                    atol=CACHE_ANGLE_ERR * 2 * float(src.float().abs().max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_q", [True, False])  # False: the draft's context K/V
def test_rope_kernel_stores_kv_at_slots(dtype, with_q):
    seed = fresh_seed()
    heads, kv_heads, d, slots = 4, 2, 32, 40
    rope = RotaryEmbedding(d, 256, default_rope(1e6, 256))
    q_norm, k_norm = RMSNorm(d, 1e-6), RMSNorm(d, 1e-6)
    k_norm.weight.data.normal_()
    q_norm.weight.data.normal_()
    q, k, v = _qkv(5, heads, kv_heads, d, dtype)
    q = q if with_q else None
    positions = torch.randint(0, 256, (5,))
    loc = torch.randperm(slots)[:5]
    k_cache = torch.full((slots, kv_heads, d), POISON, dtype=dtype)
    v_cache = torch.full_like(k_cache, POISON)
    k_before = k.clone()
    twin_q, twin_k = rope.forward_native(positions, None if q is None else q.clone(), k,
                                         q_norm if with_q else None, k_norm)
    rope_store(positions, q, k, rope.cos_sin_cache, q_norm.weight if with_q else None,
               k_norm.weight, 1e-6, v=v, k_cache=k_cache, v_cache=v_cache, loc=loc)
    assert torch.equal(k, k_before), f"a stored k is left as it was (seed {seed})"
    assert_near(k_cache[loc].view(5, -1), twin_k, dtype, seed, "stored k vs twin")
    assert torch.equal(v_cache[loc].view(5, -1), v), f"v is copied exactly (seed {seed})"
    others = torch.ones(slots, dtype=torch.bool)
    others[loc] = False
    assert k_cache[others].isnan().all() and v_cache[others].isnan().all(), "only `loc` written"
    if with_q:
        assert_near(q, twin_q, dtype, seed, "q vs twin")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_sources", [1, 3, MAX_SOURCES])
@pytest.mark.parametrize("n", [64, 100])
def test_attn_res_mix_kernel(dtype, num_sources, n):
    seed = fresh_seed()
    sources = [torch.randn(6, n, dtype=dtype) * (1 + i) for i in range(num_sources)]
    norm = RMSNorm(n, 1e-6)
    norm.weight.data.normal_()
    query = torch.randn(n) * 3 / n**0.5  # scores of O(3): a clearly non-uniform softmax
    out = attn_res_mix(sources, query, norm.weight, 1e-6)
    assert_near(out, attn_res_mix_twin(sources, query, norm), dtype, seed, "vs twin")
    scores = torch.stack([ref_rms(s, norm.weight, 1e-6) @ query.double() for s in sources])
    w = scores.softmax(0)
    assert_near(out, sum(wi[:, None] * s.double() for wi, s in zip(w, sources, strict=True)), dtype,
          seed, "vs fp64")


def test_rope_store_rejects_bad_shapes():
    rope = RotaryEmbedding(16, 64, default_rope(10000.0, 64))
    k = torch.randn(3, 40)
    with pytest.raises(ValueError, match=r"k must be \[tokens, heads \* 16\]"):
        rope_store(torch.zeros(3, dtype=torch.long), None, k, rope.cos_sin_cache)
    with pytest.raises(ValueError, match="needs v, k_cache, v_cache and loc"):
        rope_store(torch.zeros(3, dtype=torch.long), None, torch.randn(3, 32), rope.cos_sin_cache,
                   k_cache=torch.zeros(4, 2, 16))
    with pytest.raises(ValueError, match=r"residual \(2, 8\)"):
        rms_norm(torch.randn(3, 8), torch.ones(8), 1e-6, torch.randn(2, 8))
    with pytest.raises(ValueError, match=f"1..{MAX_SOURCES} sources, got {MAX_SOURCES + 1}"):
        attn_res_mix([torch.randn(2, 8)] * (MAX_SOURCES + 1), torch.ones(8), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"all \(2, 8\) torch.float32; got \(3, 8\)"):
        attn_res_mix([torch.randn(2, 8), torch.randn(3, 8)], torch.ones(8), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"\[tokens, 2 \* I\]"):
        silu_and_mul(torch.randn(3, 7))


def test_zero_tokens_launch_nothing():
    rope = RotaryEmbedding(16, 64, default_rope(10000.0, 64))
    empty = torch.empty(0, 32)
    rope_store(torch.empty(0, dtype=torch.long), empty, empty, rope.cos_sin_cache)
    assert rms_norm(empty, torch.ones(32), 1e-6).shape == (0, 32)
    assert silu_and_mul(empty).shape == (0, 16)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

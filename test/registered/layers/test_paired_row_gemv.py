"""The paired row GEMVs (`triton_ops/paired_row_gemv.py`, the bs-1 decode's qkv and gate_up) == the
default launches they would replace, via Triton's CPU interpreter (fp32 and fp16; the `_cuda`
twin checks bf16): norm + qkv + bias then RoPE + KV store, and norm + gate_up then SiLU-mul,
exact (the same sums, the same roundings, the same rotation and SiLU expressions), with and
without the residual add, at the table's tiles and at small ones (several tiles a head, a ragged
half); plus the inputs they refuse."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.layers.rope_scaling import RopeScaling  # noqa: E402
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang_aux.srt.layers.triton_ops.paired_row_gemv import (  # noqa: E402
    row_gemv_rope_store,
    row_gemv_silu_mul,
)
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store  # noqa: E402
from sglang_aux.srt.layers.triton_ops.row_gemv import RowGemvConfig, row_gemv  # noqa: E402
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import fresh_seed  # noqa: E402

register_cpu_ci(est_time=30, suite="default")

DTYPES = [torch.float32, torch.float16]
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SLOTS = 96, 4, 2, 16, 10
# None: the table's 8 x 1024 (two tiles a head here); 2 x 32: eight, with three K steps
CONFIGS = [None, RowGemvConfig(2, 32), RowGemvConfig(4, 64, num_stages=2)]


def _norm_inputs(k, dtype, with_residual):
    x = torch.randn(1, k).to(dtype)
    residual = torch.randn(1, k).to(dtype) if with_residual else None
    return x, residual, torch.randn(k).to(dtype)


def _weight(n, k, dtype):
    return (torch.randn(n, k) / k**0.5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("with_residual", [False, True])
def test_qkv_rope_store_equals_gemv_then_rope_store(dtype, cfg, with_residual):
    seed = fresh_seed()
    n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    x, residual, norm_w = _norm_inputs(HIDDEN, dtype, with_residual)
    w, b = _weight(n, HIDDEN, dtype), torch.randn(n).to(dtype)
    rope = RotaryEmbedding(HEAD_DIM, 64, RopeScaling("default", 10000.0, 64))
    positions, loc = torch.tensor([37]), torch.tensor([6])
    caches = [torch.randn(SLOTS, KV_HEADS, HEAD_DIM).to(dtype) for _ in range(2)]
    caches += [c.clone() for c in caches]

    qkv, ref_stream = row_gemv(x, w, b, norm_weight=norm_w, eps=1e-6, residual=residual,
                               config=cfg)
    q_ref, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    unrotated = q_ref.clone()
    rope_store(positions, q_ref, k, rope.cos_sin_cache, v=v, k_cache=caches[0],
               v_cache=caches[1], loc=loc)
    q, stream = row_gemv_rope_store(x, w, b, positions, rope.cos_sin_cache, caches[2],
                                    caches[3], loc, HEADS, norm_weight=norm_w, eps=1e-6,
                                    residual=residual, config=cfg)
    msg = f"seed {seed}"
    assert q.shape == (1, HEADS * HEAD_DIM) and q.dtype == dtype
    assert torch.equal(q, q_ref), msg
    assert not torch.equal(q, unrotated), f"rotated at position 37 ({msg})"
    assert torch.equal(caches[2], caches[0]), f"k cache, other slots untouched ({msg})"
    assert not torch.equal(caches[2][6], caches[2][5]), msg
    assert torch.equal(caches[3], caches[1]), f"v cache ({msg})"
    assert torch.equal(stream, ref_stream) and (stream is x) == (residual is None), msg


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg,inter", [(None, 40), (RowGemvConfig(4, 32), 37),
                                       (RowGemvConfig(8, 64, num_warps=8), 40)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_gate_up_silu_mul_equals_gemv_then_silu_mul(dtype, cfg, inter, with_residual):
    seed = fresh_seed()
    x, residual, norm_w = _norm_inputs(HIDDEN, dtype, with_residual)
    w = _weight(2 * inter, HIDDEN, dtype)
    gate_up, ref_stream = row_gemv(x, w, norm_weight=norm_w, eps=1e-6, residual=residual,
                                   config=cfg)
    y, stream = row_gemv_silu_mul(x, w, norm_weight=norm_w, eps=1e-6, residual=residual,
                                  config=cfg)
    assert y.shape == (1, inter) and y.dtype == dtype
    assert torch.equal(y, silu_and_mul(gate_up)), f"seed {seed}"
    assert torch.equal(stream, ref_stream), f"seed {seed}"


def test_plain_gate_up_silu_mul():
    """Without the fused norm (the down projection's input is still its own launch)."""
    seed = fresh_seed()
    x, w = torch.randn(1, HIDDEN), _weight(2 * 24, HIDDEN, torch.float32)
    y, stream = row_gemv_silu_mul(x, w)
    assert stream is x and torch.equal(y, silu_and_mul(row_gemv(x, w))), f"seed {seed}"


def test_bad_inputs_are_named():
    x, cos_sin = torch.randn(1, HIDDEN), torch.randn(64, HEAD_DIM)
    n = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    w, cache, one = torch.randn(n, HIDDEN), torch.zeros(SLOTS, KV_HEADS, HEAD_DIM), \
        torch.tensor([1])
    with pytest.raises(ValueError, match=r"weight rows 128 are not \(q heads 3"):
        row_gemv_rope_store(x, w, None, one, cos_sin, cache, cache, one, 3)
    with pytest.raises(ValueError, match=r"v_cache \(10, 1, 16\)"):
        row_gemv_rope_store(x, w, None, one, cos_sin, cache, cache[:, :1], one, HEADS)
    with pytest.raises(ValueError, match=r"positions \(2,\) and loc"):
        row_gemv_rope_store(x, w, None, torch.tensor([1, 2]), cos_sin, cache, cache, one,
                            HEADS)
    with pytest.raises(ValueError, match="even number of rows, got 7"):
        row_gemv_silu_mul(x, torch.randn(7, HIDDEN))
    with pytest.raises(ValueError, match="even block_n >= 2, got 1"):
        row_gemv_silu_mul(x, torch.randn(8, HIDDEN), config=RowGemvConfig(1, 32))
    with pytest.raises(ValueError, match=r"one contiguous row \[1, K\]"):
        row_gemv_silu_mul(torch.randn(2, HIDDEN), torch.randn(8, HIDDEN))
    with pytest.raises(ValueError, match="programmatic dependent launch needs"):
        row_gemv_silu_mul(x, torch.randn(8, HIDDEN), pdl=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

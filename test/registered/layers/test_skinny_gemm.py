"""The decode GEMV kernel (`triton_ops/skinny_gemm.py`) == the unfused torch math, via Triton's
CPU interpreter (fp32 and fp16; bf16 is broken there, the `_cuda` twin checks it): plain, with
bias, split along K (the table's split and forced ones, K not a multiple of the block), and
the fused RMSNorm (with and without the residual add) and gate | up SiLU-mul variants.

Fresh random inputs every run (the seed is in every failure message); weights scaled by
1/sqrt(K) so outputs are O(1) and the tolerances below are absolute and relative alike.
"""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the layers.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from sglang_aux.srt.layers.activation import SiluAndMul  # noqa: E402
from sglang_aux.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang_aux.srt.layers.triton_ops.dispatch import GEMV_MAX_ROWS  # noqa: E402
from sglang_aux.srt.layers.triton_ops.skinny_gemm import (  # noqa: E402
    H200_SMS,
    gemv_config,
    skinny_gemm,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import fresh_seed  # noqa: E402

register_cpu_ci(est_time=70, suite="default")

BENCH = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_gemv.py"

# fp32: summation order only (K <= 1000 terms of O(1/sqrt(K))); fp16: the kernel rounds once
# where the twin rounds the projection, the SiLU and the product each (up to ~3 fp16 ulps).
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.float16: {"atol": 4e-3, "rtol": 4e-3}}
DTYPES = [torch.float32, torch.float16]
# (M, N, K, split_k): None takes the table's split (which splits all of these: N < 132 tiles),
# 1 forces one program along K.
SHAPES = [(1, 300, 100, None), (5, 64, 1000, None), (16, 40, 257, None), (3, 50, 130, 4),
          (8, 96, 64, 1), (2, 48, 200, 7)]


def _inputs(m, n, k, dtype, bias=False):
    x = torch.randn(m, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    return x, w, torch.randn(n).to(dtype) if bias else None


def _close(actual, expected, dtype, seed, what):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype],
                               msg=lambda m: f"{what} (seed {seed}): {m}")


def _norm(k, dtype):
    norm = RMSNorm(k, eps=1e-5).to(dtype)
    norm.weight.data.normal_()
    return norm


def test_table_splits_k_only_when_n_leaves_sms_idle():
    lm_head = gemv_config(151936, 1536, 2, H200_SMS)  # 1187 tiles of 128: no split
    assert (lm_head.block_n, lm_head.split_k) == (128, 1)
    gate_up = gemv_config(8960, 1536, 2, H200_SMS)  # SiLU-mul: I = 8960 tiles of gate | up
    assert gate_up.split_k == 1 and 8960 / gate_up.block_n >= H200_SMS
    down = gemv_config(1536, 8960, 2, H200_SMS)
    assert down.split_k > 1 and down.k_per_split % down.block_k == 0
    assert (down.split_k - 1) * down.k_per_split < 8960 <= down.split_k * down.k_per_split
    assert gemv_config(64, 1000, 4, H200_SMS, split_k=100).split_k == 16  # one block each at most


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,split_k", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_equals_linear(dtype, m, n, k, split_k, bias):
    seed = fresh_seed()
    x, w, b = _inputs(m, n, k, dtype, bias)
    y = skinny_gemm(x, w, b, split_k=split_k)
    assert y.shape == (m, n) and y.dtype == dtype
    _close(y, F.linear(x, w, b), dtype, seed, "vs F.linear")
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    _close(y, ref, dtype, seed, "vs fp64")


@pytest.mark.parametrize("split_k", [None, 5])
def test_split_reduce_is_deterministic_and_rearms(split_k):
    """The last program's reduction sums in split order: repeated launches (which also need
    the counters back at zero, else no program reduces) agree bitwise."""
    fresh_seed()
    x, w, _ = _inputs(4, 40, 900, torch.float32)
    first = skinny_gemm(x, w, split_k=split_k)
    for _ in range(3):
        assert torch.equal(skinny_gemm(x, w, split_k=split_k), first)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,n,k,split_k", SHAPES[:4])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_norm_fused_equals_norm_then_linear(dtype, m, n, k, split_k, with_residual, bias):
    seed = fresh_seed()
    x, w, b = _inputs(m, n, k, dtype, bias)
    residual = torch.randn(m, k).to(dtype) if with_residual else None
    norm = _norm(k, dtype)
    x_in = x.clone()
    y, stream = skinny_gemm(x, w, b, norm_weight=norm.weight, eps=norm.variance_epsilon,
                            residual=residual, split_k=split_k)
    normed, ref_stream = (norm.forward_native(x), x) if residual is None else \
        norm.forward_native(x, residual)
    assert torch.equal(x, x_in), "the input is not written"
    assert torch.equal(stream, ref_stream), f"the stream is the exact (rounded) sum (seed {seed})"
    assert (stream is x) == (residual is None)
    _close(y, F.linear(normed, w, b), dtype, seed, "vs norm then linear")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,inter,k,split_k", [(1, 150, 100, None), (16, 24, 257, None),
                                               (3, 40, 130, 4), (8, 48, 64, 1)])
@pytest.mark.parametrize("norm", [False, True])
def test_silu_mul_fused_equals_linear_then_activation(dtype, m, inter, k, split_k, norm):
    seed = fresh_seed()
    x, w, _ = _inputs(m, 2 * inter, k, dtype)
    w = w * 3  # gate values of O(3): SiLU well away from linear
    rms = _norm(k, dtype) if norm else None
    residual = torch.randn(m, k).to(dtype) if norm else None
    kwargs = {"norm_weight": rms.weight, "eps": rms.variance_epsilon,
              "residual": residual} if norm else {}
    out = skinny_gemm(x, w, silu_mul=True, split_k=split_k, **kwargs)
    y = out[0] if norm else out
    assert y.shape == (m, inter)
    normed = rms.forward_native(x, residual)[0] if norm else x
    _close(y, SiluAndMul.forward_native(F.linear(normed, w)), dtype, seed, "vs unfused")
    g, u = F.linear(normed.double(), w.double()).chunk(2, -1)
    _close(y, F.silu(g) * u, dtype, seed, "vs fp64 activation")


def test_bias_reaches_both_halves_of_a_silu_mul():
    seed = fresh_seed()
    x, w, b = _inputs(2, 64, 96, torch.float32, bias=True)
    y = skinny_gemm(x, w, b, silu_mul=True, split_k=3)
    assert y.shape == (2, 32)  # the gate and up halves of 64 weight rows, multiplied
    _close(y, SiluAndMul.forward_native(F.linear(x, w, b)), torch.float32, seed, "vs unfused")


def test_bad_inputs_are_named():
    x, w = torch.randn(3, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match=rf"rows <= {GEMV_MAX_ROWS}, K\] .* shape \(17, 32\)"):
        skinny_gemm(torch.randn(17, 32), w)
    with pytest.raises(ValueError, match=r"weight \(8, 30\) .* for the input \(3, 32\)"):
        skinny_gemm(x, torch.randn(8, 30))
    with pytest.raises(ValueError, match="torch.float32 and torch.float16"):
        skinny_gemm(x, w.half())
    with pytest.raises(ValueError, match=r"bias \(7,\) does not match the weight's 8 rows"):
        skinny_gemm(x, w, torch.randn(7))
    with pytest.raises(ValueError, match="even rows, got 7"):
        skinny_gemm(x, torch.randn(7, 32), silu_mul=True)
    with pytest.raises(ValueError, match=r"residual \(2, 32\) .* needs a norm"):
        skinny_gemm(x, w, norm_weight=torch.ones(32), residual=torch.randn(2, 32))
    with pytest.raises(ValueError, match=r"norm weight \(16,\) does not match K = 32"):
        skinny_gemm(x, w, norm_weight=torch.ones(16))


def test_zero_rows_launch_nothing():
    y, stream = skinny_gemm(torch.empty(0, 32), torch.randn(8, 32), norm_weight=torch.ones(32),
                            residual=torch.empty(0, 32))
    assert y.shape == (0, 8) and stream.shape == (0, 32)


def test_bench_runs_on_the_cpu(tmp_path):
    """bench_gemv.py's smoke mode: interpreter, shrunk shapes, checked outputs, JSON."""
    out = tmp_path / "gemv.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--iters", "1",
                           "--rows", "1", "16", "--shapes", "qkv", "down", "--out", str(out)],
                          cwd=BENCH.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [(r["shape"], r["m"]) for r in result["rows"]] == [
        ("qkv", 1), ("qkv", 16), ("down", 1), ("down", 16)]
    for r in result["rows"]:
        assert r["max_err"] < 1e-4 and r.get("max_err_fused", 0.0) < 1e-4, r
        assert r["ours"]["us"] > 0 and r["cublas"]["tb_s"] > 0
    assert "ours_fused" in result["rows"][0] and "ours_fused" not in result["rows"][2]
    assert "down" in proc.stdout.splitlines()[-1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

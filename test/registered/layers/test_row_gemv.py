"""The decode GEMV kernel (`triton_ops/row_gemv.py`) == the unfused torch math, via Triton's
CPU interpreter (fp32 and fp16; bf16 is broken there, the `_cuda` twin checks it): plain, with
bias, K not a multiple of the tile, several tile configurations, and the fused RMSNorm (with
and without the residual add).

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

from sglang_aux.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang_aux.srt.layers.triton_ops.row_gemv import (  # noqa: E402
    NARROW_TILE,
    WIDE_N,
    RowGemvConfig,
    row_gemv,
    row_gemv_config,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import fresh_seed  # noqa: E402

register_cpu_ci(est_time=40, suite="default")

BENCH = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_gemv.py"

# fp32: summation order only; fp16: the kernel rounds once where the twin rounds the
# projection, the SiLU and the product each (up to ~3 fp16 ulps).
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.float16: {"atol": 4e-3, "rtol": 4e-3}}
DTYPES = [torch.float32, torch.float16]
# (N, K, tiles): None takes the table's; small tiles make several programs and K steps.
SHAPES = [(300, 100, None), (64, 1000, RowGemvConfig(8, 128)), (40, 257, RowGemvConfig(4, 64)),
          (33, 130, RowGemvConfig(2, 32, num_stages=3))]


def _inputs(n, k, dtype, bias=False):
    x = torch.randn(1, k).to(dtype)
    w = (torch.randn(n, k) / k**0.5).to(dtype)
    return x, w, torch.randn(n).to(dtype) if bias else None


def _close(actual, expected, dtype, seed, what):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype],
                               msg=lambda m: f"{what} (seed {seed}): {m}")


def _norm(k, dtype):
    norm = RMSNorm(k, eps=1e-5).to(dtype)
    norm.weight.data.normal_()
    return norm


def test_table_gives_wide_projections_short_rows():
    assert row_gemv_config(151936) == row_gemv_config(WIDE_N) != row_gemv_config(WIDE_N - 1)
    assert row_gemv_config(WIDE_N).block_n == 4
    assert row_gemv_config(2048, fused_norm=True).block_n > row_gemv_config(2048).block_n



def test_narrow_unfused_projections_take_the_wide_k_tile():
    """o_proj and down (narrow, no fused norm) take the 2,048-wide K tile; the GEMV is right
    at an o_proj-like K below one tile and a down-like K over several, with a ragged tail."""
    assert row_gemv_config(1536) == row_gemv_config(WIDE_N - 1) == NARROW_TILE
    assert NARROW_TILE.block_k == 2048
    assert NARROW_TILE not in (row_gemv_config(1536, fused_norm=True), row_gemv_config(WIDE_N))
    for n, k in [(16, 1536), (8, 4500)]:
        seed = fresh_seed()
        x, w, b = _inputs(n, k, torch.float32, bias=True)
        _close(row_gemv(x, w, b, config=NARROW_TILE), F.linear(x, w, b), torch.float32, seed,
               (n, k))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_equals_linear(dtype, n, k, cfg, bias):
    seed = fresh_seed()
    x, w, b = _inputs(n, k, dtype, bias)
    y = row_gemv(x, w, b, config=cfg)
    assert y.shape == (1, n) and y.dtype == dtype
    _close(y, F.linear(x, w, b), dtype, seed, "vs F.linear")
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    _close(y, ref, dtype, seed, "vs fp64")
    assert torch.equal(row_gemv(x, w, b, config=cfg), y), "one sum order on every launch"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_norm_fused_equals_norm_then_linear(dtype, n, k, cfg, with_residual, bias):
    seed = fresh_seed()
    x, w, b = _inputs(n, k, dtype, bias)
    residual = torch.randn(1, k).to(dtype) if with_residual else None
    norm = _norm(k, dtype)
    x_in = x.clone()
    y, stream = row_gemv(x, w, b, norm_weight=norm.weight, eps=norm.variance_epsilon,
                         residual=residual, config=cfg)
    normed, ref_stream = (norm.forward_native(x), x) if residual is None else \
        norm.forward_native(x, residual)
    assert torch.equal(x, x_in), "the input is not written"
    assert torch.equal(stream, ref_stream), f"the stream is the exact (rounded) sum (seed {seed})"
    assert (stream is x) == (residual is None)
    _close(y, F.linear(normed, w, b), dtype, seed, "vs norm then linear")


def test_bad_inputs_are_named():
    x, w = torch.randn(1, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match=r"one contiguous row \[1, K\], got \(3, 32\)"):
        row_gemv(torch.randn(3, 32), w)
    with pytest.raises(ValueError, match=r"weight \(8, 30\) .* for the input \(1, 32\)"):
        row_gemv(x, torch.randn(8, 30))
    with pytest.raises(ValueError, match="torch.float32 and torch.float16"):
        row_gemv(x, w.half())
    with pytest.raises(ValueError, match=r"bias \(7,\) does not match the weight's 8 rows"):
        row_gemv(x, w, torch.randn(7))
    with pytest.raises(ValueError, match=r"residual \(2, 32\) needs a norm"):
        row_gemv(x, w, norm_weight=torch.ones(32), residual=torch.randn(2, 32))
    with pytest.raises(ValueError, match=r"norm weight \(16,\) does not match K = 32"):
        row_gemv(x, w, norm_weight=torch.ones(16))


def test_bench_runs_on_the_cpu(tmp_path):
    """bench_gemv.py's smoke mode: interpreter, shrunk shapes, checked outputs, JSON."""
    out = tmp_path / "gemv.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--iters", "1",
                           "--shapes", "qkv", "down", "--row-configs", "4:16:4:1",
                           "--out", str(out)],
                          cwd=BENCH.parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [r["shape"] for r in result["rows"]] == ["qkv", "down"]
    for r in result["rows"]:
        errs = {k: v for k, v in r.items() if k.startswith("max_err")}
        assert errs and max(errs.values()) < 1e-4, r
        assert r["ours"]["us"] > 0 and r["cublas"]["tb_s"] > 0 and "row4:16:4:1" in r
    assert "ours_fused" in result["rows"][0] and "ours_fused" not in result["rows"][1]
    assert "row_fused4:16:4:1" in result["rows"][0] and "row_fused4:16:4:1" not in result["rows"][1]
    qkv = result["rows"][0]
    assert qkv["max_err_paired"] == 0.0, "the paired candidate agrees exactly with the default"
    assert qkv["rope_paired"]["us"] > 0 and qkv["rope_default"]["us"] > 0
    assert "rope_paired" not in result["rows"][1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

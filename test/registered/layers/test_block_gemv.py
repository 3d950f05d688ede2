"""The block GEMV candidate (`triton_ops/block_gemv.py`) == the unfused torch math, via Triton's
CPU interpreter (fp32 and fp16; bf16 is broken there, the `_cuda` twin checks it): 2, 7, 16 and
32 rows, K not a multiple of the tile, split K, with and without the prefetch, bias, the fused
RMSNorm (with and without the residual add), `out=`; the table; errors; the bench's smoke run.
Each run draws new inputs under a logged seed; with weights of scale 1/sqrt(K) every output is
O(1), so one tolerance serves as absolute and relative.
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

from sglang_aux.srt.layers.layernorm import add_norm  # noqa: E402
from sglang_aux.srt.layers.triton_ops.block_gemv import (  # noqa: E402
    LONG_K,
    WIDE_N,
    BlockGemvConfig,
    block_gemv,
    block_gemv_config,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.kernel_checks import (  # noqa: E402
    assert_close_seeded,
    fresh_seed,
    random_rms_norm,
)

ROWS = [2, 7, 16, 32]
# (N, K, tiles): None takes the table's; small tiles make several programs, K steps and slices;
# K = 300 and 257 are no multiple of any tile.
SHAPES = [(40, 300, None), (64, 257, BlockGemvConfig(16, 64)),
          (48, 300, BlockGemvConfig(32, 32, split_k=3)),
          (33, 130, BlockGemvConfig(16, 32, prefetch=False, num_stages=3)),
          (20, 1000, BlockGemvConfig(16, 128, split_k=4, prefetch=False))]
# fp32: summation order only. fp16: one rounding of the output (2^-11 relative of O(1) values)
# plus the input's one rounding, taken at x * w here and at x * rstd * w in the twin (up to a
# few fp16 ulps apart).
TOL = {torch.float32: {"atol": 2e-5, "rtol": 2e-5}, torch.float16: {"atol": 4e-3, "rtol": 4e-3}}
DTYPES = list(TOL)

register_cpu_ci(est_time=60, suite="default")


def _operands(m, n, k, dtype, bias):
    """x `[m, k]`, W `[n, k]` scaled by 1/sqrt(k), and the bias `[n]` or None."""
    w = torch.randn(n, k).mul_(k**-0.5).to(dtype)
    return torch.randn(m, k).to(dtype), w, torch.randn(n).to(dtype) if bias else None


def test_table_by_n_and_k():
    wide, long_k, small = (block_gemv_config(151936, 1536), block_gemv_config(1536, 8960),
                           block_gemv_config(2048, 1536))
    assert wide == block_gemv_config(WIDE_N, 1536) and wide.split_k == 1
    assert long_k == block_gemv_config(1536, LONG_K) and long_k.split_k > 1
    assert small == block_gemv_config(WIDE_N - 1, LONG_K - 1) and small.split_k == 1
    assert len({wide, long_k, small}) == 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_block_gemv_equals_linear(dtype, m, n, k, cfg, bias):
    seed = fresh_seed()
    x, w, b = _operands(m, n, k, dtype, bias)
    y = block_gemv(x, w, b, config=cfg)
    assert y.shape == (m, n) and y.dtype == dtype
    assert_close_seeded(y, F.linear(x, w, b), seed, "vs F.linear", **TOL[dtype])
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    assert_close_seeded(y, ref, seed, "vs fp64", **TOL[dtype])
    assert torch.equal(block_gemv(x, w, b, config=cfg), y), "one sum order on every launch"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [2, 7, 16])
@pytest.mark.parametrize("n,k,cfg", SHAPES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_fused_equals_norm_then_linear(dtype, m, n, k, cfg, with_residual):
    seed = fresh_seed()
    x, w, b = _operands(m, n, k, dtype, bias=True)
    residual = torch.randn(m, k).to(dtype) if with_residual else None
    norm = random_rms_norm(k, dtype, eps=1e-5)
    x0 = x.clone()
    y, stream = block_gemv(x, w, b, norm_weight=norm.weight, eps=norm.variance_epsilon,
                           residual=residual, config=cfg)
    normed, ref_stream = add_norm(norm, x0, residual)  # the unfused (norm(stream), stream)
    checks = {"the input is not written": torch.equal(x, x0),
              "the stream is the rounded sum": torch.equal(stream, ref_stream),
              "the stream is the input itself without a residual":
                  (stream is x) == (residual is None)}
    assert all(checks.values()), (seed, [what for what, ok in checks.items() if not ok])
    assert_close_seeded(y, F.linear(normed, w, b), seed, "vs norm then linear", **TOL[dtype])
    s = ref_stream.double()
    normed64 = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    ref = F.linear(normed64 * norm.weight.double(), w.double(), b.double())
    assert_close_seeded(y, ref, seed, "vs fp64", **TOL[dtype])


def test_out_is_written_in_place():
    x, w, b = _operands(16, 40, 96, torch.float32, bias=True)
    out = torch.full((16, 40), float("nan"))
    assert block_gemv(x, w, b, out=out, config=BlockGemvConfig(16, 32, split_k=2)) is out
    torch.testing.assert_close(out, F.linear(x, w, b), atol=2e-5, rtol=2e-5)


def test_bad_inputs_are_named():
    x, w = torch.randn(16, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match=r"rows \[1..32, K\], got \(33, 32\)"):
        block_gemv(torch.randn(33, 32), w)
    with pytest.raises(ValueError, match=r"got \(16, 32\) \(contiguous: False\)"):
        block_gemv(torch.randn(32, 16).t(), w)
    with pytest.raises(ValueError, match=r"weight \(8, 30\) .* for the input \(16, 32\)"):
        block_gemv(x, torch.randn(8, 30))
    with pytest.raises(ValueError, match=r"x \(16, 32\) and weight \(8, 32\) .* "
                                         r"torch.float32 and torch.float16"):
        block_gemv(x, w.half())
    with pytest.raises(ValueError, match=r"x \(16, 32\) and weight \(8, 32\) .* torch.int32"):
        block_gemv(x.int(), w.int())
    with pytest.raises(ValueError, match=r"bias \(7,\) torch.float32 does not match the weight "
                                         r"\(8, 32\)"):
        block_gemv(x, w, torch.randn(7))
    with pytest.raises(ValueError, match=r"residual \(2, 32\) torch.float32 needs a norm and "
                                         r"the input's shape \(16, 32\)"):
        block_gemv(x, w, norm_weight=torch.ones(32), residual=torch.randn(2, 32))
    with pytest.raises(ValueError, match=r"residual \(16, 32\) .* needs a norm"):
        block_gemv(x, w, residual=torch.randn(16, 32))
    with pytest.raises(ValueError, match=r"norm weight \(16,\) does not match the input "
                                         r"\(16, 32\)"):
        block_gemv(x, w, norm_weight=torch.ones(16))
    with pytest.raises(ValueError, match=r"out \(16, 7\) torch.float32 is not a contiguous "
                                         r"\[16, 8\] .* weight \(8, 32\)"):
        block_gemv(x, w, out=torch.empty(16, 7))
    with pytest.raises(ValueError, match="block_n 24 is not a power of two >= 16"):
        BlockGemvConfig(24, 64)
    with pytest.raises(ValueError, match="split_k 0 < 1"):
        BlockGemvConfig(16, 64, split_k=0)


BENCH_DIR = Path(__file__).resolve().parents[3] / "benchmark/spec_decode"


def _bench(tmp_path, *args):
    out = tmp_path / "block_gemv.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, str(BENCH_DIR / "bench_block_gemv.py"), "--smoke",
                           *args, "--out", str(out)],
                          cwd=BENCH_DIR, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


def test_bench_smoke_runs_on_the_cpu(tmp_path):
    """bench_block_gemv.py --smoke: interpreter, shrunk shapes, checked outputs, JSON."""
    result = _bench(tmp_path, "--shapes", "qkv", "down", "--configs", "16:32:2:4:1:0")
    rows = result["rows"]
    assert [(r["shape"], r["m"]) for r in rows] == [("qkv", 2), ("qkv", 16), ("down", 2),
                                                    ("down", 16)]
    for r in rows:
        errs = {k: v for k, v in r.items() if k.startswith("max_err")}
        assert errs and max(errs.values()) < 1e-4, r
        assert r["block"]["us"] > 0 and r["cublas"]["tb_s"] > 0 and r["ceiling_us"] > 0
        assert "block16:32:2:4:1:0" in r
    assert "block_fused" in rows[0] and "block_fused" not in rows[2]
    assert "block_fused16:32:2:4:1:0" in rows[0]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

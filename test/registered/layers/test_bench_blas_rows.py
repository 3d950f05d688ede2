"""The verify-row GEMM benchmark (benchmark/spec_decode/bench_blas_rows.py): on the CPU its
smoke rows (one `default` variant, shrunk shapes); on CUDA cuBLAS and cuBLASLt at every shape
and row count, each checked against the other inside the run, and the process's library
preference left as it was."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci, register_cuda_ci

register_cpu_ci(est_time=20, suite="default")
register_cuda_ci(est_time=60, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_blas_rows.py"


def test_smoke_run_reports_every_shape_and_row_count(tmp_path, capsys):
    bench = load_bench(SCRIPT)
    out = tmp_path / "rows.json"
    report = bench.main(["--device", "cpu", "--iters", "1", "--rows", "1", "3",
                         "--shapes", "qkv", "down", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["variants"] == ["default"]
    assert [(r["shape"], r["rows"]) for r in report["rows"]] == [
        ("qkv", 1), ("qkv", 3), ("down", 1), ("down", 3)]
    for r in report["rows"]:
        n, k, bias, _ = bench.SHAPES[r["shape"]]
        assert (r["n"], r["k"]) == (n // 32, k // 32)
        assert r["bytes"] == 4 * (r["n"] * r["k"] + r["rows"] * (r["k"] + r["n"])
                                  + (r["n"] if bias else 0))
        assert r["default"]["us"] > 0
    assert "us (TB/s) per call" in capsys.readouterr().out


def test_bad_rows_are_refused_naming_them():
    bench = load_bench(SCRIPT)
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--rows", "0"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_both_libraries_time_every_row_and_the_preference_is_restored(tmp_path):
    bench = load_bench(SCRIPT)
    before = torch.backends.cuda.preferred_blas_library()
    report = bench.main(["--rows", "1", "16", "--iters", "3", "--out", str(tmp_path / "r.json")])
    assert torch.backends.cuda.preferred_blas_library() == before
    assert report["variants"] == ["cublas", "cublaslt"]
    assert len(report["rows"]) == 2 * len(bench.SHAPES)
    for r in report["rows"]:
        assert r["cublas"]["us"] > 0 and r["cublaslt"]["us"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

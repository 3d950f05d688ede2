"""FlashInfer's norm, activation and RoPE kernels beside ours
(benchmark/spec_decode/bench_flashinfer_elementwise.py): on the CPU its smoke run gives our
rows, each checked inside the run against its fp32 torch reference (the model's RoPE for the
rotation), and says in one line why FlashInfer is not run (its CUDA twin:
test_bench_flashinfer_elementwise_cuda.py)."""

import os

import torch

if not torch.cuda.is_available():
    # NOTE: must precede any @triton.jit definition, i.e. any import of the kernels.
    os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sglang_aux.test.bench_script import load_bench  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="default")

SCRIPT = (Path(__file__).resolve().parents[3]
          / "benchmark/spec_decode/bench_flashinfer_elementwise.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run")
def test_smoke_run_reports_our_rows_and_why_not_flashinfer(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench = load_bench(SCRIPT)
    report = bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flashinfer: needs CUDA (this machine has none)"]
    assert report["flashinfer"] is None and report["flashinfer_absent"] == err[0]
    seen = {(r["op"], r["rows"], r["path"]) for r in report["rows"]}
    assert seen == {(op, m, "ours") for op in bench.OPS for m in bench.SMOKE["rows"]}
    assert all(r["us_per_call"] > 0 and r["rel_err"] < 1e-5 for r in report["rows"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

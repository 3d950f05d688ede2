"""The FlashInfer side-by-side benchmark (benchmark/spec_decode/bench_flashinfer_attention.py):
on the CPU its smoke run gives our path's rows (checked against torch_native inside the run)
and says in one line why FlashInfer is not run; the page-size-1 layout it hands FlashInfer
names each request's slots in order (its CUDA twin:
test_bench_flashinfer_attention_cuda.py)."""

import os

import torch

if not torch.cuda.is_available():
    # NOTE: must precede any @triton.jit definition, i.e. any import of the backend.
    os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sglang_aux.test.bench_script import load_bench  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=20, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_flashinfer_attention.py"


def _bench():
    return load_bench(SCRIPT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run")
def test_smoke_run_reports_our_rows_and_why_not_flashinfer(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench = _bench()
    report = bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["flashinfer: needs CUDA (this machine has none)"]
    assert report["flashinfer_absent"] == err[0] and report["flashinfer"] is None
    smoke = bench.SMOKE
    seen = {(r["q_len"], r["bs"], r["context"], r["path"]) for r in report["rows"]}
    assert seen == {(q, b, c, "triton") for q in smoke["q_lens"] for b in smoke["bs"]
                    for c in smoke["contexts"]}
    assert all(r["us_per_call"] > 0 and 0 <= r["rel_err"] < 1e-4 for r in report["rows"])


def test_page_size_one_layout_lists_each_requests_slots():
    bench = _bench()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fb = bench._batch(3, 5, 1, 8, 1, device, torch.float32)
    indptr, indices, last = bench._kv_layout(fb)
    assert indptr.tolist() == [0, 5, 10, 15] and last.tolist() == [1, 1, 1]
    table = fb.req_to_token_pool.req_to_token
    for i, row in enumerate(fb.req_pool_indices.tolist()):
        assert indices[5 * i : 5 * i + 5].tolist() == table[row, :5].tolist()
    assert len(set(indices.tolist())) == 15  # scattered, never shared


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

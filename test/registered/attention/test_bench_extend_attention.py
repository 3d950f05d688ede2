"""The extend attention benchmark (benchmark/spec_decode/bench_extend_attention.py) in its CPU
smoke mode: every case has the per-head and the GQA-packed paths, at the device's split and a
fixed one, each checked inside the run against a float32 reference (a case whose queries
overflow the graph's bucket is refused before anything runs)."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of triton or the backend.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sglang_aux.test.bench_script import load_bench  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=15, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_extend_attention.py"


def test_smoke_reports_every_path_of_every_case(tmp_path):
    out = tmp_path / "extend.json"
    report = load_bench(SCRIPT).main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    paths = {"per_head", "per_head@2", "packed", "packed@2"}
    cases = report["args"]["cases"]
    assert {(r["case"], r["path"]) for r in report["rows"]} == {
        (c, p) for c in cases for p in paths}
    for r in report["rows"]:
        assert r["rel_err"] < 1e-4 and r["us_per_call"] > 0, r


def test_a_case_past_its_bucket_is_refused(tmp_path):
    with pytest.raises(ValueError, match="2 requests of 9 tokens do not fit"):
        load_bench(SCRIPT).main(["--cases", "2:9:0:16", "--heads", "6", "2", "16",
                                 "--calls", "1", "--out", str(tmp_path / "x.json")])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

"""The training batch benchmark (benchmark/training/bench_batch_gather.py) in its CPU smoke
mode: `SequenceSet.batch` and the pad_sequence assembly it replaced build the same batches bit
for bit (sequences after a shared prefix and without one, rows on the "host", a bucket), and
the report times both; a batch that differs from the reference stops the run."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/training/bench_batch_gather.py"


def test_smoke_run_checks_and_times_both(tmp_path):
    bench = load_bench(SCRIPT)
    out = tmp_path / "bench.json"
    report = bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["device"] == "cpu" and report["config"]["batch"] == 4
    assert report["one_cat_ms"] > 0 and report["reference_ms"] > 0
    assert report["speedup"] == round(report["reference_ms"] / report["one_cat_ms"], 3)


def test_a_batch_unlike_the_reference_stops_the_run(monkeypatch):
    bench = load_bench(SCRIPT)
    real = bench.reference_batch

    def off_by_one(data, index, bucket):
        batch = real(data, index, bucket)
        batch.ids = batch.ids + 1
        return batch

    monkeypatch.setattr(bench, "reference_batch", off_by_one)
    with pytest.raises(SystemExit, match="ids differs from the reference"):
        bench.main(["--smoke"])


def test_the_smoke_set_has_both_sources():
    bench = load_bench(SCRIPT)
    args = bench.parse_args(["--smoke"])
    data = bench.sequences(args, torch.device("cpu"))
    assert [len(p) for p in data.prefixes] == [args.prefix, 0]
    assert data.prefix_of[:4] == [0, 1, 0, 1]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

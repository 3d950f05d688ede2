"""The hot-vocabulary coverage script (benchmark/spec_decode/hot_vocab_coverage.py): the hot set
is the most written ids of the training share, ties to the smaller id; per held-out prompt
kind it counts the tokens in the set, the windows wholly in it and the in-set run each window
starts with, exactly on hand-made samples; bad flags stop it naming them."""

import json
import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.tools.dflash_training.data import Sample, save_samples

register_cpu_ci(est_time=10, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/hot_vocab_coverage.py"


def test_the_hot_set_is_the_most_written_ids():
    bench = load_bench(SCRIPT)
    train = [Sample([0], [5, 5, 5, 7, 7, 9], source="code"), Sample([0], [7, 3, 9], source="chat")]
    assert bench.hot_ids(train, 3) == [5, 7, 9]  # 5 and 7 written 3 times (the smaller first)
    assert bench.hot_ids(train, 9) == [5, 7, 9, 3]  # fewer distinct ids than asked: all


def test_coverage_counts_tokens_windows_and_runs():
    bench = load_bench(SCRIPT)
    held = [Sample([0], [1, 2, 3, 4, 1, 9]), Sample([0], [9, 1, 2])]
    got = bench.coverage(held, {1, 2, 3, 4}, window=3)
    # windows [1 2 3] (run 3, whole), [4 1 9] (run 2), [9 1 2] (run 0)
    assert got == {"tokens": 9, "token_coverage": 7 / 9, "windows": 3, "whole_windows": 1 / 3,
                   "mean_run": 5 / 3}


def test_a_run_over_files_reports_every_size_and_kind(tmp_path, capsys):
    bench = load_bench(SCRIPT)
    samples = [Sample([0], [1, 2, 1, 2, 3, 4] * (i % 3 + 1), source=("code", "chat")[i % 2])
               for i in range(40)]
    path = tmp_path / "s.jsonl.xz"
    save_samples(samples, path)
    out = tmp_path / "cov.json"
    report = bench.main(["--samples", str(path), "--sizes", "2", "4", "--holdout", "0.25",
                         "--window", "4", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert (report["train"], report["held_out"]) == (30, 10)
    assert [(r["size"], r["source"]) for r in report["rows"]] == \
        [(2, "chat"), (2, "code"), (4, "chat"), (4, "code")]
    assert all(r["token_coverage"] == 1.0 for r in report["rows"] if r["size"] == 4)
    assert all(r["token_coverage"] < 1.0 for r in report["rows"] if r["size"] == 2)
    assert "whole windows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench.main(["--samples", str(path), "--holdout", "1.5", "--out", str(out)])
    assert "--holdout in (0, 1)" in capsys.readouterr().err


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

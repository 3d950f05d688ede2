"""The decode attention benchmark (benchmark/spec_decode/bench_decode_attention.py) in its CPU
smoke mode: every (tokens per request, bs, context) row has every path (today's launch, the
in-kernel merge, single pass, a fixed split, another merge width, the last two together), each
checked against torch_native inside the run; the merge-kernel paths launch twice, the
in-kernel one once; `--ragged` reports the static, per-token, ragged and bounded ragged
verify paths of every row."""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of triton or the backend.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sglang_aux.test.bench_script import load_bench  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402

register_cpu_ci(est_time=30, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_decode_attention.py"


def _bench():
    return load_bench(SCRIPT)


def test_smoke_run_reports_every_row(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench = _bench()
    report = bench.main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert "vs launch" in capsys.readouterr().out
    smoke = bench.SMOKE
    paths = {"launch", *(f"in_kernel@{n}" for n in smoke["min_split_keys"]),
             *(f"single@{t}" for t in smoke["single_pass"]),
             *(f"splits@{n}" for n in smoke["splits"]),
             *(f"merge_heads@{n}" for n in smoke["merge_heads"]),
             *(f"splits@{n}+merge_heads@{h}" for n in smoke["splits"]
               for h in smoke["merge_heads"])}
    seen = {(r["q_len"], r["bs"], r["context"], r["path"]) for r in report["rows"]}
    assert seen == {(q, b, c, p) for q in smoke["q_lens"] for b in smoke["bs"]
                    for c in smoke["contexts"] for p in paths}
    heads, kv_heads, head_dim = bench.QWEN_HEADS
    for r in report["rows"]:
        path = r["path"]
        splits = (1 if path.startswith("single@") else int(path[7:].split("+")[0])
                  if path.startswith("splits@") else smoke["num_kv_splits"])
        assert r["grid_splits"] == splits
        one_launch = path.startswith(("single@", "in_kernel@")) or splits == 1
        assert r["launches"] == (1 if one_launch else 2)
        assert r["kv_bytes"] == 2 * r["bs"] * r["context"] * kv_heads * head_dim * 4
        assert r["us_per_call"] > 0 and 0 <= r["rel_err"] < 1e-4


def test_ragged_smoke_run_reports_every_path(tmp_path, capsys):
    bench = _bench()
    report = bench.main(["--smoke", "--ragged", "--out", str(tmp_path / "bench.json")])
    assert "vs static" in capsys.readouterr().out
    smoke = bench.SMOKE
    seen = {(r["q_len"], r["bs"], r["context"], r["path"]) for r in report["rows"]}
    assert seen == {(q, b, c, p) for q in smoke["q_lens"] for b in smoke["bs"]
                    for c in smoke["contexts"]
                    for p in ("static", "per_token", "ragged", "ragged_bounded")}
    for r in report["rows"]:
        if r["path"] == "static":
            assert r["tokens"] == r["verified"] == r["bs"] * r["q_len"]
        else:  # a token bucket holding every verified token, at least one per request
            assert r["bs"] <= r["verified"] <= min(r["tokens"], r["bs"] * r["q_len"])
        assert r["us_per_call"] > 0 and 0 <= r["rel_err"] < 1e-4


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

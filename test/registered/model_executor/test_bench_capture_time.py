"""The start-up capture benchmark (benchmark/spec_decode/bench_capture_time.py) on the CPU: both
ways run in fresh processes over a tiny DFlash pair and report every capture run."""

import json
import os
import subprocess
import sys
from pathlib import Path

from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="default")

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmark/spec_decode/bench_capture_time.py"


def test_both_ways_report_their_captures(tmp_path):
    out = tmp_path / "capture.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    run = subprocess.run([sys.executable, str(SCRIPT), "--preset", "tiny-llama", "--profile",
                          "none", "--max-running-requests", "4", "--order", "new", "old",
                          "--out", str(out)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["variant"] for r in runs] == ["new", "old"]
    for r in runs:
        modes = {c["mode"] for c in r["captures"] if c["what"] == "graphs"}
        assert {"TARGET_VERIFY", "DRAFT_BLOCK"} <= modes, r["captures"]
        assert all(c["graphs"] > 0 for c in r["captures"] if c["what"] == "graphs")
        assert r["engine_start_s"] >= r["capture_s"] > 0 and r["heap_objects"] > 10_000
    assert "new: engine start" in run.stdout and "old: engine start" in run.stdout


def test_a_failed_run_names_its_way():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    run = subprocess.run([sys.executable, str(SCRIPT), "--preset", "no-such-preset",
                          "--profile", "none", "--order", "old"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode != 0 and "old run failed" in run.stderr


if __name__ == "__main__":
    import pytest

    sys.exit(pytest.main([__file__, "-q"]))

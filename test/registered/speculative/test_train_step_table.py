"""The training-step table (benchmark/training/train_step_table.py) over the logs an H100 wrote
(docs/data/session_h100_1207/train_step/, the eighteenth session): each variant's profiled
step and the pace of its logged steps from step 40 on, as docs/benchmarks.md section 9p
reports them, and the ratio to a base variant; bad input is one line."""

import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

REPO = Path(__file__).resolve().parents[3]
LOGS = REPO / "docs/data/session_h100_1207/train_step"
table_tool = load_bench(REPO / "benchmark/training/train_step_table.py")


def test_the_h100_logs_give_section_9p_figures(capsys):
    text = table_tool.main([str(LOGS), "--base", "hostrows"])
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in
            text.splitlines()[2:]}
    assert list(rows) == ["efficient", "hostrows", "hoststream"]
    # (logs from before the steps' peak and the features' seconds were logged: "-")
    assert rows["hostrows"][1:] == ["70.4 / 62.3", "63.2 63.7 63.5", "63.4", "-", "-",
                                    "1.000x |"]
    assert rows["hoststream"][1:] == ["66.1 / 63.8", "60.5 60.5 60.4", "60.5", "-", "-",
                                      "1.050x |"]
    assert rows["efficient"][3] == "64.7"
    assert capsys.readouterr().out == text


def test_a_log_with_few_steps_and_bad_input(tmp_path):
    (tmp_path / "short.log").write_text(
        "2026-12-07 00:39:22,159 x: step 20/100 loss 1.0 accept 1.0 lr 0 acc/offset 0 (4 s)\n")
    (tmp_path / "status.log").write_text("no steps here\n")  # not a training log: left out
    text = table_tool.table(tmp_path, 40, None)
    assert text.splitlines()[2] == "| short | - | - | - | - | - |"
    (tmp_path / "peak.log").write_text(  # a CUDA step profile's line, with the steps' peak
        "x: 3979 sequences, 1184221 tokens; features 41.3 s\n"
        "x: profile of 20 steps: 16.0 ms a step, the device busy 14.1 ms of it, 7.25 GiB at "
        "most above the steps' start\n"
        "2026-12-07 00:39:22,159 x: step 20/100 loss 1.0 accept 1.0 lr 0 acc/offset 0 (4 s)\n")
    assert "| peak | 16.0 / 14.1 | - | - | 7.25 | 41.3 |" in table_tool.table(tmp_path, 40, None)
    (tmp_path / "peak.log").write_text(  # today's line: MiB, shown in the table's GiB
        "x: profile of 20 steps: 16.0 ms a step, the device busy 14.1 ms of it, 2119.68 MiB at "
        "most above the steps' start\n"
        "2026-12-07 00:39:22,159 x: step 20/100 loss 1.0 accept 1.0 lr 0 acc/offset 0 (4 s)\n")
    assert "| peak | 16.0 / 14.1 | - | - | 2.07 | - |" in table_tool.table(tmp_path, 40, None)
    with pytest.raises(SystemExit, match="--base base: no paced log of that name"):
        table_tool.table(tmp_path, 0, "base")
    with pytest.raises(SystemExit, match="no training log with step lines"):
        table_tool.table(tmp_path / "status.log", 40, None)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The evaluation a user reads (`test/user_eval.py`) against real servers: a tiny target alone
and with a tiny DFlash draft, each its own server, on HumanEval-format problems, GSM8K-format
questions and the shipped chat prompts; every run reports accept length and tokens/s, greedy
DFlash gives target-only's outputs, and pass@1 runs each completion sandboxed."""

import gzip
import json
import sys

import pytest

from sglang_aux.test import user_eval
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.humaneval import read_problems
from sglang_aux.test.runtime_utils import pair_checkpoints

register_cpu_ci(est_time=60, suite="default")

PROBLEMS = [
    {"task_id": "T/0", "entry_point": "add",
     "prompt": 'def add(a, b):\n    """Return a + b."""\n',
     "canonical_solution": "    return a + b\n",
     "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n"},
    {"task_id": "T/1", "entry_point": "spin",
     "prompt": 'def spin(n):\n    """Return n."""\n',
     "canonical_solution": "    return n\n",
     "test": "def check(candidate):\n    assert candidate(4) == 4\n"},
]
GSM8K = [{"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "#### 7"},
         {"question": "A box holds 12 eggs. How many in 5 boxes?", "answer": "#### 60"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    with gzip.open(root / "HumanEval.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(p) + "\n" for p in PROBLEMS)
    for name in ("test.jsonl", "train.jsonl"):
        (root / name).write_text("".join(json.dumps(q) + "\n" for q in GSM8K))
    return root


def test_pass_at_1_runs_each_completion_sandboxed(files):
    problems = read_problems(files / "HumanEval.jsonl.gz")
    ids = [p.task_id for p in problems]
    canonical = [p["canonical_solution"] for p in PROBLEMS]
    verdicts = user_eval.sandbox_verdicts(problems, canonical, 5.0, 2)
    assert verdicts == dict.fromkeys(ids, "passed") and user_eval.pass_at_1(verdicts) == 1.0
    # a wrong answer and a hang fail their own problem only, each with its verdict
    wrong = user_eval.sandbox_verdicts(problems, ["    return a - b\n", canonical[1]], 5.0, 2)
    assert wrong == {ids[0]: "failed", ids[1]: "passed"} and user_eval.pass_at_1(wrong) == 0.5
    hang = user_eval.sandbox_verdicts(
        problems, [canonical[0], "    while True:\n        pass\n"], 1.0, 2)
    assert hang == {ids[0]: "passed", ids[1]: "timeout"} and user_eval.pass_at_1(hang) == 0.5


def test_target_and_dflash_servers_report_every_task(files, tmp_path):
    ckpt = pair_checkpoints(tmp_path / "ckpt", {"tiny-llama": "tiny-llama-dflash"})
    out = tmp_path / "out"
    result = user_eval.main([
        "--model-path", ckpt["tiny-llama"], "--draft", ckpt["tiny-llama-dflash"],
        "--parallel", "1", "2", "--num-sequential", "1", "--max-new-tokens", "8",
        "--num-chat", "2", "--num-shots", "1", "--humaneval-path",
        str(files / "HumanEval.jsonl.gz"), "--gsm8k-data-path", str(files / "test.jsonl"),
        "--server-flags", "--device cpu --context-length 1024 --max-running-requests 4",
        "--sandbox-timeout", "2", "--out", str(out)])
    runs = result["runs"]
    assert {(r["config"], r["task"], r["parallel"]) for r in runs} == {
        (c, t, p) for c in ("target", "dflash") for t in ("humaneval", "gsm8k", "chat")
        for p in (1, 2)}
    for r in runs:
        assert r["num_prompts"] == (1 if r["parallel"] == 1 else 2)
        assert r["completion_tokens"] > 0 and r["output_throughput"] > 0
        assert (r["score"] is not None) == (r["parallel"] == 2 and r["task"] != "chat")
        if r["config"] == "target":
            assert r["accept_length"] == 1.0 and r["verify_tokens_per_accepted"] is None
        else:
            assert 1.0 <= r["accept_length"] <= 4.0  # the draft's block holds 4 tokens
            # a verify step checks the block's tokens and keeps at most all of them
            assert r["verify_tokens_per_accepted"] >= 1.0
        # the server's counters over this run alone: each prompt prefilled once, then decoded
        assert r["step_stats"]["prefill_requests"] == r["num_prompts"]
        assert r["step_stats"]["decode_steps"] >= 1
        assert "max_step_peak_bytes" not in r["step_stats"]
    assert result["same_outputs"] == {"humaneval": True, "gsm8k": True, "chat": True}
    scores = {(r["config"], r["task"]): r["score"] for r in runs if r["score"] is not None}
    assert scores["target", "humaneval"] == scores["dflash", "humaneval"]
    verdicts = {r["config"]: r["verdicts"] for r in runs if r["verdicts"] is not None}
    assert set(verdicts) == {"target", "dflash"}  # the scored HumanEval runs only
    assert len(verdicts["target"]) == 2 and verdicts["target"] == verdicts["dflash"]
    assert result["humaneval_verdicts_differ"] == {}
    assert json.loads((out / "user_eval.json").read_text()) == result
    assert (out / "server_dflash.log").is_file()


def test_a_configuration_that_fails_keeps_the_earlier_ones_runs(files, tmp_path):
    """The table is written after each configuration: a DFlash server that cannot start (its
    draft folder is missing) fails the evaluation, and target-only's runs are on disk."""
    ckpt = pair_checkpoints(tmp_path / "ckpt", {"tiny-llama": "tiny-llama-dflash"})
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="server did not become healthy"):
        user_eval.main([
            "--model-path", ckpt["tiny-llama"], "--draft", str(tmp_path / "no-draft"),
            "--tasks", "gsm8k", "--parallel", "2", "--max-new-tokens", "4", "--num-gsm8k", "2",
            "--num-shots", "1", "--gsm8k-data-path", str(files / "test.jsonl"),
            "--server-flags", "--device cpu --context-length 1024 --max-running-requests 4",
            "--out", str(out)])
    kept = json.loads((out / "user_eval.json").read_text())
    assert [(r["config"], r["task"], r["parallel"]) for r in kept["runs"]] == [
        ("target", "gsm8k", 2)]
    assert kept["same_outputs"] == {}


def test_verdicts_that_differ_between_target_and_dflash_are_named():
    def run(config, task, verdicts):
        return user_eval.Run(config, task, 32, 2, 1.0, 1.0, 1.0, 2, 0.5, verdicts)

    target = {"HumanEval/0": "passed", "HumanEval/1": "failed"}
    dflash = {"HumanEval/0": "timeout", "HumanEval/1": "failed"}
    runs = [run("target", "humaneval", target), run("dflash", "humaneval", dflash),
            run("target", "humaneval", None)]  # an unscored (narrower) run is not compared
    assert user_eval._differing_verdicts(runs) == {"HumanEval/0": ("passed", "timeout")}
    assert user_eval._differing_verdicts(runs[:1]) == {}  # one configuration: nothing to compare


def test_a_runs_step_statistics_are_what_it_added_to_the_counters():
    before = {"decode_steps": 10, "prefill_steps": 2, "max_step_peak_bytes": 5,
              "decode_seconds": 1.5, "note": "x"}
    after = {"decode_steps": 17, "prefill_steps": 2, "max_step_peak_bytes": 9,
             "decode_seconds": 2.0, "mixed_steps": 3, "note": "y"}
    assert user_eval.stats_delta(before, after) == {"decode_steps": 7, "decode_seconds": 0.5,
                                                    "mixed_steps": 3}


def test_dflash_without_a_draft_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="--draft"):
        user_eval.main(["--configs", "dflash", "--out", str(tmp_path)])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

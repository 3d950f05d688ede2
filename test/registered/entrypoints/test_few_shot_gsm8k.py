"""The GSM8K harness against a live server on real GSM8K test questions. The tiny random model
scores about 0, so this checks the harness itself: answer extraction on known strings, data
path resolution, and a run's printed metrics and result-file lines against the same greedy
requests made by hand."""

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=30, suite="default")

REPO = Path(__file__).resolve().parents[3]
NUM_QUESTIONS = 4
NUM_SHOTS = 2  # the tiny model's context (1024 byte tokens) holds two shots
MAX_NEW = 24


@pytest.mark.parametrize("text,value", [
    ("The answer is 72.\n\n", 72),
    ("She pays $1,234 in total", 1234),
    ("5 + 7 = 12 apples, and 3 more", 3),
    ("18 - 6 = 12", 12),
    ("18 - 6", 6),  # a subtraction, not -6
    ("The temperature drops to -7 degrees.", -7),
    ("no number here", gsm8k.INVALID),
])
def test_answer_is_the_last_integer(text, value):
    assert gsm8k.get_answer_value(text) == value


def test_labels_and_prompts():
    assert gsm8k.label_of("48/2 = <<48/2=24>>24 clips.\n#### 1,000") == 1000
    with pytest.raises(ValueError, match="####"):
        gsm8k.label_of("no marker 12")
    shots = [{"question": "Q1?", "answer": "A1\n#### 1"}, {"question": "Q2?", "answer": "#### 2"}]
    prompt = gsm8k.build_prompt(gsm8k.few_shot_prefix(shots), "Q3?")
    assert prompt == "Question: Q1?\nAnswer: A1\n#### 1\n\nQuestion: Q2?\nAnswer: #### 2\n\n" \
                     "Question: Q3?\nAnswer:"


def test_data_path_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv(gsm8k.DATA_DIR_ENV, str(tmp_path))
    assert gsm8k.default_data_path() == tmp_path / "test.jsonl"
    monkeypatch.delenv(gsm8k.DATA_DIR_ENV)
    assert gsm8k.default_data_path() == gsm8k.REPO_DATA_DIR / "test.jsonl"
    assert gsm8k.default_data_path().is_file(), "CI reads GSM8K from ../shared/data/gsm8k"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--max-total-tokens", "8192",
            "--cuda-graph-bs-decode", "1", "2", "4"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


def test_harness_run_accounts_for_every_question(server, tmp_path, capsys):
    port = server.rsplit(":", 1)[1]
    result_file = tmp_path / "results.jsonl"
    flags = ["--port", port, "--num-questions", str(NUM_QUESTIONS), "--num-shots",
             str(NUM_SHOTS), "--max-new-tokens", str(MAX_NEW), "--parallel", "3",
             "--result-file", str(result_file)]
    metrics = gsm8k.main(flags)
    printed = capsys.readouterr().out
    for name in ("Accuracy", "Invalid", "Latency", "Output throughput", "Accept length"):
        assert f"\n{name}: " in f"\n{printed}", name

    # the same greedy requests by hand give the harness's numbers
    data = gsm8k.read_jsonl(gsm8k.default_data_path())[:NUM_QUESTIONS]
    train = gsm8k.read_jsonl(gsm8k.REPO_DATA_DIR / "train.jsonl")[:NUM_SHOTS]
    prefix = gsm8k.few_shot_prefix(train)
    params = {"temperature": 0, "max_new_tokens": MAX_NEW, "stop": gsm8k.STOP}
    outs = [httpx.post(f"{server}/generate", timeout=120, json={
        "text": gsm8k.build_prompt(prefix, q["question"]), "sampling_params": params}).json()
        for q in data]
    preds = [gsm8k.get_answer_value(o["text"]) for o in outs]
    labels = [gsm8k.label_of(q["answer"]) for q in data]
    assert labels == [18, 3, 70000, 540]  # the first GSM8K test answers
    correct = sum(p == y for p, y in zip(preds, labels, strict=True))
    assert metrics["accuracy"] == correct / NUM_QUESTIONS
    assert metrics["invalid"] == sum(p == gsm8k.INVALID for p in preds) / NUM_QUESTIONS
    assert metrics["num_errors"] == 0 and metrics["accept_length"] == 0.0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert metrics["output_throughput"] == pytest.approx(tokens / metrics["latency"])

    # the benchmark wrapper runs the same main and appends a second line
    subprocess.run([sys.executable, str(REPO / "benchmark/gsm8k/bench_sglang.py"),
                    *flags[:2], "--num-questions", "1", *flags[4:]], check=True)
    lines = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert [r["num_questions"] for r in lines] == [NUM_QUESTIONS, 1]
    assert lines[0] == json.loads(json.dumps(metrics))
    assert lines[0]["task"] == "gsm8k" and lines[0]["num_shots"] == NUM_SHOTS


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

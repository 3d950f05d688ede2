"""The GSM8K harness against a live server, on GSM8K-format questions the test writes itself
(the tiny random model scores about 0, so this checks the harness: answer extraction on known
strings, a run's printed metrics and result-file lines against the same greedy requests made
by hand), and where its data comes from: `--data-path`, then `$SGLANG_AUX_GSM8K_DIR`, then the
copy beside the checkout, else the files downloaded on first use from a URL (a local HTTP
server here) into the cache, sha256 checked, with nothing left behind on a mismatch."""

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test import gsm8k_data
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=30, suite="default")

REPO = Path(__file__).resolve().parents[3]
NUM_QUESTIONS = 4
NUM_SHOTS = 2  # the tiny model's context (1024 byte tokens) holds two shots
MAX_NEW = 24
QUESTIONS = {
    "test": [("Tom has 3 apples and buys 4 more. How many does he have?", "3 + 4 = 7\n#### 7"),
             ("A box holds 12 eggs. How many eggs are in 5 boxes?", "12 * 5 = 60\n#### 60"),
             ("Sam reads 10 pages a day. How many pages in a week?", "10 * 7 = 70\n#### 70"),
             ("A shirt costs $1,250 and is cut by $250. What is the price?", "#### 1,000")],
    "train": [("Ann has 2 cats and 3 dogs. How many pets?", "2 + 3 = 5\n#### 5"),
              ("Bob walks 4 km twice. How far?", "4 * 2 = 8\n#### 8")],
}
LABELS = [7, 60, 70, 1000]


def _jsonl(split: str) -> bytes:
    return "".join(json.dumps({"question": q, "answer": a}) + "\n"
                   for q, a in QUESTIONS[split]).encode()


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves `files` (path -> bytes), 404 elsewhere, and counts the requests."""

    files: dict[str, bytes] = {}
    requests: list[str] = []

    def do_GET(self):
        type(self).requests.append(self.path)
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Length", str(len(body or b"")))
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


@pytest.fixture
def files_server():
    """A real HTTP server on loopback serving the written GSM8K files under /data/."""
    handler = type("Handler", (_Files,), {"files": {f"/data/{s}.jsonl": _jsonl(s)
                                                    for s in QUESTIONS}, "requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/data", handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def fresh_machine(tmp_path, monkeypatch, files_server):
    """No GSM8K anywhere but at the download URL (the local server, serving the written files
    under their own sha256) and an empty cache."""
    base, handler = files_server
    monkeypatch.delenv(gsm8k_data.DATA_DIR_ENV, raising=False)
    monkeypatch.setattr(gsm8k_data, "REPO_DATA_DIR", tmp_path / "no-checkout-copy")
    monkeypatch.setattr(gsm8k_data, "SHA256", {s: hashlib.sha256(_jsonl(s)).hexdigest()
                                               for s in QUESTIONS})
    monkeypatch.setenv(gsm8k_data.URL_ENV, base)
    monkeypatch.setenv("SGLANG_AUX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gsm8k", handler


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


def test_the_official_files_are_pinned():
    assert gsm8k_data.OFFICIAL_URL == ("https://raw.githubusercontent.com/openai/"
                                       "grade-school-math/master/grade_school_math/data")
    for split, lines in (("test", 1319), ("train", 7473)):
        path = gsm8k_data.local_path_or_skip(split)
        data = path.read_bytes()
        assert hashlib.sha256(data).hexdigest() == gsm8k_data.SHA256[split]
        assert data.count(b"\n") == lines


def test_first_use_downloads_into_the_cache_once(fresh_machine):
    cache, handler = fresh_machine
    for split in QUESTIONS:
        assert gsm8k_data.gsm8k_path(split) == cache / f"{split}.jsonl"
        assert (cache / f"{split}.jsonl").read_bytes() == _jsonl(split)
    assert gsm8k_data.data_paths(None) == (cache / "test.jsonl", cache / "train.jsonl")
    assert handler.requests == ["/data/test.jsonl", "/data/train.jsonl"]
    assert sorted(p.name for p in cache.iterdir()) == ["test.jsonl", "train.jsonl"]


def test_a_sha256_mismatch_leaves_no_file(fresh_machine, monkeypatch):
    cache, _ = fresh_machine
    monkeypatch.setitem(gsm8k_data.SHA256, "test", "0" * 64)
    with pytest.raises(ValueError, match="sha256 [0-9a-f]{64} is not the expected 0000"):
        gsm8k_data.gsm8k_path("test")
    assert list(cache.iterdir()) == []


def test_a_failed_download_names_the_way_around_it(fresh_machine, monkeypatch):
    cache, _ = fresh_machine
    monkeypatch.setenv(gsm8k_data.URL_ENV, os.environ[gsm8k_data.URL_ENV] + "/nope")
    with pytest.raises(ConnectionError, match="nope/test.jsonl .*pass --data-path or set "
                                              "SGLANG_AUX_GSM8K_DIR"):
        gsm8k_data.gsm8k_path("test")
    assert list(cache.iterdir()) == []


def test_the_environment_and_the_flag_win_over_the_download(fresh_machine, tmp_path,
                                                             monkeypatch):
    _, handler = fresh_machine
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.setenv(gsm8k_data.DATA_DIR_ENV, str(mine))
    assert gsm8k_data.gsm8k_path("test") == mine / "test.jsonl"
    assert gsm8k_data.data_paths(tmp_path / "x" / "q.jsonl") == (tmp_path / "x" / "q.jsonl",
                                                                 tmp_path / "x" / "train.jsonl")
    assert handler.requests == []


def test_the_copy_beside_the_checkout_is_used_when_present(monkeypatch):
    monkeypatch.delenv(gsm8k_data.DATA_DIR_ENV, raising=False)
    path = gsm8k_data.local_path_or_skip("test")
    assert path == gsm8k_data.REPO_DATA_DIR / "test.jsonl"
    assert gsm8k_data.gsm8k_path("test") == path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--max-total-tokens", "8192",
            "--cuda-graph-bs-decode", "1", "2", "4"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


def test_harness_run_accounts_for_every_question(server, fresh_machine, tmp_path, capsys):
    """As the README runs it: no --data-path, the questions downloaded on first use."""
    cache, _ = fresh_machine
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
    data = gsm8k.read_jsonl(cache / "test.jsonl")[:NUM_QUESTIONS]
    prefix = gsm8k.few_shot_prefix(gsm8k.read_jsonl(cache / "train.jsonl")[:NUM_SHOTS])
    params = {"temperature": 0, "max_new_tokens": MAX_NEW, "stop": gsm8k.STOP}
    outs = [httpx.post(f"{server}/generate", timeout=120, json={
        "text": gsm8k.build_prompt(prefix, q["question"]), "sampling_params": params}).json()
        for q in data]
    preds = [gsm8k.get_answer_value(o["text"]) for o in outs]
    labels = [gsm8k.label_of(q["answer"]) for q in data]
    assert labels == LABELS
    correct = sum(p == y for p, y in zip(preds, labels, strict=True))
    assert metrics["accuracy"] == correct / NUM_QUESTIONS
    assert metrics["invalid"] == sum(p == gsm8k.INVALID for p in preds) / NUM_QUESTIONS
    assert metrics["num_errors"] == 0 and metrics["accept_length"] == 0.0
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    assert metrics["output_throughput"] == pytest.approx(tokens / metrics["latency"])

    # the benchmark wrapper runs the same main with --data-path and appends a second line
    subprocess.run([sys.executable, str(REPO / "benchmark/gsm8k/bench_sglang.py"),
                    "--data-path", str(cache / "test.jsonl"), *flags[:2], "--num-questions",
                    "1", *flags[4:]], check=True)
    lines = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert [r["num_questions"] for r in lines] == [NUM_QUESTIONS, 1]
    assert lines[0] == json.loads(json.dumps(metrics))
    assert lines[0]["task"] == "gsm8k" and lines[0]["num_shots"] == NUM_SHOTS


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

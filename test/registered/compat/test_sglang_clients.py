"""SGLang 0.5.23's own clients, unchanged, against our real server (tiny preset + DFlash, CPU).

Runs `python -m sglang.test.few_shot_gsm8k` (the `sgl` frontend's RuntimeEndpoint, which
sends SGLang's whole sampling parameter set) on real GSM8K questions, and
`python -m sglang.bench_serving` with the backends `sglang` (native /generate, with
SGLang's GenerateReqInput fields at their defaults), `sglang-oai` (/v1/completions, with
`best_of`) and `sglang-oai-chat`. The client packages are installed by pip on first use
(`sglang_aux.test.sglang_client`); without network the test skips, saying so.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_aux.test import few_shot_gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server
from sglang_aux.test.sglang_client import client_env, install_client

register_cpu_ci(est_time=240, suite="default")

BLOCK = 4
CLIENT_TIMEOUT_S = 600
NUM_PROMPTS = 6


@pytest.fixture(scope="module")
def client():
    try:
        return install_client()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"sglang==0.5.23 client modules cannot be installed here: "
                    f"{str(e).splitlines()[0]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    target, draft = tiny_checkpoint("tiny-llama", ckpt), tiny_checkpoint("tiny-llama-dflash", ckpt)
    args = ["--model-path", target, "--device", "cpu", "--max-total-tokens", "32768",
            "--max-running-requests", "16", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", draft,
            "--speculative-num-draft-tokens", str(BLOCK)]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url, target


def _run(client: Path, args: list[str], cwd: Path) -> str:
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=client_env(client),
                          capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    return out


def test_our_harness_builds_sglang_harness_prompts(client, tmp_path):
    """`--shots-from test` gives SGLang's `few_shot_gsm8k` prompts exactly (its shots are the
    first test questions); the default takes ours from the train file instead."""
    test, train = local_path_or_skip("test"), local_path_or_skip("train")
    script = ("import json, sys; from sglang.test import few_shot_gsm8k as f; "
              "lines = list(f.read_jsonl(sys.argv[1])); "
              "shots = f.get_few_shot_examples(lines, 5); "
              "print(json.dumps([shots + f.get_one_example(lines, i, False) "
              "for i in (0, 7, 1318)]))")
    theirs = json.loads(_run(client, ["-c", script, str(test)], tmp_path).splitlines()[-1])
    questions, shots = few_shot_gsm8k.read_jsonl(test), few_shot_gsm8k.read_jsonl(train)
    ours = {src: [few_shot_gsm8k.build_prompt(few_shot_gsm8k.few_shot_prefix(lines[:5]),
                                              questions[i]["question"]) for i in (0, 7, 1318)]
            for src, lines in (("test", questions), ("train", shots))}
    assert ours["test"] == theirs
    assert all(a != b for a, b in zip(ours["train"], theirs, strict=True))


def test_sglang_few_shot_gsm8k(client, server, tmp_path):
    url, _ = server
    port = url.rsplit(":", 1)[1]
    data = local_path_or_skip("test")
    out = _run(client, ["-m", "sglang.test.few_shot_gsm8k", "--data-path", str(data),
                        "--num-questions", "4", "--num-shots", "2", "--max-new-tokens", "24",
                        "--parallel", "4", "--host", "127.0.0.1", "--port", port],
               tmp_path)
    # every question answered (a failed request would end the run in a KeyError first)
    assert "Accuracy:" in out and "Invalid:" in out and "Output throughput:" in out, out[-2000:]
    states = (tmp_path / "tmp_output_gsm8k.txt").read_text()
    assert states.count("Question:") >= 4


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_sglang_bench_serving(client, server, tmp_path, backend):
    url, target = server
    result = tmp_path / "result.jsonl"
    _run(client, ["-m", "sglang.bench_serving", "--backend", backend, "--base-url", url,
                  "--tokenizer", target, "--model", target, "--dataset-name", "random-ids",
                  "--num-prompts", str(NUM_PROMPTS), "--random-input-len", "32",
                  "--random-output-len", "8", "--random-range-ratio", "1.0",
                  "--output-file", str(result), "--disable-tqdm"], tmp_path)
    summary = json.loads(result.read_text().splitlines()[-1])
    assert summary["completed"] == NUM_PROMPTS, summary
    assert summary["total_output_tokens"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

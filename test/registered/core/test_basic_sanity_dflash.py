"""End to end: the real server with SGLang's DFLASH flags, against a target-only server.

Checks the API contract (native and OpenAI, streaming), that greedy DFlash output equals the
target-only server's, that 64 concurrent requests finish with the sequential outputs, that bad
input gets a 4xx while the server keeps serving, and runs the GSM8K harness on real questions.
`test_basic_sanity_dflash_cuda.py` runs the same on the H200 with CUDA graphs.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import assert_spec_counts, tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Question: What is 12 + 30?\nAnswer:", "The quick brown fox", "Natalia sold clips",
           "Hello", "A long time ago in a galaxy far, far away"]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
BLOCK = 4


@pytest.fixture(scope="module")
def device():
    return "cpu"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, device):
    ckpt = tmp_path_factory.mktemp("ckpt")
    target, draft = tiny_checkpoint("tiny-k3", ckpt), tiny_checkpoint("tiny-k3-dflash", ckpt)
    common = ["--model-path", target, "--device", device, "--max-total-tokens", "16384",
              "--max-running-requests", "64", "--cuda-graph-max-bs-decode", "16",
              # the aux figures below weigh the storage against graph outputs only
              "--chunked-prefill-size", "-1"]
    dflash = [*common, "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path",
              draft, "--speculative-num-draft-tokens", str(BLOCK),
              "--speculative-dflash-block-size", str(BLOCK)]
    logs = tmp_path_factory.mktemp("log")
    with launched_server(dflash, logs / "dflash.log") as spec_url, \
            launched_server([*common, "--speculative-algorithm", "NONE"],
                            logs / "target.log") as target_url:
        yield spec_url, target_url


def _generate(url: str, prompt: str, params: dict = GREEDY, **extra) -> dict:
    r = httpx.post(f"{url}/generate", json={"text": prompt, "sampling_params": params, **extra},
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_dflash_equals_target_only_server(servers):
    spec, target = servers
    for prompt in PROMPTS:
        a, b = _generate(spec, prompt), _generate(target, prompt)
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        assert a["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"]
        assert_spec_counts(a["meta_info"], BLOCK)
        assert b["meta_info"]["spec_accept_length"] == 0.0


def test_streaming_and_openai_routes(servers):
    spec, _ = servers
    full = _generate(spec, PROMPTS[0])
    chunks = []
    with httpx.stream("POST", f"{spec}/generate", timeout=300, json={
            "text": PROMPTS[0], "sampling_params": GREEDY, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks[-1]["text"] == full["text"]  # each event: the whole text so far
    model = httpx.get(f"{spec}/v1/models").json()["data"][0]["id"]
    comp = httpx.post(f"{spec}/v1/completions", timeout=300, json={
        "model": model, "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0}).json()
    assert comp["choices"][0]["text"] == full["text"][: len(comp["choices"][0]["text"])]
    assert comp["usage"]["completion_tokens"] <= 16
    chat = httpx.post(f"{spec}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
        "temperature": 0, "stream": True})
    assert chat.status_code == 200 and chat.text.rstrip().endswith("data: [DONE]")
    info = httpx.get(f"{spec}/get_server_info").json()
    assert info["aux_buffer_bytes"] > 0 and info["aux_bytes_saved"] > 0


def test_64_concurrent_requests_match_sequential(servers):
    spec, _ = servers
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(64)]
    sequential = [_generate(spec, p)["output_ids"] for p in prompts[:8]]
    with ThreadPoolExecutor(64) as pool:
        concurrent = list(pool.map(lambda p: _generate(spec, p)["output_ids"], prompts))
    assert len(concurrent) == 64 and all(len(o) == GREEDY["max_new_tokens"] for o in concurrent)
    assert concurrent[:8] == sequential


@pytest.mark.parametrize("body,status", [
    ("{not json", 400),
    (json.dumps({"text": ""}), 400),
    (json.dumps({"text": "x" * 5000}), 400),
    (json.dumps({"text": "hi", "sampling_params": {"temperature": -1}}), 400),
    (json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}), 400),
    (json.dumps({"text": 5}), 422),
])
def test_bad_input_gets_4xx_and_server_keeps_serving(servers, body, status):
    spec, _ = servers
    r = httpx.post(f"{spec}/generate", content=body, timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["message"]
    bad_model = httpx.post(f"{spec}/v1/completions", json={"model": "nope", "prompt": "hi"})
    assert bad_model.status_code == 404
    assert _generate(spec, "still serving")["meta_info"]["completion_tokens"] == 16


def test_gsm8k_harness_on_real_questions(servers, capsys):
    spec, _ = servers
    metrics = gsm8k.main(["--data-path", str(local_path_or_skip("test")),
                          "--port", spec.rsplit(":", 1)[1], "--num-questions", "3",
                          "--num-shots", "2", "--max-new-tokens", "16", "--parallel", "3"])
    assert metrics["num_questions"] == 3 and metrics["num_errors"] == 0
    assert metrics["accept_length"] >= 1.0
    assert "Accuracy: " in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

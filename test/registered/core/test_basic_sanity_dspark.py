"""End to end: the real server with SGLang's DSPARK flags, static and compact verify
(`--speculative-verify-mode`, and SGLang's `SGLANG_RAGGED_VERIFY_MODE` as its default),
against a target-only server.

Greedy DSpark output equals the target-only server's on both; the responses and
/get_server_info carry SGLang's speculative fields (and the verify tokens spent, fewer per
accepted token under compact verify); concurrent requests match sequential ones;
`return_logprob` is refused with a 400 naming it while the server keeps serving; the GSM8K
harness runs on real questions. `test_basic_sanity_dspark_cuda.py` runs the same on the H200
with CUDA graphs.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_aux.srt.server_args import RAGGED_VERIFY_MODE_ENV
from sglang_aux.test import few_shot_gsm8k as gsm8k
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.gsm8k_data import local_path_or_skip
from sglang_aux.test.runtime_utils import assert_spec_counts, flat_step_costs, tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Question: What is 12 + 30?\nAnswer:", "The quick brown fox", "Natalia sold clips",
           "Hello", "A long time ago in a galaxy far, far away"]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
NUM_PROPOSALS = 3
MODES = ("static", "compact")


@pytest.fixture(scope="module")
def device():
    return "cpu"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, device):
    """{"static": url, "compact": url, "target": url}."""
    ckpt = tmp_path_factory.mktemp("ckpt")
    target, draft = tiny_checkpoint("tiny-qwen3", ckpt), tiny_checkpoint("tiny-qwen3-dspark",
                                                                          ckpt)
    common = ["--model-path", target, "--device", device, "--max-total-tokens", "16384",
              "--max-running-requests", "32", "--cuda-graph-max-bs-decode", "8"]
    dspark = [*common, "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path",
              draft, "--speculative-dspark-block-size", str(NUM_PROPOSALS),
              "--speculative-num-draft-tokens", str(NUM_PROPOSALS + 1)]
    logs = tmp_path_factory.mktemp("log")
    # on the CPU the compact schedule drafts at every batch size whatever the timings; the
    # GPU's CUDA-event timings derive it as served
    costs = ["--speculative-step-costs", flat_step_costs(logs)] if device == "cpu" else []
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(RAGGED_VERIFY_MODE_ENV, raising=False)
        with launched_server(dspark, logs / "static.log") as static:
            # compact from SGLang's variable, the flag's default
            mp.setenv(RAGGED_VERIFY_MODE_ENV, "compact")
            with launched_server([*dspark, *costs, "--speculative-dspark-align-verify-tokens-"
                                  "to-graph-tier"], logs / "compact.log") as compact, \
                    launched_server([*common, "--speculative-algorithm", "NONE"],
                                    logs / "target.log") as target_url:
                yield {"static": static, "compact": compact, "target": target_url}


def _generate(url: str, prompt: str, params: dict = GREEDY, **extra) -> dict:
    r = httpx.post(f"{url}/generate", json={"text": prompt, "sampling_params": params, **extra},
                   timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("mode", MODES)
def test_greedy_dspark_equals_target_only_server(servers, mode):
    for prompt in PROMPTS:
        a, b = _generate(servers[mode], prompt), _generate(servers["target"], prompt)
        assert a["output_ids"] == b["output_ids"] and a["text"] == b["text"]
        m = a["meta_info"]
        assert m["completion_tokens"] == GREEDY["max_new_tokens"]
        assert_spec_counts(m, NUM_PROPOSALS + 1)
        assert 0 < m["spec_verify_tokens"] <= (NUM_PROPOSALS + 1) * m["spec_verify_ct"]
        if mode == "static":
            assert m["spec_verify_tokens"] == (NUM_PROPOSALS + 1) * m["spec_verify_ct"]
        assert b["meta_info"]["spec_accept_length"] == 0.0


def test_server_info_carries_the_spec_fields(servers):
    ratios = {}
    for mode in MODES:
        for prompt in PROMPTS:
            _generate(servers[mode], prompt)
        info = httpx.get(f"{servers[mode]}/get_server_info").json()
        assert info["speculative_algorithm"] == "DSPARK"
        assert info["server_args"]["speculative_verify_width"] == NUM_PROPOSALS + 1
        assert info["server_args"]["speculative_verify_mode"] == mode
        state = info["internal_states"][0]
        assert state["avg_spec_accept_length"] >= 1.0
        ratios[mode] = state["avg_spec_verify_tokens_per_accepted"]
        assert info["aux_buffer_bytes"] > 0 and info["forward_mode"] == "TARGET_VERIFY"
        metrics = httpx.get(f"{servers[mode]}/metrics").text
        assert "sglang_aux:spec_verify_tokens_total" in metrics
    assert 0 < ratios["compact"] < ratios["static"], ratios
    compact = httpx.get(f"{servers['compact']}/get_server_info").json()
    # token buckets, several per request count
    assert compact["capture_bs"][-1] == 8 * (NUM_PROPOSALS + 1)


@pytest.mark.parametrize("mode", MODES)
def test_streaming_and_openai_routes(servers, mode):
    url = servers[mode]
    full = _generate(url, PROMPTS[0])
    chunks = []
    with httpx.stream("POST", f"{url}/generate", timeout=300, json={
            "text": PROMPTS[0], "sampling_params": GREEDY, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert chunks[-1]["text"] == full["text"]
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    comp = httpx.post(f"{url}/v1/completions", timeout=300, json={
        "model": model, "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0}).json()
    assert comp["choices"][0]["text"] == full["text"][: len(comp["choices"][0]["text"])]


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_requests_match_sequential(servers, mode):
    url = servers[mode]
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} #{i}" for i in range(24)]
    sequential = [_generate(url, p)["output_ids"] for p in prompts[:6]]
    with ThreadPoolExecutor(24) as pool:
        concurrent = list(pool.map(lambda p: _generate(url, p)["output_ids"], prompts))
    assert all(len(o) == GREEDY["max_new_tokens"] for o in concurrent)
    assert concurrent[:6] == sequential


def test_return_logprob_is_refused_and_the_server_keeps_serving(servers):
    url = servers["static"]
    r = httpx.post(f"{url}/generate", timeout=60, json={
        "text": "hi", "sampling_params": GREEDY, "return_logprob": True})
    assert r.status_code == 400 and "return_logprob" in r.json()["error"]["message"], r.text
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    r = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": model, "prompt": "hi", "max_tokens": 4, "logprobs": 2})
    assert r.status_code == 400 and "return_logprob" in r.text, r.text
    assert _generate(url, "still serving")["meta_info"]["completion_tokens"] == 16


@pytest.mark.parametrize("mode", MODES)
def test_gsm8k_harness_on_real_questions(servers, mode, capsys):
    metrics = gsm8k.main(["--data-path", str(local_path_or_skip("test")),
                          "--port", servers[mode].rsplit(":", 1)[1], "--num-questions", "3",
                          "--num-shots", "2", "--max-new-tokens", "16", "--parallel", "3"])
    assert metrics["num_questions"] == 3 and metrics["num_errors"] == 0
    assert metrics["accept_length"] >= 1.0
    assert 0 < metrics["verify_tokens_per_accepted"] <= NUM_PROPOSALS + 1
    assert "Verify tokens per accepted token: " in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

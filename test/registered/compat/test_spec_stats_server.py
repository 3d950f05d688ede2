"""SGLang's speculative statistics through the real HTTP server running DFlash: every
`/generate` meta_info field SGLang reports, consistent with each other and with the request's
output; `/get_server_info`'s `internal_states[0]` figures SGLang's tests read; the default
served model name (the folder's name, never its cache path)."""

import json
import sys
from pathlib import Path

import httpx
import pytest

from sglang_aux.srt.configs.presets import DEFAULT_MODEL
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=40, suite="default")

BLOCK = 4  # tiny-llama-dflash
PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 ="]
GREEDY = {"temperature": 0, "max_new_tokens": 13, "ignore_eos": True}
SPEC_KEYS = {"spec_accept_length", "spec_accept_rate", "spec_accepted_drafts",
             "spec_proposed_drafts", "spec_verify_ct", "spec_accept_histogram"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return {p: tiny_checkpoint(p, root) for p in ("tiny-llama", "tiny-llama-dflash")}


@pytest.fixture(scope="module")
def client(ckpts, tmp_path_factory):
    args = ["--model-path", ckpts["tiny-llama"], "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", ckpts["tiny-llama-dflash"], "--device", "cpu",
            "--max-total-tokens", "4096", "--cuda-graph-bs-decode", "1", "2", "4"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        with httpx.Client(base_url=url, timeout=120) as c:
            yield c


def _check_spec_meta(meta: dict) -> None:
    assert SPEC_KEYS <= set(meta)
    hist, verify_ct = meta["spec_accept_histogram"], meta["spec_verify_ct"]
    assert len(hist) == BLOCK and sum(hist) == verify_ct > 0
    assert meta["spec_accepted_drafts"] == sum(i * n for i, n in enumerate(hist))
    assert meta["spec_proposed_drafts"] == verify_ct * (BLOCK - 1)
    assert meta["spec_accept_rate"] == meta["spec_accepted_drafts"] / meta["spec_proposed_drafts"]
    # completion tokens per verify step, the bonus token included (SGLang's definition)
    assert meta["spec_accept_length"] == meta["completion_tokens"] / verify_ct
    assert 1.0 <= meta["spec_accept_length"] <= BLOCK + 1


def test_generate_meta_info_carries_sglang_spec_fields(client):
    outs = [client.post("/generate", json={"text": p, "sampling_params": GREEDY}).json()
            for p in PROMPTS]
    for out in outs:
        assert out["meta_info"]["completion_tokens"] == GREEDY["max_new_tokens"]
        _check_spec_meta(out["meta_info"])
    streamed = client.post("/generate", json={"text": PROMPTS[1], "sampling_params": GREEDY,
                                              "stream": True})
    events = [json.loads(line[len("data: "):]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    # the same prompt again: all of it but the last token comes from the prefix cache
    assert events[-1]["meta_info"] == {**outs[1]["meta_info"], "id": events[-1]["meta_info"]["id"],
                                       "e2e_latency": events[-1]["meta_info"]["e2e_latency"],
                                       "cached_tokens": outs[1]["meta_info"]["prompt_tokens"] - 1}


def test_server_info_internal_states(client):
    client.post("/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY})
    state = client.get("/get_server_info").json()["internal_states"][0]
    assert 1.0 <= state["avg_spec_accept_length"] <= BLOCK
    assert state["last_gen_throughput"] > 0


def test_default_served_model_name_is_the_folder_name(client, ckpts):
    name = Path(ckpts["tiny-llama"]).name
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [name]
    out = client.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 2})
    assert out.status_code == 200 and out.json()["model"] == name
    assert client.get("/get_model_info").json()["served_model_name"] == name


def test_served_model_name_defaults():
    assert ServerArgs().served_model_name == DEFAULT_MODEL  # the built-in name, not its cache
    assert ServerArgs(model_path="/ckpts/Qwen3-8B/").served_model_name == "Qwen3-8B"
    assert ServerArgs(model_path="/x", served_model_name="mine").served_model_name == "mine"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The HTTP server in a subprocess on a tiny checkpoint: native and OpenAI contracts (native
streamed events grow to the full text, OpenAI's pieces add up to it), greedy output equal to
the offline Engine's, 64 concurrent requests batched together with bad requests interleaved,
API keys, the info routes, and the
prefix cache (cached_tokens, /flush_cache; test_tokenizer_manager.py checks that it waits for
idle)."""

import asyncio
import json
import re
import sys
import time

import httpx
import pytest

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.entrypoints.http_server import gil_switch_interval
from sglang_aux.srt.entrypoints.openai.protocol import ChatMessage
from sglang_aux.srt.entrypoints.openai.serving_chat import chatml
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=60, suite="default")

API_KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONTEXT = 1024  # the tiny preset's whole context: a long generation to abort
KV_TOKENS = 8192
CAPTURE_BS = [1, 2, 4, 8, 16, 32, 64]
PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48"]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
NUM_CONCURRENT = 64
BAD_CASES = [  # (path, JSON body or raw text, status, words in the reason)
    ("/generate", '{"text": "hi",', 400, "malformed JSON"),
    ("/v1/chat/completions", "not json", 400, "malformed JSON"),
    ("/generate", [1, 2], 422, "object"),
    ("/generate", {"text": 5}, 422, "text"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": "hot"}}, 400, "temperature"),
    ("/generate", {"text": "hi", "max_tokens": 3}, 422, "max_tokens"),
    ("/generate", {"text": "hi", "sampling_params": {"max_tokens": 3}}, 400, "unknown sampling"),
    ("/generate", {"text": ""}, 400, "empty"),
    ("/generate", {"text": "x" * (CONTEXT + 10)}, 400, "context"),
    ("/generate", {"text": "hi", "input_ids": [1]}, 400, "exactly one"),
    ("/generate", {"input_ids": [10**6]}, 400, "input_ids"),
    ("/generate", {"text": "hi", "sampling_params": {"temperature": -1}}, 400, "temperature"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -5}}, 400, "max_new"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10**9}}, 400, "max_new"),
    ("/generate", {"text": "hi", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/v1/completions", {"prompt": 5}, 422, "prompt"),
    ("/v1/completions", {"prompt": "hi", "n": 2, "best_of": 1}, 400, "best_of"),
    ("/v1/completions", {"prompt": "hi", "no_such_field": 2}, 422, "no_such_field"),
    ("/generate", {"text": "hi", "lora_path": "x"}, 400, "lora_path"),
    ("/generate", {"text": "hi", "sampling_params": {"regex": "(a+"}}, 400, "regex"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]},
     400, "tools"),
    ("/v1/completions", {"prompt": ""}, 400, "empty"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_new_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": 1e6}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n must"),
    ("/v1/completions", {"prompt": "hi", "model": "no-such-model"}, 404, "not found"),
    ("/v1/chat/completions", {"messages": []}, 400, "empty"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 422, "content"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, 422, "role"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
     404, "not found"),
]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory):
    args = ["--model-path", ckpt, "--device", "cpu", "--api-key", API_KEY,
            "--context-length", str(CONTEXT), "--max-total-tokens", str(KV_TOKENS),
            "--max-running-requests", str(NUM_CONCURRENT),
            "--cuda-graph-bs-decode", *map(str, CAPTURE_BS), "--log-level", "debug"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server, headers=AUTH, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def engine(ckpt):
    return Engine(model_path=ckpt, device="cpu", context_length=CONTEXT,
                  max_total_tokens=KV_TOKENS, cuda_graph_bs_decode=[1, 2, 4])


def events(response: httpx.Response) -> list[dict]:
    """The JSON payloads of an SSE response, checking it ends with `[DONE]`."""
    assert response.status_code == 200 and "text/event-stream" in response.headers["content-type"]
    data = [line[len("data: "):] for line in response.text.splitlines() if line]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _payload(body: dict | list | str) -> dict:
    return {"content": body} if isinstance(body, str) else {"json": body}


def test_generate_equals_engine(client, engine):
    refs = engine.generate(PROMPTS, GREEDY)
    for prompt, ref in zip(PROMPTS, refs, strict=True):
        out = client.post("/generate", json={"text": prompt, "sampling_params": GREEDY}).json()
        assert (out["text"], out["output_ids"]) == (ref["text"], ref["output_ids"]), prompt
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == len(engine.tokenizer.encode(prompt))
        assert meta["completion_tokens"] == GREEDY["max_new_tokens"]
        assert meta["finish_reason"]["type"] == "length"
        assert meta["spec_accept_length"] == 0.0 and meta["e2e_latency"] > 0
    by_ids = client.post("/generate", json={"input_ids": engine.tokenizer.encode(PROMPTS[1]),
                                            "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == refs[1]["output_ids"]


def test_generate_stream_grows_to_the_full_text(client):
    full = client.post("/generate", json={"text": PROMPTS[0], "sampling_params": GREEDY}).json()
    # a stop string the greedy output really contains, to exercise the held-back text
    match = re.search(r"[0-9A-Za-z][ -~]", full["text"][2:])
    assert match, full["text"]
    stop = match.group()
    for params in (GREEDY, {**GREEDY, "stop": [stop]}):
        body = {"text": PROMPTS[0], "sampling_params": params}
        whole = client.post("/generate", json=body).json()
        chunks = events(client.post("/generate", json={**body, "stream": True}))
        # SGLang's default: every event carries the whole text and ids so far
        # (test_server_attacks.py streams with --incremental-streaming-output)
        for prev, chunk in zip(chunks, chunks[1:], strict=False):
            assert chunk["text"].startswith(prev["text"])
            assert chunk["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
        assert len(chunks) > 2 and chunks[-1]["text"] == whole["text"]
        assert chunks[-1]["output_ids"] == whole["output_ids"]
        assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
        assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]
    assert whole["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert whole["text"] == full["text"][: full["text"].find(stop)]


def test_openai_completions(client, ckpt):
    native = client.post("/generate", json={"text": PROMPTS[2], "sampling_params": GREEDY})
    body = {"model": ckpt.rsplit("/", 1)[-1], "prompt": PROMPTS[2], "max_tokens": 12,
            "temperature": 0, "ignore_eos": True}
    out = client.post("/v1/completions", json=body).json()
    assert out["object"] == "text_completion" and out["model"] == ckpt.rsplit("/", 1)[-1]
    assert out["choices"][0]["text"] == native.json()["text"]
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 12
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 12
    streamed = events(client.post("/v1/completions", json={
        **body, "stream": True, "stream_options": {"include_usage": True}}))
    assert "".join(c["choices"][0]["text"] for c in streamed[:-1]) == out["choices"][0]["text"]
    assert streamed[-2]["choices"][0]["finish_reason"] == "length"
    assert streamed[-1]["choices"] == [] and streamed[-1]["usage"] == out["usage"]


def test_openai_chat_completions(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {"messages": messages, "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    out = client.post("/v1/chat/completions", json=body).json()
    assert out["object"] == "chat.completion"
    message = out["choices"][0]["message"]
    # the tiny checkpoint has no chat template: ChatML
    prompt = chatml([ChatMessage(**m) for m in messages])
    native = client.post("/generate", json={"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": 10, "ignore_eos": True}}).json()
    assert message == {"role": "assistant", "content": native["text"]}
    assert out["usage"]["prompt_tokens"] == native["meta_info"]["prompt_tokens"]
    chunks = events(client.post("/v1/chat/completions", json={**body, "stream": True}))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"].get("content", "") for c in chunks]
    assert "".join(deltas) == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("path,body,status,reason", BAD_CASES)
def test_bad_input_gets_4xx_with_a_reason(client, path, body, status, reason):
    r = client.post(path, **_payload(body))
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert reason in error["message"] and error["type"] and error["code"] == status


def test_concurrent_requests_batch_and_survive_bad_ones(client, server):
    params = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
    prompts = [f"Request {i}: {'abcdefgh'[i % 8] * (i % 5 + 1)}" for i in range(NUM_CONCURRENT)]
    sequential = [client.post("/generate", json={"text": p, "sampling_params": params})
                  .json()["output_ids"] for p in prompts]
    decode_before = client.get("/get_server_info").json()["scheduler_stats"]["decode_steps"]

    async def run() -> list[tuple[bool, httpx.Response]]:
        async with httpx.AsyncClient(base_url=server, headers=AUTH, timeout=300,
                                     limits=httpx.Limits(max_connections=200)) as ac:
            calls = []  # (is good, request): a bad request after every other good one
            for i, p in enumerate(prompts):
                calls.append((True, ac.post("/generate", json={"text": p,
                                                               "sampling_params": params})))
                if i % 2 == 0:
                    path, body, _, _ = BAD_CASES[i // 2 % len(BAD_CASES)]
                    calls.append((False, ac.post(path, **_payload(body))))
            results = await asyncio.gather(*(c for _, c in calls))
        return [(good, r) for (good, _), r in zip(calls, results, strict=True)]

    results = asyncio.run(run())
    good = [r for ok, r in results if ok]
    assert [r.status_code for r in good] == [200] * NUM_CONCURRENT
    assert [r.json()["output_ids"] for r in good] == sequential
    assert all(400 <= r.status_code < 500 and "error" in r.json() for ok, r in results if not ok)
    info = client.get("/get_server_info").json()
    # one request at a time would take 3 decode steps each
    assert info["scheduler_stats"]["decode_steps"] - decode_before < NUM_CONCURRENT * 3 / 4
    _assert_kv_back(client)


def _assert_kv_back(client) -> None:
    """Idle: the cache holds the only KV not free, none of it locked; flushed, all is free."""
    info = client.get("/get_server_info").json()
    assert info["radix_cache_protected_tokens"] == 0
    assert info["available_kv_tokens"] + info["radix_cache_evictable_tokens"] == KV_TOKENS
    flushed = client.post("/flush_cache").json()
    assert flushed["success"] and flushed["freed_tokens"] == info["radix_cache_tokens"]
    info = client.get("/get_server_info").json()
    assert info["available_kv_tokens"] == info["max_total_num_tokens"] == KV_TOKENS
    assert info["available_req_rows"] == info["max_req_rows"]
    assert info["radix_cache_tokens"] == 0


def test_repeated_prompt_hits_the_cache(client):
    body = {"text": PROMPTS[1], "sampling_params": GREEDY}
    first, second = (client.post("/generate", json=body).json() for _ in range(2))
    assert second["output_ids"] == first["output_ids"]
    assert second["meta_info"]["cached_tokens"] == second["meta_info"]["prompt_tokens"] - 1
    hits = client.get("/get_server_info").json()["radix_cache_hit_tokens"]
    assert hits >= second["meta_info"]["cached_tokens"]
    _assert_kv_back(client)


ROUTES = [("GET", "/get_model_info"), ("GET", "/get_server_info"), ("GET", "/metrics"),
          ("GET", "/v1/models"), ("POST", "/generate"), ("POST", "/v1/completions"),
          ("POST", "/flush_cache"),
          ("POST", "/v1/chat/completions")]


def test_api_key_guards_every_route_but_health(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        for method, path in ROUTES:
            r = httpx.request(method, server + path, headers=headers, json={"text": "hi"})
            assert r.status_code == 401, (headers, path)
            assert r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server + "/health").json() == {"status": "ok"}


@pytest.mark.parametrize("stream", [True, False])
def test_client_going_away_aborts_its_request(client, stream):
    aborted = "sglang_aux:requests_aborted_total"
    before = _metrics(client)[aborted]
    body = {"text": "Hi", "stream": stream, "sampling_params": {**GREEDY, "max_new_tokens": 1000}}
    if stream:
        with client.stream("POST", "/generate", json=body) as r:
            next(r.iter_lines())  # one event, then hang up mid-generation
    else:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/generate", json=body, timeout=0.3)
    deadline = time.monotonic() + 30
    while _metrics(client)[aborted] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metrics(client)[aborted] == before + 1
    _assert_kv_back(client)  # the aborted request kept none of its KV
    out = client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY}).json()
    assert len(out["output_ids"]) == GREEDY["max_new_tokens"]


def _metrics(client) -> dict[str, float]:
    text = client.get("/metrics").text
    return {k: float(v) for k, v in re.findall(r"^(sglang_aux:\w+) (\S+)$", text, re.M)}


def test_gil_switch_interval_override(monkeypatch):
    monkeypatch.setenv("SGLANG_AUX_GIL_SWITCH_INTERVAL", "0.002")
    assert gil_switch_interval() == 0.002
    for bad in ("0", "-1", "fast"):
        monkeypatch.setenv("SGLANG_AUX_GIL_SWITCH_INTERVAL", bad)
        with pytest.raises(ValueError, match="positive number of seconds"):
            gil_switch_interval()


def test_model_and_server_info_and_metrics(client, ckpt):
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [ckpt.rsplit("/", 1)[-1]]
    model = client.get("/get_model_info").json()
    assert model["model_path"] == ckpt and model["architecture"] == "LlamaForCausalLM"
    assert model["is_generation"] is True and model["context_length"] == CONTEXT
    info = client.get("/get_server_info").json()
    assert info["capture_bs"] == CAPTURE_BS and info["forward_mode"] == "DECODE"
    assert info["graph_memory_bytes"] == 0  # free device memory does not move on CPU
    assert info["graph_memory_reserved_bytes"] == info["graph_memory_allocated_bytes"] == 0
    # no DFlash here: nothing captured, nothing shared, nothing saved
    assert info["aux_buffer_bytes"] == info["aux_per_graph_bytes"] == info["aux_bytes_saved"] == 0
    assert info["server_args"]["api_key"] == "<redacted>" and API_KEY not in json.dumps(info)
    assert info["radix_cache_enabled"] and not info["server_args"]["disable_radix_cache"]
    assert info["gil_switch_interval"] == pytest.approx(0.0005)  # not Python's 5 ms
    before = _metrics(client)
    out = client.post("/generate", json={"text": "Hi", "sampling_params": GREEDY}).json()
    client.post("/generate", json={"text": ""})
    after = _metrics(client)
    delta = {k: after[k] - before[k] for k in before}
    assert delta["sglang_aux:requests_total"] == 2
    assert delta["sglang_aux:requests_finished_total"] == 1
    assert delta["sglang_aux:requests_failed_total"] == 1
    assert delta["sglang_aux:prompt_tokens_total"] == out["meta_info"]["prompt_tokens"]
    assert delta["sglang_aux:generation_tokens_total"] == GREEDY["max_new_tokens"]
    assert after["sglang_aux:spec_accept_length"] == 0.0
    running = "sglang_aux:num_running_reqs"
    deadline = time.monotonic() + 10  # an answer can arrive before its step has returned
    while _metrics(client)[running] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _metrics(client)[running] == after["sglang_aux:num_queue_reqs"] == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

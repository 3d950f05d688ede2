"""SGLang's request fields on the real server (tiny preset, CPU): every field at its default
is accepted, an unimplemented one set otherwise is a 400 naming it, a field SGLang does not
have is a 422; n > 1, batches, stop_regex, no_stop_trim, skip_special_tokens, penalties,
min_new_tokens and min_p work."""

import sys

import httpx
import pytest

from sglang_aux.srt.entrypoints.openai.sglang_fields import (
    CHAT_UNSUPPORTED,
    COMPLETION_UNSUPPORTED,
    GENERATE_UNSUPPORTED,
)
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.sampling_params import UNSUPPORTED
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=60, suite="default")

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Hi"}]
NON_DEFAULT = "x"  # differs from every default in the tables


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--max-total-tokens", "8192"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as base:
        yield base


def _post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=300)


def test_every_field_at_its_default_is_accepted(url):
    params = {**GREEDY, **UNSUPPORTED, "min_p": 0.0, "frequency_penalty": 0.0,
              "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1,
              "stop_regex": None, "no_stop_trim": False, "skip_special_tokens": True,
              "spaces_between_special_tokens": True, "sampling_seed": None}
    r = _post(url, "/generate", {"text": "Hello", "sampling_params": params,
                                 **GENERATE_UNSUPPORTED, "log_metrics": False, "rid": "mine"})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["id"] == "mine"
    r = _post(url, "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "best_of": 1,
                                       **COMPLETION_UNSUPPORTED})
    assert r.status_code == 200, r.text
    r = _post(url, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4,
                                            **CHAT_UNSUPPORTED, "tool_choice": "none"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,table", [("/generate", GENERATE_UNSUPPORTED),
                                        ("/v1/completions", COMPLETION_UNSUPPORTED),
                                        ("/v1/chat/completions", CHAT_UNSUPPORTED),
                                        ("sampling", UNSUPPORTED)])
def test_unimplemented_fields_are_refused_by_name(url, path, table):
    base = {"/generate": {"text": "Hi"}, "/v1/completions": {"prompt": "Hi"},
            "/v1/chat/completions": {"messages": MESSAGES}, "sampling": {"text": "Hi"}}[path]
    for name in table:
        body = ({**base, "sampling_params": {name: NON_DEFAULT}} if path == "sampling"
                else {**base, name: NON_DEFAULT})
        r = _post(url, "/generate" if path == "sampling" else path, body)
        assert r.status_code == 400 and name in r.text and "not supported" in r.text, r.text
    r = _post(url, "/generate" if path == "sampling" else path, {**base, "no_such_field": 1})
    assert r.status_code == 422 and "no_such_field" in r.text


def test_n_and_batches(url):
    r = _post(url, "/v1/completions", {"prompt": ["Hello", "The fox"], "n": 3, "max_tokens": 6,
                                       "temperature": 1.0, "seed": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert len({c["text"] for c in body["choices"][:3]}) > 1  # seeds 7, 8, 9 differ
    prompt_tokens = sum(_post(url, "/generate", {"text": p, "sampling_params": {
        "max_new_tokens": 0}}).json()["meta_info"]["prompt_tokens"] for p in ["Hello", "The fox"])
    assert body["usage"]["prompt_tokens"] == prompt_tokens
    outs = _post(url, "/generate", {"text": "Hello", "sampling_params": {**GREEDY, "n": 2}}).json()
    assert len(outs) == 2 and outs[0]["output_ids"] == outs[1]["output_ids"]
    batch = _post(url, "/generate", {"text": ["Hello", "The fox"], "sampling_params": GREEDY})
    single = _post(url, "/generate", {"text": "The fox", "sampling_params": GREEDY}).json()
    assert batch.json()[1]["output_ids"] == single["output_ids"]
    chat = _post(url, "/v1/chat/completions", {"messages": MESSAGES, "n": 2, "max_tokens": 4})
    assert [c["index"] for c in chat.json()["choices"]] == [0, 1]


def test_stop_regex_and_no_stop_trim(url):
    full = _post(url, "/generate", {"text": "Hello", "sampling_params": GREEDY}).json()["text"]
    piece = full[4:7]
    assert piece
    pattern = "".join(f"[{c}]" if c.isalnum() else "\\" + c if c in ".^$*+?{}[]\\|()" else c
                      for c in piece)
    cut = _post(url, "/generate", {"text": "Hello", "sampling_params": {
        **GREEDY, "stop_regex": pattern}}).json()
    assert cut["meta_info"]["finish_reason"]["type"] == "stop"
    assert full.startswith(cut["text"]) and piece not in cut["text"]
    kept = _post(url, "/generate", {"text": "Hello", "sampling_params": {
        **GREEDY, "stop_regex": pattern, "no_stop_trim": True}}).json()
    assert kept["text"].startswith(cut["text"]) and piece in kept["text"]


def test_penalties_min_new_tokens_and_min_p_over_http(url):
    """Native and OpenAI spellings reach the sampler: penalties change a greedy output,
    min_new_tokens (OpenAI min_tokens) holds back a stop token, min_p 1 samples greedily."""
    base = _post(url, "/generate", {"text": "Hello", "sampling_params": GREEDY}).json()
    ids = base["output_ids"]
    penalized = _post(url, "/generate", {"text": "Hello", "sampling_params": {
        **GREEDY, "repetition_penalty": 2.0, "frequency_penalty": 1.0,
        "presence_penalty": 1.0}})
    assert penalized.status_code == 200, penalized.text
    assert penalized.json()["output_ids"] != ids
    sampled = _post(url, "/generate", {"text": "Hello", "sampling_params": {
        **GREEDY, "temperature": 1.0, "min_p": 1.0, "seed": 1}}).json()
    assert sampled["output_ids"] == ids
    stop = {"ignore_eos": False, "stop_token_ids": [ids[1]]}
    cut = _post(url, "/generate", {"text": "Hello", "sampling_params": {**GREEDY, **stop}})
    assert cut.json()["output_ids"] == ids[:2]
    for path, body, count in [
            ("/generate", {"text": "Hello", "sampling_params": {
                **GREEDY, **stop, "min_new_tokens": 6}}, lambda r: len(r["output_ids"])),
            ("/v1/completions", {"prompt": "Hello", "max_tokens": 12, "temperature": 0,
                                 **stop, "min_tokens": 6},
             lambda r: r["usage"]["completion_tokens"])]:
        r = _post(url, path, body)
        assert r.status_code == 200, r.text
        assert count(r.json()) > 6, r.text


def test_skip_special_tokens(url):
    tok = Tokenizer.byte_level()  # the tiny presets': ids past 255 are special tokens
    params = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    skipped = _post(url, "/generate", {"input_ids": [256, 72, 105], "sampling_params": params})
    shown = _post(url, "/generate", {"input_ids": [256, 72, 105], "sampling_params": {
        **params, "skip_special_tokens": False}})
    ids = skipped.json()["output_ids"]
    assert shown.json()["output_ids"] == ids
    assert skipped.json()["text"] == tok.decode(ids)
    assert shown.json()["text"] == tok.decode(ids, skip_special_tokens=False)


def test_native_logprobs_over_http(url):
    """`return_logprob` through the live server, streamed and not: SGLang's meta_info layout,
    one entry per prompt position from `logprob_start_len` (the first null) and per output
    token, each the log-probability of the token it names; both requests agree, and each
    streamed event carries the entries of its tokens."""
    body = {"text": "Hello there", "sampling_params": GREEDY, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    r = _post(url, "/generate", body)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    prompt, output = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert len(prompt) == meta["prompt_tokens"] and prompt[0][0] is None
    assert [e[1] for e in output] == out["output_ids"]
    for logprob, _, text in prompt[1:] + output:
        assert logprob <= 0.0 and isinstance(text, str)
    for (logprob, token, _), top in zip(output, meta["output_top_logprobs"], strict=True):
        assert len(top) == 2 and top[0][0] >= top[1][0]
        assert top[0][1] == token and top[0][0] == logprob  # greedy: the argmax was emitted
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True},
                      timeout=300) as s:
        events = [ln[6:] for ln in s.iter_lines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = httpx.Response(200, content=events[-2]).json()["meta_info"]
    assert last["output_token_logprobs"] == output
    assert last["input_token_logprobs"] == prompt
    # as SGLang, every event carries the entries so far (only the new ones with
    # --incremental-streaming-output)
    for event in events[:-2]:
        chunk = httpx.Response(200, content=event).json()
        assert chunk["meta_info"]["output_token_logprobs"] == output[:len(chunk["output_ids"])]
        assert chunk["meta_info"]["input_token_logprobs"] == prompt


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

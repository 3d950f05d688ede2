"""Structured output over HTTP, against the real server (tiny-llama + its DFlash draft, CPU):
native `regex` / `json_schema` / `ebnf` (streamed too), OpenAI `response_format`
(`json_schema`, `json_object`, `structural_tag`) and SGLang's grammar fields through the
`openai` client, with n > 1, penalties and min_p; a bad grammar is a 400 naming the field
and the server keeps serving. The tiny random model writes these grammars only because the
token masks force it to."""

import json
import re
import sys

import httpx
import jsonschema
import openai
import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.grammar_cases import EBNF, GRAMMARS, REGEX, SCHEMA, check_output
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=45, suite="default")

pytest.importorskip("xgrammar", reason="structured output needs xgrammar ([grammar] extra)")

MESSAGES = [{"role": "user", "content": "Who are you?"}]
MODEL = "tiny-llama"  # the served name: the model folder's


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    args = ["--model-path", tiny_checkpoint("tiny-llama", root), "--device", "cpu",
            "--dtype", "float32", "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", tiny_checkpoint("tiny-llama-dflash", root),
            "--max-total-tokens", "8192", "--cuda-graph-bs-decode", "1", "2", "4",
            # compact JSON: a random model may wander in optional whitespace (the Engine
            # test covers the default)
            "--constrained-json-disable-any-whitespace"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


def _generate(server: str, params: dict, **body) -> httpx.Response:
    return httpx.post(f"{server}/generate", timeout=120,
                      json={"text": "Hello there", "sampling_params": params, **body})


def _client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0, timeout=120)


@pytest.mark.parametrize("grammar", GRAMMARS)
def test_native_grammars(server, grammar):
    r = _generate(server, {"temperature": 0, "max_new_tokens": 128, **grammar})
    assert r.status_code == 200, r.text
    out = r.json()
    check_output(grammar, out["text"])
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert out["meta_info"]["spec_verify_ct"] > 0  # DFlash verified it


def test_native_stream_follows_the_regex(server):
    with httpx.stream("POST", f"{server}/generate", timeout=120, json={
            "text": "Hello there", "stream": True, "sampling_params": {
                "temperature": 0.7, "seed": 3, "max_new_tokens": 64, "regex": REGEX}}) as r:
        assert r.status_code == 200
        events = [json.loads(line[len("data: "):]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    assert re.fullmatch(REGEX, events[-1]["text"]), events[-1]["text"]


def test_openai_response_format_json_schema(server):
    whole = _client(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=160,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    choice = whole.choices[0]
    assert choice.finish_reason == "stop"
    text = _client(server).chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8,
        response_format={"type": "text"})
    assert isinstance(text.choices[0].message.content, str)  # plain text is accepted
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_openai_response_format_json_object_and_structural_tag(server):
    client = _client(server)
    # any object: keys are unbounded, so a random model need not close it; what it wrote is
    # the start of an object, and a whole object when it stopped
    obj = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0,
                                         max_tokens=24, response_format={"type": "json_object"})
    content = obj.choices[0].message.content
    assert content.startswith('{"') or content == "{}", content
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    tag = {"type": "structural_tag", "format": {"type": "const_string", "value": "hello!"}}
    out = client.completions.create(model=MODEL, prompt="Say", temperature=0.9, seed=1,
                                    max_tokens=32, extra_body={"response_format": tag})
    assert out.choices[0].text == "hello!" and out.choices[0].finish_reason == "stop"


def test_openai_grammar_fields_with_n_penalties_and_min_p(server):
    client = _client(server)
    out = client.completions.create(
        model=MODEL, prompt="Pets:", n=3, temperature=0.9, seed=7, max_tokens=48,
        frequency_penalty=0.5, presence_penalty=0.3,
        extra_body={"regex": REGEX, "min_p": 0.05, "repetition_penalty": 1.3})
    assert len(out.choices) == 3
    for c in out.choices:
        assert re.fullmatch(REGEX, c.text), c.text
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2,
                                          temperature=1.0, seed=2, max_tokens=48,
                                          extra_body={"ebnf": EBNF, "min_tokens": 3})
    for c in chat.choices:
        check_output({"ebnf": EBNF}, c.message.content)
    native = _generate(server, {"temperature": 1.0, "n": 2, "max_new_tokens": 48,
                                "regex": REGEX, "min_p": 0.1})
    assert native.status_code == 200, native.text
    assert all(re.fullmatch(REGEX, o["text"]) for o in native.json())


@pytest.mark.parametrize("path,body,words", [
    ("/generate", {"text": "x", "sampling_params": {"regex": "(ab"}}, "regex is not valid"),
    ("/generate", {"text": "x", "sampling_params": {"json_schema": '{"type": 3}'}},
     "json_schema is not valid"),
    ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= x"}}, "ebnf is not valid"),
    ("/generate", {"text": "x", "sampling_params": {"regex": "a", "ebnf": EBNF}}, "at most one"),
    ("/v1/completions", {"prompt": "x", "regex": "[z"}, "regex is not valid"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "xml"}},
     "response_format.type"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}},
     "json_schema is not valid"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}, "json_schema.schema"),
    ("/v1/completions", {"prompt": "x", "json_schema": "{}", "response_format": {
        "type": "json_object"}}, "json_schema and response_format"),
    ("/v1/completions", {"prompt": "x", "regex": "a", "response_format": {
        "type": "json_object"}}, "at most one"),
    ("/v1/completions", {"prompt": "x", "response_format": {
        "type": "structural_tag", "format": {"type": "nope"}}}, "structural_tag is not valid"),
])
def test_bad_grammars_are_400_naming_the_field(server, path, body, words):
    r = httpx.post(server + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"], r.text
    ok = _generate(server, {"temperature": 0, "max_new_tokens": 40, "regex": REGEX})
    assert ok.status_code == 200 and re.fullmatch(REGEX, ok.json()["text"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

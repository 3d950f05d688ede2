"""The real `openai` Python client against the real server (`--api-key`, `--served-model-name`):
models list, completion, chat, streaming of both (pieces add up to the whole), a wrong model
name (NotFoundError, 404, as OpenAI answers) and a missing or wrong API key
(AuthenticationError, 401); the server keeps serving after each error."""

import sys

import httpx
import openai
import pytest

from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=30, suite="default")

API_KEY = "sk-compat"
NAME = "tiny-chat"
PROMPT = "The quick brown fox jumps over"
GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tiny_checkpoint("tiny-llama", tmp_path_factory.mktemp("ckpt"))
    args = ["--model-path", ckpt, "--device", "cpu", "--api-key", API_KEY,
            "--served-model-name", NAME, "--max-total-tokens", "4096",
            "--cuda-graph-bs-decode", "1", "2"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url


def _client(server: str, api_key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=api_key, max_retries=0, timeout=120)


def test_models_list(server):
    models = _client(server).models.list()
    assert [m.id for m in models.data] == [NAME]


def test_completion_and_its_stream(server):
    client = _client(server)
    whole = client.completions.create(model=NAME, prompt=PROMPT, **GREEDY)
    assert whole.model == NAME and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == GREEDY["max_tokens"]
    native = httpx.post(f"{server}/generate", headers={"Authorization": f"Bearer {API_KEY}"},
                        json={"text": PROMPT, "sampling_params": {
                            "temperature": 0, "max_new_tokens": 12, "ignore_eos": True}})
    assert whole.choices[0].text == native.json()["text"]
    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, stream=True, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_and_its_stream(server):
    client = _client(server)
    whole = client.chat.completions.create(model=NAME, messages=MESSAGES, **GREEDY)
    message = whole.choices[0].message
    assert whole.model == NAME and message.role == "assistant"
    assert isinstance(message.content, str) and whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, stream=True,
                                                 **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_wrong_model_name_is_not_found(server):
    client = _client(server)
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=2)
    assert err.value.status_code == 404 and NAME in str(err.value)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert client.completions.create(model=NAME, prompt=PROMPT, max_tokens=2).choices


def test_rid_names_the_response(server):
    """SGLang's `rid` (extra_body) becomes the response's id, streamed or not; a list gives
    one per prompt; a list that does not match the prompts is a 400 naming rid."""
    client = _client(server)
    chat = client.chat.completions.create(model=NAME, messages=MESSAGES, n=2, temperature=0,
                                          max_tokens=2, extra_body={"rid": "chat-rid"})
    assert chat.id == "chat-rid" and len(chat.choices) == 2
    chunks = list(client.chat.completions.create(model=NAME, messages=MESSAGES, stream=True,
                                                 max_tokens=2, extra_body={"rid": "chat-rid"}))
    assert {c.id for c in chunks} == {"chat-rid"}
    both = client.completions.create(model=NAME, prompt=[PROMPT, "Hello"], max_tokens=2,
                                     extra_body={"rid": ["a-rid", "b-rid"]})
    assert len(both.choices) == 2 and both.id.startswith("cmpl-")
    for bad, prompt in [(["only-one"], [PROMPT, "Hello"]), ("one-for-two", [PROMPT, "Hello"]),
                        (["x", "y"], PROMPT)]:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(model=NAME, prompt=prompt, max_tokens=2,
                                      extra_body={"rid": bad})
        assert "rid" in str(err.value)
    assert client.completions.create(model=NAME, prompt=PROMPT, max_tokens=2,
                                     extra_body={"rid": "after"}).id == "after"


# The SDK refuses an empty key itself; a request without the header uses its own `Omit`.
NO_AUTH_HEADER = {"Authorization": openai.Omit()}


@pytest.mark.parametrize("api_key, headers", [(API_KEY, NO_AUTH_HEADER), ("sk-wrong", None)])
def test_missing_or_wrong_api_key_is_unauthorized(server, api_key, headers):
    with pytest.raises(openai.AuthenticationError) as err:
        _client(server, api_key).models.list(extra_headers=headers)
    assert err.value.status_code == 401
    assert _client(server).models.list().data


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

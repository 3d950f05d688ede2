"""OpenAI logprobs through the real `openai` client against the real server (tiny preset with
DFlash, CPU): completions' legacy layout (with echo: the prompt's entries first, the first
null) and chat's, streamed and not, equal to the native route's values for the same greedy
request; `best_of` returns the candidates of the highest mean logprob; bad values are a 400
naming the field and the server keeps serving."""

import sys

import httpx
import openai
import pytest

from sglang_aux.srt.entrypoints.openai.protocol import ChatMessage
from sglang_aux.srt.entrypoints.openai.serving_chat import render_chat
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=40, suite="default")

PROMPT = "The quick brown fox"
MAX_TOKENS = 8
TOP = 3
GREEDY = {"temperature": 0, "max_tokens": MAX_TOKENS, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "user", "content": "Hi!"}]
# a DFlash verify forward and a target-only one round differently (docs/compat.md)
CLOSE = {"rel": 1e-4, "abs": 1e-4}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("ckpt")
    target, draft = tiny_checkpoint("tiny-llama", ckpt), tiny_checkpoint("tiny-llama-dflash", ckpt)
    args = ["--model-path", target, "--device", "cpu", "--max-total-tokens", "8192",
            "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", draft,
            "--speculative-num-draft-tokens", "4"]
    with launched_server(args, tmp_path_factory.mktemp("log") / "server.log") as url:
        yield url, Tokenizer.from_dir(target)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _native(url: str, text: str, start: int) -> dict:
    r = httpx.post(f"{url}/generate", timeout=300, json={
        "text": text, "return_logprob": True, "logprob_start_len": start,
        "top_logprobs_num": TOP,
        "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def _check_top(tok: Tokenizer, values: list, tops: list[dict], native_top: list,
               greedy: bool = True) -> None:
    """Each top dict holds the top-n and the chosen token by text (the likeliest's value where
    texts repeat, as the random tiny model's byte pieces do); greedy output tokens are the
    likeliest."""
    for value, top, row in zip(values, tops, native_top, strict=True):
        expected: dict[str, float] = {}
        for v, t, _ in row:
            expected.setdefault(tok.token_text(t), v)
        assert top.keys() >= expected.keys() and len(top) <= TOP + 1
        assert [top[k] for k in expected] == pytest.approx(list(expected.values()), **CLOSE)
        if greedy:
            assert max(top.values()) == pytest.approx(value, **CLOSE)


def test_completion_logprobs_equal_the_native_ones(server):
    url, tok = server
    native = _native(url, PROMPT, -1)
    out = native["meta_info"]["output_token_logprobs"]
    whole = _client(url).completions.create(prompt=PROMPT, logprobs=TOP, model=None, **GREEDY)
    choice = whole.choices[0]
    lp = choice.logprobs
    assert choice.text == native["text"]
    assert lp.tokens == [tok.token_text(t) for _, t, _ in out]
    assert lp.token_logprobs == pytest.approx([v for v, _, _ in out], **CLOSE)
    _check_top(tok, lp.token_logprobs, lp.top_logprobs, native["meta_info"]["output_top_logprobs"])
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)

    _check_streamed_completion(url, {"prompt": PROMPT, "logprobs": TOP}, whole)


def _check_streamed_completion(url: str, body: dict, whole, exact: bool = True) -> None:
    """Each streamed chunk carries the logprobs of its own tokens: together (per choice)
    exactly the non-streamed request's, text_offset continuing across chunks. (Not
    `exact`: n > 1 samples may be batched differently the second time, so values round
    differently.)"""
    chunks = list(_client(url).completions.create(model=None, stream=True, **body, **GREEDY))
    for choice in whole.choices:
        mine = [c.choices[0] for c in chunks if c.choices[0].index == choice.index]
        assert "".join(c.text for c in mine) == choice.text
        carrying = [c.logprobs for c in mine if c.logprobs.tokens]
        assert len(carrying) > 1, "the logprobs must come with the chunks, not all at the end"
        for key in ("tokens", "text_offset", "token_logprobs", "top_logprobs"):
            joined = [x for lp in carrying for x in getattr(lp, key)]
            if exact or key in ("tokens", "text_offset"):
                assert joined == getattr(choice.logprobs, key), key
            elif key == "token_logprobs":  # the first is null (echo)
                assert joined[1:] == pytest.approx(choice.logprobs.token_logprobs[1:], **CLOSE)


def test_echo_gives_the_prompt_and_its_logprobs(server):
    url, tok = server
    native = _native(url, PROMPT, 0)
    meta = native["meta_info"]
    rows = meta["input_token_logprobs"] + meta["output_token_logprobs"]
    whole = _client(url).completions.create(prompt=PROMPT, logprobs=TOP, echo=True, model=None,
                                            **GREEDY)
    lp = whole.choices[0].logprobs
    assert whole.choices[0].text == PROMPT + native["text"]
    assert len(lp.tokens) == meta["prompt_tokens"] + MAX_TOKENS
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([v for v, _, _ in rows[1:]], **CLOSE)
    assert "".join(lp.tokens[:meta["prompt_tokens"]]) == PROMPT
    assert lp.text_offset[:len(PROMPT)] == list(range(len(PROMPT)))  # one byte per token
    _check_streamed_completion(url, {"prompt": PROMPT, "logprobs": TOP, "echo": True}, whole)
    _check_streamed_completion(url, {"prompt": PROMPT, "logprobs": TOP, "echo": True, "n": 2},
                               _client(url).completions.create(
                                   prompt=PROMPT, logprobs=TOP, echo=True, n=2, model=None,
                                   **GREEDY), exact=False)
    n = meta["prompt_tokens"]
    _check_top(tok, lp.token_logprobs[1:n], lp.top_logprobs[1:n],
               meta["input_top_logprobs"][1:], greedy=False)
    _check_top(tok, lp.token_logprobs[n:], lp.top_logprobs[n:], meta["output_top_logprobs"])

    # as lm-evaluation-harness asks: token id prompts, a batch, echo, one new token
    ids = [tok.encode(PROMPT), tok.encode("Hello")]
    batch = _client(url).completions.create(prompt=ids, logprobs=1, echo=True, max_tokens=1,
                                            temperature=0, model=None)
    assert [c.index for c in batch.choices] == [0, 1]
    for choice, prompt in zip(batch.choices, ids, strict=True):
        assert len(choice.logprobs.token_logprobs) == len(prompt) + 1
        assert choice.logprobs.token_logprobs[0] is None
    assert batch.choices[0].logprobs.token_logprobs[1:-1] == pytest.approx(
        [v for v, _, _ in meta["input_token_logprobs"][1:]], **CLOSE)


def test_chat_logprobs_equal_the_native_ones(server):
    url, tok = server
    prompt = render_chat(tok, [ChatMessage(**m) for m in MESSAGES])
    native = _native(url, prompt, -1)
    out, native_top = (native["meta_info"][k] for k in ("output_token_logprobs",
                                                         "output_top_logprobs"))
    whole = _client(url).chat.completions.create(messages=MESSAGES, logprobs=True,
                                                 top_logprobs=TOP, model=None, **GREEDY)
    content = whole.choices[0].logprobs.content
    assert whole.choices[0].message.content == native["text"]
    assert [e.token for e in content] == [tok.token_text(t) for _, t, _ in out]
    assert [e.bytes for e in content] == [tok.token_bytes(t) for _, t, _ in out]
    assert [e.logprob for e in content] == pytest.approx([v for v, _, _ in out], **CLOSE)
    for entry, row in zip(content, native_top, strict=True):
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and len(values) == TOP
        assert values == pytest.approx([v for v, _, _ in row], **CLOSE)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the argmax was emitted

    chunks = list(_client(url).chat.completions.create(
        messages=MESSAGES, logprobs=True, top_logprobs=TOP, model=None, stream=True, **GREEDY))
    carrying = [c.choices[0].logprobs.content for c in chunks
                if c.choices and c.choices[0].logprobs]
    assert len(carrying) > 1, "the logprobs must come with the chunks, not all at the end"
    assert [e for piece in carrying for e in piece] == content  # exactly

    plain = _client(url).chat.completions.create(messages=MESSAGES, logprobs=True, model=None,
                                                 **GREEDY)
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    assert _client(url).chat.completions.create(messages=MESSAGES, model=None, **GREEDY
                                                ).choices[0].logprobs is None


def _mean(choice) -> float:
    values = choice.logprobs.token_logprobs
    return sum(values) / len(values)


def test_best_of_returns_the_candidates_of_highest_mean_logprob(server):
    url, _ = server
    sampled = {"prompt": PROMPT, "model": None, "temperature": 1.0, "max_tokens": MAX_TOKENS,
               "seed": 7, "logprobs": 0, "extra_body": {"ignore_eos": True}}
    # the same seeded candidates: sample i is seeded with seed + i either way
    candidates = _client(url).completions.create(n=4, **sampled).choices
    assert len({c.text for c in candidates}) > 2, "the candidates must differ to rank them"
    ranked = sorted(candidates, key=_mean, reverse=True)
    best = _client(url).completions.create(n=2, best_of=4, **sampled)
    assert [c.index for c in best.choices] == [0, 1]
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [_mean(c) for c in best.choices] == pytest.approx([_mean(c) for c in ranked[:2]],
                                                             **CLOSE)
    # every candidate was generated, so usage counts them all; logprobs only when asked
    quiet = {k: v for k, v in sampled.items() if k != "logprobs"}
    one = _client(url).completions.create(best_of=4, **quiet)
    assert len(one.choices) == 1 and one.choices[0].logprobs is None
    assert one.choices[0].text == ranked[0].text
    assert one.usage.completion_tokens == 4 * MAX_TOKENS
    assert one.usage.prompt_tokens == best.usage.prompt_tokens


@pytest.mark.parametrize("body,words", [
    ({"n": 3, "best_of": 2}, "best_of must"),
    ({"n": 1, "best_of": 1000}, "best_of must"),
    ({"n": 1, "best_of": 2, "stream": True}, "cannot be streamed"),
])
def test_bad_best_of_is_refused_by_name(server, body, words):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, **body})
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    chunks = list(_client(url).completions.create(prompt=PROMPT, model=None, max_tokens=2, n=2,
                                                  best_of=2, stream=True))
    assert {c.choices[0].index for c in chunks} == {0, 1}


@pytest.mark.parametrize("route,body,field", [
    ("completions", {"prompt": PROMPT, "logprobs": 100}, "logprobs"),
    ("completions", {"prompt": PROMPT, "logprobs": -1}, "logprobs"),
    ("chat", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("chat", {"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs"),
])
def test_bad_logprob_values_are_refused_by_name(server, route, body, field):
    url, _ = server
    client = _client(url)
    create = client.completions.create if route == "completions" else \
        client.chat.completions.create
    with pytest.raises(openai.BadRequestError) as e:
        create(model=None, **body)
    assert e.value.status_code == 400 and field in str(e.value)
    assert client.completions.create(prompt=PROMPT, model=None, max_tokens=2).choices[0].text


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

"""Wire formats of the HTTP routes: request bodies and SSE framing (errors: `api_error.py`).

Bodies are strict (a string is never coerced to a number) and closed (a field SGLang does not
have is an error), so a client's typo surfaces as a 422 naming the field instead of being
ignored; SGLang's fields this server does not implement are a 400 naming the field unless
sent at their defaults (`sglang_fields`).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from sglang_aux.srt.entrypoints.openai.api_error import APIError
from sglang_aux.srt.entrypoints.openai.response_format import response_format_grammar
from sglang_aux.srt.entrypoints.openai.sglang_fields import (
    CHAT_NO_EFFECT,
    CHAT_UNSUPPORTED,
    COMPLETION_NO_EFFECT,
    COMPLETION_UNSUPPORTED,
    GENERATE_NO_EFFECT,
    GENERATE_UNSUPPORTED,
    drop_known_fields,
)
from sglang_aux.srt.sampling.sampling_params import MAX_N

# OpenAI's documented default for /v1/completions; chat has none (the native default applies).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
SSE_DONE = "data: [DONE]\n\n"

# OpenAI caps chat's top_logprobs at 20 and completions' logprobs at 5; vLLM and
# lm-evaluation-harness use up to 20 with completions too
MAX_TOP_LOGPROBS = 20

def native_logprob_fields(name: str, top_n: int | None, with_prompt: bool) -> dict:
    """The native logprob fields asking for `top_n` alternatives per token (field `name`; a
    400 outside [0, MAX_TOP_LOGPROBS]), and for the prompt's from its first token when
    `with_prompt`."""
    top_n = top_n or 0
    if not 0 <= top_n <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top_n}")
    return {"return_logprob": True, "logprob_start_len": 0 if with_prompt else -1,
            "top_logprobs_num": top_n}


def sse(payload: dict) -> str:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload)}\n\n"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


Body = TypeVar("Body", bound=StrictModel)


async def parse_body(request: Request, model: type[Body]) -> Body:
    """The request's JSON body as `model`, whatever its content type: 400 when it is not
    JSON, 422 naming each field of the wrong type, missing or unknown."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as e:
        errors = e.errors()
        where = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}"
                          for err in errors)
        if any(err["type"] == "json_invalid" for err in errors):
            raise APIError(400, f"malformed JSON body: {where}") from None
        raise APIError(422, f"invalid request: {where}") from None


class SGLangRequest(StrictModel):
    """A body whose SGLang fields this server does not implement are accepted at their
    defaults and refused by name (a 400) otherwise (`sglang_fields`); a field SGLang does not
    have stays a 422."""

    UNSUPPORTED: ClassVar[dict[str, Any]] = {}
    NO_EFFECT: ClassVar[frozenset[str]] = frozenset()
    WHAT: ClassVar[str] = "field"

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        try:
            return drop_known_fields(data, cls.UNSUPPORTED, cls.NO_EFFECT, cls.WHAT)
        except ValueError as e:  # not pydantic's: a 400 naming the field, not a 422
            raise APIError(400, str(e)) from None


class GenerateRequest(SGLangRequest):
    """Native `/generate`: exactly one of `text` and `input_ids`, each one prompt or a batch
    (a list: the answer is a list too); `sampling_params` as in SamplingParams (validated
    there, so a bad value is a 400 naming the field), one dict or one per prompt."""

    UNSUPPORTED = GENERATE_UNSUPPORTED
    NO_EFFECT = GENERATE_NO_EFFECT

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    rid: str | list[str] | None = None
    # SGLang's logprob fields (`sampling.logprobs.logprob_params`), one value or one per prompt
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    token_ids_logprob: list[int] | list[list[int]] | None = None
    return_text_in_logprobs: bool = False

    @property
    def is_batch(self) -> bool:
        return isinstance(self.text, list) or (
            isinstance(self.input_ids, list) and bool(self.input_ids)
            and isinstance(self.input_ids[0], list))

    def items(self) -> list[dict]:
        """One `submit` keyword dict per prompt (a batch's per-prompt fields checked)."""
        if not self.is_batch:
            if isinstance(self.sampling_params, list) or isinstance(self.rid, list):
                raise APIError(400, "sampling_params and rid are lists only for a batch")
            if any(isinstance(v, list) for v in (self.return_logprob, self.logprob_start_len,
                                                 self.top_logprobs_num)) or (
                    self.token_ids_logprob and isinstance(self.token_ids_logprob[0], list)):
                raise APIError(400, "logprob fields are lists only for a batch")
            return [{"text": self.text, "input_ids": self.input_ids,
                     "sampling_params": self.sampling_params, "rid": self.rid,
                     "logprob": self._logprob(0, 1)}]
        if self.stream:
            raise APIError(400, "streaming a batch (a list of prompts) is not supported by "
                                "this server; send one request per prompt")
        if self.text is not None and self.input_ids is not None:
            raise APIError(400, "give exactly one of text and input_ids")
        prompts = self.text if self.text is not None else self.input_ids
        n = len(prompts)

        def per_prompt(value: Any, name: str) -> list:
            if not isinstance(value, list):
                return [value] * n
            if len(value) != n:
                raise APIError(400, f"{name} has {len(value)} entries for {n} prompts")
            return value

        params = per_prompt(self.sampling_params, "sampling_params")
        rids = per_prompt(self.rid, "rid")
        key = "text" if self.text is not None else "input_ids"
        return [{key: p, "sampling_params": s, "rid": r, "logprob": self._logprob(i, n)}
                for i, (p, s, r) in enumerate(zip(prompts, params, rids, strict=True))]

    def _logprob(self, i: int, n: int) -> dict:
        """Prompt `i`'s logprob fields (a list gives one per prompt, as SGLang's)."""
        def pick(value: Any, name: str, nested: bool = False) -> Any:
            per_prompt = isinstance(value, list) and (not nested or (
                bool(value) and isinstance(value[0], list)))
            if not per_prompt:
                return value
            if len(value) != n:
                raise APIError(400, f"{name} has {len(value)} entries for {n} prompts")
            return value[i]

        return {"return_logprob": pick(self.return_logprob, "return_logprob"),
                "logprob_start_len": pick(self.logprob_start_len, "logprob_start_len"),
                "top_logprobs_num": pick(self.top_logprobs_num, "top_logprobs_num"),
                "token_ids_logprob": pick(self.token_ids_logprob, "token_ids_logprob", True),
                "return_text_in_logprobs": self.return_text_in_logprobs}


class StreamOptions(StrictModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class OpenAISamplingRequest(SGLangRequest):
    """Fields /v1/completions and /v1/chat/completions share (OpenAI's, then SGLang's
    extensions)."""

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float | None = 1.0
    top_p: float | None = 1.0
    n: int = 1
    frequency_penalty: float | None = 0.0
    presence_penalty: float | None = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    top_k: int | None = -1
    min_p: float | None = 0.0
    min_tokens: int = 0
    repetition_penalty: float | None = 1.0
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    rid: str | list[str] | None = None
    # structured output: OpenAI's response_format, or SGLang's grammar fields
    response_format: dict[str, Any] | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    def sampling_params(self, max_tokens: int | None) -> dict:
        """The native sampling dict of one choice (validated later by SamplingParams; null
        values take the native defaults)."""
        params = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p, "frequency_penalty": self.frequency_penalty,
                  "presence_penalty": self.presence_penalty,
                  "repetition_penalty": self.repetition_penalty,
                  "min_new_tokens": self.min_tokens, "stop": self.stop,
                  "stop_token_ids": self.stop_token_ids, "stop_regex": self.stop_regex,
                  "no_stop_trim": self.no_stop_trim, "ignore_eos": self.ignore_eos,
                  "skip_special_tokens": self.skip_special_tokens, "seed": self.seed,
                  "json_schema": self.json_schema, "regex": self.regex, "ebnf": self.ebnf}
        grammar = None if self.response_format is None else response_format_grammar(
            self.response_format)
        if grammar is not None:
            field, text = grammar
            if params.get(field) is not None:
                raise APIError(400, f"give at most one of {field} and response_format")
            params[field] = text
        if max_tokens is not None:
            params["max_new_tokens"] = max_tokens
        return params

    def check_n(self) -> None:
        if not 1 <= self.n <= MAX_N:
            raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {self.n}")

    def prompt_rids(self, num_prompts: int) -> list[str | None]:
        """SGLang's `rid` per prompt: one string for one prompt, or a list with one per prompt
        (its samples are then `rid-i`, `submit_samples`); None: ids are made up."""
        if self.rid is None or (isinstance(self.rid, str) and num_prompts == 1):
            return [self.rid] * num_prompts
        if not isinstance(self.rid, list):
            raise APIError(400, f"rid: give a list of {num_prompts} ids, one per prompt")
        if len(self.rid) != num_prompts:
            raise APIError(400, f"rid has {len(self.rid)} entries for {num_prompts} prompts")
        return list(self.rid)


    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and bool(self.stream_options.include_usage)


class CompletionRequest(OpenAISamplingRequest):
    UNSUPPORTED = COMPLETION_UNSUPPORTED
    NO_EFFECT = COMPLETION_NO_EFFECT

    prompt: str | list[int] | list[str] | list[list[int]]
    best_of: int | None = None
    echo: bool = False
    logprobs: int | None = None  # top alternatives per token (0: the chosen token's only)

    def logprob_fields(self) -> dict | None:
        """The native logprob fields (echo adds the prompt's), None without `logprobs`."""
        if self.logprobs is None:
            return None
        return native_logprob_fields("logprobs", self.logprobs, self.echo)

    def prompts(self) -> list[dict]:
        """`submit` keywords (text or input_ids) of each prompt."""
        p = self.prompt
        if isinstance(p, str):
            return [{"text": p}]
        if p and isinstance(p[0], str):
            return [{"text": t} for t in p]
        if p and isinstance(p[0], list):
            return [{"input_ids": ids} for ids in p]
        return [{"input_ids": p}]

    def to_sampling_params(self) -> dict:
        default = COMPLETIONS_DEFAULT_MAX_TOKENS
        return self.sampling_params(default if self.max_tokens is None else self.max_tokens)


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(OpenAISamplingRequest):
    UNSUPPORTED = CHAT_UNSUPPORTED
    NO_EFFECT = CHAT_NO_EFFECT

    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None

    def logprob_fields(self) -> dict | None:
        """The native logprob fields, None unless `logprobs`; top_logprobs needs logprobs."""
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true")
        if not self.logprobs:
            return None
        return native_logprob_fields("top_logprobs", self.top_logprobs, False)

    def to_sampling_params(self) -> dict:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError(400, "give at most one of max_tokens and max_completion_tokens")
        return self.sampling_params(
            self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        )


def finish_reason(reason: dict | None) -> str | None:
    """OpenAI's finish_reason from the scheduler's `{"type": ...}`."""
    return None if reason is None else reason["type"]


def total_usage(metas: list[dict], n: int) -> dict:
    """Usage of every choice of a request, prompt-major with `n` samples per prompt: each
    prompt counted once, every choice's completion tokens."""
    prompt = sum(m["prompt_tokens"] for m in metas[::n])
    completion = sum(m["completion_tokens"] for m in metas)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

"""Wire formats of the HTTP routes: request bodies, the one error shape, and SSE framing.

Bodies are strict (a string is never coerced to a number) and closed (an unknown field is an
error), so a client's typo surfaces as a 422 naming the field instead of being ignored.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from fastapi import Request
from pydantic import BaseModel, ConfigDict, ValidationError

# OpenAI's documented default for /v1/completions; chat has none (the native default applies).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
SSE_DONE = "data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that hung up before the answer

ERROR_TYPES = {401: "authentication_error", 404: "not_found_error"}


class APIError(Exception):
    """An error answered as `{"error": {"message", "type", "code"}}` with HTTP `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> dict:
    fallback = "invalid_request_error" if status < 500 else "internal_error"
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, fallback),
                      "code": status}}


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


class GenerateRequest(StrictModel):
    """Native `/generate`: exactly one of `text` and `input_ids`; `sampling_params` as in
    SamplingParams (validated there, so a bad value is a 400 naming the field)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    stream: bool = False


class StreamOptions(StrictModel):
    include_usage: bool = False


class OpenAISamplingRequest(StrictModel):
    """Fields /v1/completions and /v1/chat/completions share; `top_k` and `ignore_eos` are
    SGLang's extensions."""

    model: str | None = None  # None: the served model
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: str | list[str] | None = None
    n: int = 1
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    def sampling_params(self, max_tokens: int | None) -> dict:
        """The native sampling dict (validated later by SamplingParams)."""
        if self.n != 1:
            raise APIError(400, f"only n=1 is supported, got n={self.n}")
        params = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "stop": self.stop, "seed": self.seed, "ignore_eos": self.ignore_eos}
        if max_tokens is not None:
            params["max_new_tokens"] = max_tokens
        return params

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(OpenAISamplingRequest):
    prompt: str | list[int]

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
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens

    def to_sampling_params(self) -> dict:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise APIError(400, "give at most one of max_tokens and max_completion_tokens")
        return self.sampling_params(
            self.max_completion_tokens if self.max_tokens is None else self.max_tokens
        )


def finish_reason(reason: dict | None) -> str | None:
    """OpenAI's finish_reason from the scheduler's `{"type": ...}`."""
    return None if reason is None else reason["type"]


def usage(meta_info: dict) -> dict:
    prompt, completion = meta_info["prompt_tokens"], meta_info["completion_tokens"]
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}

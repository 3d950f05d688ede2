"""`POST /v1/chat/completions`: messages through the chat template, `n` choices, optionally
streamed as `chat.completion.chunk`s."""

from __future__ import annotations

import functools
import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from sglang_aux.srt.entrypoints.openai.api_error import APIError
from sglang_aux.srt.entrypoints.openai.openai_logprobs import chat_logprobs
from sglang_aux.srt.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    finish_reason,
    total_usage,
)
from sglang_aux.srt.entrypoints.openai.serving_base import (
    await_results,
    check_model,
    event_stream,
    last_final,
    request_id,
    submit_samples,
)
from sglang_aux.srt.managers.tokenizer.request_stream import StreamDelta
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

try:  # optional: only checkpoints that ship a chat template need it
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    jinja2 = None


def chatml(messages: list[ChatMessage]) -> str:
    """The fallback template (ChatML), ending with an open assistant turn."""
    turns = "".join(f"<|im_start|>{m.role}\n{m.text()}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def _raise(message: str) -> None:
    raise ValueError(message)


@functools.lru_cache(maxsize=4)
def _compile(template: str):
    # HF chat templates are written for these settings; the sandbox keeps a template from
    # reaching Python internals.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def _token(tokenizer: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.decode([token_id], skip_special_tokens=False)


def render_chat(tokenizer: Tokenizer, messages: list[ChatMessage]) -> str:
    """The prompt for `messages`: the tokenizer's Jinja chat template when it has one and
    jinja2 is installed, else ChatML. A template that rejects the messages is a 400."""
    if not messages:
        raise APIError(400, "messages is empty")
    if tokenizer.chat_template is None or jinja2 is None:
        return chatml(messages)
    try:
        return _compile(tokenizer.chat_template).render(
            messages=[{"role": m.role, "content": m.text()} for m in messages],
            add_generation_prompt=True,
            bos_token=_token(tokenizer, tokenizer.bos_token_id),
            eos_token=_token(tokenizer, tokenizer.eos_token_id),
        )
    except (ValueError, jinja2.TemplateError) as e:
        raise APIError(400, f"the chat template rejected the messages: {e}") from None


async def create_chat_completion(server: TokenizerManager, body: ChatCompletionRequest,
                                 request: Request) -> dict | StreamingResponse:
    model = check_model(server, body.model)
    body.check_n()
    prompt = render_chat(server.tokenizer, body.messages)
    logprob = body.logprob_fields()
    (rid,) = body.prompt_rids(1)
    streams = await submit_samples(server, {"text": prompt}, body.to_sampling_params(), body.n,
                                   rid=rid, logprob=logprob)
    head = {"id": request_id("chatcmpl", rid), "created": int(time.time()), "model": model}

    def logprobs(meta_info: dict) -> dict | None:
        return None if logprob is None else chat_logprobs(server.tokenizer, meta_info)

    if body.stream:
        started = [False] * len(streams)
        finals = [0]  # final deltas sent

        def chunks(index: int, delta: StreamDelta) -> list[dict]:
            head_chunk = {**head, "object": "chat.completion.chunk"}
            out = []
            if not started[index]:  # OpenAI opens the message with the role, then content
                started[index] = True
                out.append({**head_chunk, "choices": [
                    {"index": index, "delta": {"role": "assistant", "content": ""},
                     "finish_reason": None}]})
            pieces = logprobs(delta.logprobs)  # None unless the request asks for them
            if delta.text or (pieces is not None and pieces["content"]):
                # the logprobs of the tokens this delta brings (their text may come later)
                out.append({**head_chunk, "choices": [
                    {"index": index, "delta": {"content": delta.text}, "logprobs": pieces,
                     "finish_reason": None}]})
            if delta.output is not None:
                meta = delta.output["meta_info"]
                out.append({**head_chunk, "choices": [
                    {"index": index, "delta": {}, "logprobs": None,
                     "finish_reason": finish_reason(meta["finish_reason"])}]})
                if body.include_usage and last_final(delta, finals, len(streams)):
                    out.append({**head_chunk, "choices": [], "usage": total_usage(
                        [s.output["meta_info"] for s in streams], body.n)})
            return out

        return StreamingResponse(event_stream(server, streams, chunks),
                                 media_type="text/event-stream")
    outs = await await_results(server, streams, request)
    return {**head, "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": o["text"]},
                         "logprobs": logprobs(o["meta_info"]),
                         "finish_reason": finish_reason(o["meta_info"]["finish_reason"])}
                        for i, o in enumerate(outs)],
            "usage": total_usage([o["meta_info"] for o in outs], body.n)}

"""`POST /v1/completions`: OpenAI's text completion; `n` choices per prompt (a list of prompts
gives prompt-major choices), optionally streamed."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from sglang_aux.srt.entrypoints.openai.openai_logprobs import completion_logprobs
from sglang_aux.srt.entrypoints.openai.protocol import (
    APIError,
    CompletionRequest,
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
from sglang_aux.srt.managers.request_stream import StreamDelta
from sglang_aux.srt.managers.tokenizer_manager import TokenizerManager


def _check(body: CompletionRequest) -> None:
    body.check_n()
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, f"best_of other than n (best_of={body.best_of}, n={body.n}) is "
                            "not supported by this server: it ranks choices by logprobs")


async def create_completion(server: TokenizerManager, body: CompletionRequest,
                            request: Request) -> dict | StreamingResponse:
    model = check_model(server, body.model)
    _check(body)
    prompts = body.prompts()
    params = body.to_sampling_params()
    logprob = body.logprob_fields()
    streams = []
    for prompt in prompts:
        streams += await submit_samples(server, prompt, params, body.n, logprob=logprob)
    head = {"id": request_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": model}

    def echoed(index: int) -> str:
        if not body.echo:
            return ""
        prompt = prompts[index // body.n]
        return prompt.get("text") or server.tokenizer.decode(prompt["input_ids"])

    def choice(index: int, text: str, meta_info: dict | None) -> dict:
        """A choice (or a streamed piece of one); the logprobs of all its tokens come with
        its end (the native entries arrive with the last update)."""
        reason = logprobs = None
        if meta_info is not None:
            reason = finish_reason(meta_info["finish_reason"])
            if logprob is not None:
                logprobs = completion_logprobs(server.tokenizer, meta_info, body.echo)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    if body.stream:
        started = [False] * len(streams)
        finals = [0]  # final deltas sent

        def chunks(index: int, delta: StreamDelta) -> list[dict]:
            text = delta.text if started[index] else echoed(index) + delta.text
            started[index] = True
            meta = None if delta.output is None else delta.output["meta_info"]
            out = [{**head, "choices": [choice(index, text, meta)]}]
            if meta is not None and body.include_usage and last_final(delta, finals, len(streams)):
                out.append({**head, "choices": [], "usage": total_usage(
                    [s.output["meta_info"] for s in streams], body.n)})
            return out

        return StreamingResponse(event_stream(server, streams, chunks),
                                 media_type="text/event-stream")
    outs = await await_results(server, streams, request)
    return {**head, "choices": [choice(i, echoed(i) + o["text"], o["meta_info"])
                                for i, o in enumerate(outs)],
            "usage": total_usage([o["meta_info"] for o in outs], body.n)}


"""`POST /v1/completions`: OpenAI's text completion, one choice, optionally streamed."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from sglang_aux.srt.entrypoints.openai.protocol import CompletionRequest, finish_reason, usage
from sglang_aux.srt.entrypoints.openai.serving_base import (
    await_result,
    check_model,
    event_stream,
    request_id,
    submit_request,
)
from sglang_aux.srt.managers.request_stream import StreamDelta
from sglang_aux.srt.managers.tokenizer_manager import TokenizerManager


async def create_completion(server: TokenizerManager, body: CompletionRequest,
                            request: Request) -> dict | StreamingResponse:
    model = check_model(server, body.model)
    text, ids = (body.prompt, None) if isinstance(body.prompt, str) else (None, body.prompt)
    stream = await submit_request(server, text=text, input_ids=ids,
                                  sampling_params=body.to_sampling_params())
    head = {"id": request_id("cmpl"), "object": "text_completion", "created": int(time.time()),
            "model": model}

    def choice(text: str, meta_info: dict | None) -> dict:
        reason = None if meta_info is None else finish_reason(meta_info["finish_reason"])
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    if body.stream:
        def chunks(delta: StreamDelta) -> list[dict]:
            meta = None if delta.output is None else delta.output["meta_info"]
            out = [{**head, "choices": [choice(delta.text, meta)]}]
            if meta is not None and body.include_usage:
                out.append({**head, "choices": [], "usage": usage(meta)})
            return out

        return StreamingResponse(event_stream(server, stream, chunks),
                                 media_type="text/event-stream")
    out = await await_result(server, stream, request)
    return {**head, "choices": [choice(out["text"], out["meta_info"])],
            "usage": usage(out["meta_info"])}

"""`POST /v1/completions`: OpenAI's text completion; `n` choices per prompt (a list of prompts
gives prompt-major choices), the best `n` of `best_of` candidates, optionally streamed."""

from __future__ import annotations

import time

from fastapi import Request
from fastapi.responses import StreamingResponse

from sglang_aux.srt.entrypoints.openai.api_error import APIError
from sglang_aux.srt.entrypoints.openai.openai_logprobs import completion_logprobs
from sglang_aux.srt.entrypoints.openai.protocol import (
    CompletionRequest,
    finish_reason,
    native_logprob_fields,
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
from sglang_aux.srt.sampling.sampling_params import MAX_N


def _best_of(body: CompletionRequest) -> int:
    """Candidates generated per prompt: `best_of` (null: `n`), in [n, MAX_N]; as OpenAI, a
    stream cannot carry more candidates than it returns."""
    body.check_n()
    best_of = body.n if body.best_of is None else body.best_of
    if not body.n <= best_of <= MAX_N:
        raise APIError(400, f"best_of must be an integer in [n, {MAX_N}] (n={body.n}), "
                            f"got {best_of}")
    if body.stream and best_of > body.n:
        raise APIError(400, f"best_of (={best_of}) greater than n (={body.n}) cannot be "
                            "streamed")
    return best_of


def _mean_logprob(out: dict) -> float:
    rows = out["meta_info"]["output_token_logprobs"]
    return sum(v for v, _, _ in rows) / len(rows) if rows else 0.0


def best_candidates(outs: list[dict], best_of: int, n: int) -> list[dict]:
    """Of each prompt's `best_of` candidates (prompt-major), the `n` with the highest mean
    output token logprob (OpenAI: "the highest log probability per token"), best first;
    ties keep the candidates' order."""
    best = []
    for start in range(0, len(outs), best_of):
        group = outs[start:start + best_of]
        best += sorted(group, key=_mean_logprob, reverse=True)[:n]
    return best


async def create_completion(server: TokenizerManager, body: CompletionRequest,
                            request: Request) -> dict | StreamingResponse:
    model = check_model(server, body.model)
    best_of = _best_of(body)
    prompts = body.prompts()
    params = body.to_sampling_params()
    logprob = body.logprob_fields()
    # ranking needs the candidates' output logprobs, whether or not the client asked for them
    ranked = logprob if logprob is not None or best_of == body.n else \
        native_logprob_fields("logprobs", 0, False)
    streams = []
    for prompt, rid in zip(prompts, body.prompt_rids(len(prompts)), strict=True):
        streams += await submit_samples(server, prompt, params, best_of, rid=rid,
                                        logprob=ranked)
    head = {"id": request_id("cmpl", body.rid), "object": "text_completion",
            "created": int(time.time()), "model": model}

    def echoed(index: int) -> str:
        if not body.echo:
            return ""
        prompt = prompts[index // body.n]
        return prompt.get("text") or server.tokenizer.decode(prompt["input_ids"])

    def choice(index: int, text: str, meta_info: dict | None, logprob_meta: dict | None,
               offset: int = 0) -> dict:
        """A choice, or a streamed piece of one (its logprobs: those of the piece's tokens,
        their text_offset from `offset`); `meta_info` with its end."""
        reason = None if meta_info is None else finish_reason(meta_info["finish_reason"])
        logprobs = None
        if logprob is not None:
            logprobs = completion_logprobs(server.tokenizer, logprob_meta, body.echo, offset)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

    if body.stream:
        started = [False] * len(streams)
        offsets = [0] * len(streams)  # text_offset of each choice's next token
        finals = [0]  # final deltas sent

        def chunks(index: int, delta: StreamDelta) -> list[dict]:
            text = delta.text if started[index] else echoed(index) + delta.text
            started[index] = True
            meta = None if delta.output is None else delta.output["meta_info"]
            piece = choice(index, text, meta, delta.logprobs, offsets[index])
            if piece["logprobs"] is not None:
                offsets[index] += sum(map(len, piece["logprobs"]["tokens"]))
            out = [{**head, "choices": [piece]}]
            if meta is not None and body.include_usage and last_final(delta, finals, len(streams)):
                out.append({**head, "choices": [], "usage": total_usage(
                    [s.output["meta_info"] for s in streams], body.n)})
            return out

        return StreamingResponse(event_stream(server, streams, chunks),
                                 media_type="text/event-stream")
    outs = await await_results(server, streams, request)
    best = outs if best_of == body.n else best_candidates(outs, best_of, body.n)
    # every candidate's tokens were generated, so usage counts them all (as OpenAI bills)
    return {**head, "choices": [choice(i, echoed(i) + o["text"], o["meta_info"], o["meta_info"])
                                for i, o in enumerate(best)],
            "usage": total_usage([o["meta_info"] for o in outs], best_of)}


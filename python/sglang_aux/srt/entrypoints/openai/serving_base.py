"""What every generation route does: check the model name, submit to the scheduler process
(bad input becomes a 400), and frame a request's stream as server-sent events."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request

from sglang_aux.srt.constrained.grammar_spec import GRAMMAR_FIELDS
from sglang_aux.srt.entrypoints.openai.api_error import CLIENT_CLOSED_REQUEST, APIError, error_body
from sglang_aux.srt.entrypoints.openai.protocol import SSE_DONE, sse
from sglang_aux.srt.managers.tokenizer.request_stream import (
    RequestFailed,
    RequestStream,
    StreamDelta,
)
from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager
from sglang_aux.srt.sampling.sampling_params import MAX_N

logger = logging.getLogger(__name__)


def served_model_name(server: TokenizerManager) -> str:
    return server.server_args.served_model_name


def check_model(server: TokenizerManager, name: str | None) -> str:
    """The served model's name; 404 (as OpenAI answers) when the client asked for another.
    The model path the server was started with is accepted too."""
    served = served_model_name(server)
    if name is not None and name not in (served, server.server_args.model_path):
        raise APIError(404, f"model {name!r} not found; this server serves {served!r}")
    return served


async def submit_request(server: TokenizerManager, **kwargs) -> RequestStream:
    """`TokenizerManager.submit`, with a validation failure as a 400 that says why."""
    try:
        return await server.submit(**kwargs)
    except ValueError as e:
        raise APIError(400, str(e)) from None


async def submit_samples(server: TokenizerManager, prompt: dict, sampling_params: dict | None,
                         n: int, rid: str | None = None, logprob: dict | None = None
                         ) -> list[RequestStream]:
    """`n` samples of one prompt (`prompt`: text or input_ids) as `n` requests. With the
    prefix cache on and n > 1 the prompt is prefilled once first, by a request that outputs
    nothing, so the samples map its cached K/V instead of each prefilling it. A given seed
    seeds sample i with seed + i (else the samples would be equal)."""
    params = dict(sampling_params or {})
    params.pop("n", None)
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_N:
        raise APIError(400, f"n must be an integer in [1, {MAX_N}], got {n!r}")
    if n > 1 and server.spec.radix_cache:
        # the warm-up samples nothing: no grammar to compile for it
        warm = {**params, "max_new_tokens": 0, "min_new_tokens": 0,
                **dict.fromkeys(GRAMMAR_FIELDS)}
        await (await submit_request(server, **prompt, sampling_params=warm)).result()
    seed = params.get("seed", params.get("sampling_seed"))
    streams: list[RequestStream] = []
    try:
        for i in range(n):
            one = params if n == 1 or not isinstance(seed, int) else {
                **{k: v for k, v in params.items() if k != "sampling_seed"}, "seed": seed + i}
            streams.append(await submit_request(
                server, **prompt, sampling_params=one, logprob=logprob,
                rid=rid if n == 1 or rid is None else f"{rid}-{i}"))
    except BaseException:
        for stream in streams:
            server.abort(stream.rid)
        raise
    return streams


def request_id(prefix: str, rid: str | list[str] | None = None) -> str:
    """A response's `id`: the request's own `rid` where it gives one string (SGLang's)."""
    return rid if isinstance(rid, str) else f"{prefix}-{uuid.uuid4().hex}"


async def _client_gone(request: Request) -> None:
    # The body is read already, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def await_results(server: TokenizerManager, streams: list[RequestStream],
                        request: Request) -> list[dict]:
    """The requests' output dicts. A scheduler failure is a 500; a client that hangs up
    first aborts the requests (its answer, 499, reaches nobody)."""
    results = asyncio.ensure_future(asyncio.gather(*(s.result() for s in streams)))
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not results.done():
            raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the connection")
        return results.result()
    except RequestFailed as e:
        raise APIError(500, str(e)) from None
    finally:
        gone.cancel()
        if not results.done():
            results.cancel()
        _abort_unfinished(server, streams)


def _abort_unfinished(server: TokenizerManager, streams: list[RequestStream]) -> None:
    for stream in streams:
        if not stream.finished:
            logger.debug("client of %s went away; aborting", stream.rid)
            server.abort(stream.rid)


async def _deltas(streams: list[RequestStream]) -> AsyncIterator[tuple[int, StreamDelta]]:
    """(stream index, delta) as they come; one stream is iterated directly."""
    if len(streams) == 1:
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((i, delta, None))
        except RequestFailed as e:
            queue.put_nowait((i, None, e))
        queue.put_nowait((i, None, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, delta, error = await queue.get()
            if error is not None:
                raise error
            if delta is None:
                left -= 1
            else:
                yield i, delta
    finally:
        for task in tasks:
            task.cancel()


async def event_stream(server: TokenizerManager, streams: list[RequestStream],
                       chunks: Callable[[int, StreamDelta], list[dict]]) -> AsyncIterator[str]:
    """SSE events: `chunks(index, delta)` for every delta of each stream, then `[DONE]`. A
    scheduler failure ends the stream with an error event; a client that goes away aborts
    the requests."""
    try:
        async for i, delta in _deltas(streams):
            for chunk in chunks(i, delta):
                yield sse(chunk)
        yield SSE_DONE
    except RequestFailed as e:
        yield sse(error_body(500, str(e)))
        yield SSE_DONE
    finally:
        # NOTE: no yield past this point: a closed generator must not yield again.
        _abort_unfinished(server, streams)


def last_final(delta: StreamDelta, finals: list[int], num_streams: int) -> bool:
    """Whether `delta` is the last of `num_streams` streams' final deltas (the usage chunk
    follows it); `finals[0]` counts them."""
    if delta.output is None:
        return False
    finals[0] += 1
    return finals[0] == num_streams

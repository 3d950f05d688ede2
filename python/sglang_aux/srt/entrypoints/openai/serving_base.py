"""What every generation route does: check the model name, submit to the scheduler process
(bad input becomes a 400), and frame a request's stream as server-sent events."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import Request

from sglang_aux.srt.entrypoints.openai.protocol import (
    CLIENT_CLOSED_REQUEST,
    SSE_DONE,
    APIError,
    error_body,
    sse,
)
from sglang_aux.srt.managers.request_stream import RequestFailed, RequestStream, StreamDelta
from sglang_aux.srt.managers.tokenizer_manager import TokenizerManager

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


def request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def _client_gone(request: Request) -> None:
    # The body is read already, so the next ASGI message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def await_result(server: TokenizerManager, stream: RequestStream,
                       request: Request) -> dict:
    """The request's output dict. A scheduler failure is a 500; a client that hangs up
    first aborts the request (its answer, 499, reaches nobody)."""
    result = asyncio.ensure_future(stream.result())
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not result.done():
            raise APIError(CLIENT_CLOSED_REQUEST, "the client closed the connection")
        return result.result()
    except RequestFailed as e:
        raise APIError(500, str(e)) from None
    finally:
        gone.cancel()
        if not stream.finished:
            result.cancel()
            logger.debug("client of %s went away; aborting", stream.rid)
            server.abort(stream.rid)


async def event_stream(server: TokenizerManager, stream: RequestStream,
                       chunks: Callable[[StreamDelta], list[dict]]) -> AsyncIterator[str]:
    """SSE events: `chunks(delta)` for every delta, then `[DONE]`. A scheduler failure ends
    the stream with an error event; a client that goes away aborts the request."""
    try:
        async for delta in stream:
            for chunk in chunks(delta):
                yield sse(chunk)
        yield SSE_DONE
    except RequestFailed as e:
        yield sse(error_body(500, str(e)))
        yield SSE_DONE
    finally:
        # NOTE: no yield past this point: a closed generator must not yield again.
        if not stream.finished:
            logger.debug("client of %s went away; aborting", stream.rid)
            server.abort(stream.rid)

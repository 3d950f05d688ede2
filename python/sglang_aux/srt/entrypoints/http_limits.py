"""What one client may hold of the HTTP server: a bounded request head, read in bounded time,
a bounded body that may not stall, and idle keep-alive connections that close.

uvicorn's httptools protocol bounds none of the first three (its `h11_max_incomplete_event_size`
applies to h11 only, and its keep-alive timeout starts only after a response), so a client
could send endless headers or hold a socket open by sending nothing (slowloris).
`bounded_http_protocol` adds both bounds to it; `BodyLimitMiddleware` bounds the body, raising
from `receive` so that the route answers 413 or 408 as any error, then closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
from asyncio import TimerHandle

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sglang_aux.srt.entrypoints.openai.api_error import APIError

logger = logging.getLogger(__name__)

# a prompt's character escaped in JSON takes at most this many bytes (an escaped surrogate
# pair, `\ud83d\ude00`); plus room for the rest of the body (sampling parameters, roles)
JSON_BYTES_PER_CHAR = 12
BODY_HEADROOM_BYTES = 1 << 20
CLOSE_AFTER = frozenset({408, 413})  # the client may still be sending: do not read on


def default_body_limit(max_prompt_chars: int) -> int:
    """Bytes of the largest body that can carry a prompt the context can hold."""
    return max_prompt_chars * JSON_BYTES_PER_CHAR + BODY_HEADROOM_BYTES


class BodyLimitMiddleware:
    """A request body over `max_bytes` (announced by Content-Length, or counted as it arrives)
    is refused with 413, and one that pauses longer than `read_timeout_s` with 408."""

    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout_s: float):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        received, body_done = 0, False
        too_large = f"request body over {self.max_bytes} bytes (--max-request-body-bytes)"

        async def bounded_receive() -> Message:
            nonlocal received, body_done
            if body_done:  # a route waiting for the disconnect: no bound
                return await receive()
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise APIError(413, too_large)
            try:
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                raise APIError(408, f"request body stalled for over {self.read_timeout_s:g} s "
                                    "(--timeout-request-read)") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise APIError(413, too_large)
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, bounded_receive, send)


class _BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with a request head of at most `max_head_bytes` (431
    past it) that must arrive within `read_timeout_s` of the connection or of its first byte
    (an idle or trickling connection is closed, with 408 once a head has begun)."""

    max_head_bytes: int
    read_timeout_s: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._reading_head = True  # until a request's head is complete, and after its answer
        self._head_bytes = 0
        self._head_timer: TimerHandle | None = self.loop.call_later(
            self.read_timeout_s, self._head_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            self._head_bytes += len(data)
            if self._head_timer is None:  # the first byte after a keep-alive wait
                self._head_timer = self.loop.call_later(self.read_timeout_s,
                                                        self._head_timed_out)
        super().data_received(data)
        if (self._reading_head and self._head_bytes > self.max_head_bytes
                and not self.transport.is_closing()):
            logger.warning("%s: request head over %d bytes; refused (431)",
                           peer(self.client), self.max_head_bytes)
            self._refuse(431, "Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._cancel_head_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        cycle = self.cycle  # the answered request's, unless a pipelined one follows
        unread_body = cycle is not None and cycle.response_complete and cycle.more_body
        super().on_response_complete()
        self._reading_head, self._head_bytes = True, 0
        if unread_body and not self.transport.is_closing():
            # the rest of its body would be read only to be dropped, for as long as the
            # client cares to trickle it
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._reading_head:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a request is being answered; the keep-alive timeout follows it
        logger.debug("%s: no request head within %g s; closing", peer(self.client),
                     self.read_timeout_s)
        if self._head_bytes:
            self._refuse(408, "Request Timeout")
        else:
            self.transport.close()

    def _refuse(self, status: int, reason: str) -> None:
        self.transport.write(f"HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\n"
                             "connection: close\r\n\r\n".encode())
        self.transport.close()


def peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"


def bounded_http_protocol(max_head_bytes: int, read_timeout_s: float
                          ) -> type[HttpToolsProtocol]:
    """uvicorn's `http=` protocol class with these bounds."""
    return type("BoundedHttpToolsProtocol", (_BoundedHttpToolsProtocol,),
                {"max_head_bytes": max_head_bytes, "read_timeout_s": read_timeout_s})

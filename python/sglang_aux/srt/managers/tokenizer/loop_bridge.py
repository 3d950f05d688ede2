"""The asyncio bridge: the requests and replies the event loops wait for, and how the reader
thread hands them what the scheduler sent.

Event loops register a request (its `RequestStream`) or a reply future; the reader thread
posts each step's updates to their loops in one `call_soon_threadsafe` per loop, so a loop
wakes once a step. Once the scheduler process is gone (`close`), every waiting request and
reply fails with the reason, and so does every later registration.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from sglang_aux.srt.managers.io_struct import RequestOut
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.tokenizer.request_stream import RequestStream, RequestUpdate
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerGone
from sglang_aux.srt.managers.tokenizer.server_metrics import ServerMetrics

logger = logging.getLogger(__name__)


@dataclass
class _Live:
    """A submitted request, until it finishes, fails or its abort is confirmed."""

    req: Req
    stream: RequestStream
    loop: asyncio.AbstractEventLoop  # the event loop that waits on `stream`
    start: float = field(default_factory=time.perf_counter)
    received: int = 0  # output tokens so far


class LoopBridge:
    def __init__(self, metrics: ServerMetrics):
        self.metrics = metrics
        self.error: str | None = None  # why nothing can be served any more
        self._live: dict[str, _Live] = {}  # added on an event loop, removed by the reader
        self._replies: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._reply_ids = itertools.count()
        self._lock = threading.Lock()  # `error` against new entries in `_live`, `_replies`

    # ---- on an event loop ----

    def add(self, req: Req, stream: RequestStream) -> None:
        """Wait for `req`'s updates on `stream`, on the running loop (ValueError when a live
        request has its rid; SchedulerGone once the scheduler process is gone)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check_alive()
            if req.rid in self._live:
                raise ValueError(f"rid {req.rid!r} is already in use by a running request")
            self._live[req.rid] = _Live(req, stream, loop)

    def discard(self, rid: str) -> None:
        """Forget a request that was never sent."""
        self._live.pop(rid, None)

    def new_reply(self) -> tuple[int, asyncio.Future]:
        """A reply id and the future its `Reply` resolves, on the running loop."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        with self._lock:
            self._check_alive()
            reply_id = next(self._reply_ids)
            self._replies[reply_id] = (loop, answer)
        return reply_id, answer

    def _check_alive(self) -> None:
        if self.error is not None:
            raise SchedulerGone(self.error)

    # ---- in the reader thread ----

    def on_step(self, updates: list[RequestOut]) -> None:
        outbox: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestUpdate]]] = {}
        for out in updates:
            live = self._live.get(out.rid)
            if live is None:  # aborted meanwhile
                continue
            live.received += len(out.new_ids)
            finished = out.finished
            if finished is not None:
                del self._live[out.rid]
                self.metrics.add(requests_finished=1,
                                 prompt_tokens=len(live.req.origin_input_ids),
                                 generation_tokens=live.received,
                                 spec_verify_ct=finished.spec_verify_ct,
                                 spec_accepted_tokens=finished.spec_accepted_tokens,
                                 spec_verify_tokens=finished.spec_verify_tokens)
                logger.debug("finished %s: %d prompt + %d output tokens, %s, %.3f s", out.rid,
                             len(live.req.origin_input_ids), live.received,
                             finished.finished_reason, time.perf_counter() - live.start)
            outbox.setdefault(live.loop, []).append(
                (live.stream, RequestUpdate(out.new_ids, finished, logprobs=out.logprobs)))
        for loop, batch in outbox.items():
            _post(loop, _put_all, batch)

    def fail(self, rids: list[str], reason: str) -> None:
        for rid in rids:
            live = self._live.pop(rid, None)
            if live is not None:
                self.metrics.add(requests_failed=1)
                _post(live.loop, live.stream.queue.put_nowait, RequestUpdate([], error=reason))

    def aborted(self, rid: str) -> None:
        if self._live.pop(rid, None) is not None:
            self.metrics.add(requests_aborted=1)

    def reply(self, reply_id: int, value: object) -> None:
        loop, answer = self._replies.pop(reply_id)
        _post(loop, _resolve, answer, value)

    def close(self, reason: str) -> int:
        """Fail every waiting request and reply, and every later one, with `reason`; the
        number of requests failed."""
        with self._lock:
            self.error = reason
            replies, self._replies = self._replies, {}
        failed = len(self._live)
        self.fail(list(self._live), reason)
        for loop, answer in replies.values():
            _post(loop, _resolve, answer, None, RuntimeError(reason))
        return failed


def _post(loop: asyncio.AbstractEventLoop, callback, *args) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop has closed: nobody is waiting any more
        pass


def _put_all(updates: list[tuple[RequestStream, RequestUpdate]]) -> None:
    for stream, update in updates:
        stream.queue.put_nowait(update)


def _resolve(answer: asyncio.Future, value, error: BaseException | None = None) -> None:
    if answer.done():  # its caller was cancelled
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(value)

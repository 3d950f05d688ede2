"""The scheduler loop in one background thread, bridged to an asyncio event loop.

The thread owns the Engine: it builds it (so loading, graph capture and every replay run on
one thread), takes new requests from a queue between steps, runs `scheduler.step()` while
there is work, and posts each request's new tokens back through
`loop.call_soon_threadsafe` into that request's `asyncio.Queue`: one call per step for all of
its updates, so the event loop wakes once a step, not once per request. Requests that arrive while
others decode join the running batch at the next step (continuous batching). The event loop
runs no model work: it only validates (`Engine.make_request`, which reads the scheduler's
limits, never its queues), hands prompts to tokenizer threads and decodes text
(`RequestStream`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.request_stream import RequestStream, RequestUpdate
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

THROUGHPUT_WINDOW = 40  # steps per throughput figure (SGLang's decode log interval)
TOKENIZER_THREADS = 4


@dataclass
class ServerMetrics:
    """Counters for /metrics. Written from the scheduler thread and the event loop."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_failed: int = 0  # rejected as bad input, or failed in the scheduler
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    last_gen_throughput: float = 0.0  # output tokens/s over the latest THROUGHPUT_WINDOW steps
    _window_tokens: int = field(default=0, repr=False)
    _window_seconds: float = field(default=0.0, repr=False)
    _window_steps: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self, name, getattr(self, name) + n)

    def record_step(self, tokens: int, seconds: float) -> None:
        """A scheduler step that emitted `tokens` output tokens in `seconds`."""
        if self._window_steps >= THROUGHPUT_WINDOW:
            self._window_tokens, self._window_seconds, self._window_steps = 0, 0.0, 0
        self._window_tokens += tokens
        self._window_seconds += seconds
        self._window_steps += 1
        self.last_gen_throughput = self._window_tokens / max(self._window_seconds, 1e-9)

    def mean_accept_length(self) -> float:
        """Tokens per verify step over every finished speculative request (0: none)."""
        return self.spec_accepted_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0


_Update = tuple[RequestStream, RequestUpdate]


@dataclass
class _Live:
    """Thread-side record of a submitted request."""

    req: Req
    stream: RequestStream
    loop: asyncio.AbstractEventLoop  # the event loop that waits on `stream`
    start: float
    sent: int = 0  # output tokens delivered so far


class SchedulerThread:
    """Runs `Engine(server_args)` in one daemon thread; `start()` waits until it is ready."""

    def __init__(self, server_args: ServerArgs):
        self.server_args = server_args
        self.engine: Engine | None = None
        self.metrics = ServerMetrics()
        self._inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # touched by the thread only
        self._emitted = 0  # output tokens delivered, thread only
        # updates of the current step per event loop, posted together after it (thread only)
        self._outbox: dict[asyncio.AbstractEventLoop, list[_Update]] = {}
        self._tokenize = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> Engine:
        """Build the Engine in the thread and return it; re-raises a startup failure."""
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error
        return self.engine

    async def submit(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | None = None) -> RequestStream:
        """Validate and queue a request (ValueError with the reason); event loop only. A
        prompt's text is tokenized on a pool thread (the tokenizer releases the GIL): the
        event loop serves other requests meanwhile, and concurrent prompts tokenize in
        parallel."""
        if text is not None and input_ids is None:
            loop = asyncio.get_running_loop()
            input_ids = await loop.run_in_executor(self._tokenize, self.engine.tokenizer.encode,
                                                   text)
            text = None
        req = self.engine.make_request(text=text, input_ids=input_ids,
                                       sampling_params=sampling_params)
        stream = RequestStream(self.engine, req)
        self.metrics.add(requests_total=1)
        live = _Live(req, stream, asyncio.get_running_loop(), time.perf_counter())
        self._inbox.put(("add", live))
        return stream

    def abort(self, rid: str) -> None:
        """Drop a request whose client went away (a no-op once it has finished)."""
        self._inbox.put(("abort", rid))

    async def flush_cache(self) -> int | None:
        """`Scheduler.flush_cache` between steps: slots freed, None when busy; event loop
        only."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int | None] = loop.create_future()

        def reply(freed: int | None) -> None:
            loop.call_soon_threadsafe(done.set_result, freed)

        self._inbox.put(("flush_cache", reply))
        return await done

    def shutdown(self, timeout: float = 10.0) -> None:
        self._tokenize.shutdown(wait=False)
        self._inbox.put(("stop",))
        self._thread.join(timeout)

    def num_queued(self) -> int:
        """Requests waiting for admission, including those not yet taken from the inbox."""
        return self._inbox.qsize() + len(self.engine.scheduler.waiting)

    # ---- everything below runs in the scheduler thread ----

    def _run(self) -> None:
        # grad mode is per thread: set it here, where all the torch work happens
        with torch.no_grad():
            try:
                self.engine = Engine(self.server_args)
            except BaseException as e:  # handed to start(), which re-raises it
                self._startup_error = e
                self._ready.set()
                return
            self.engine.scheduler.on_update = self._on_update
            self._ready.set()
            while self._take_commands(block=not self.engine.scheduler.has_work()):
                if self.engine.scheduler.has_work():
                    self._step()

    def _take_commands(self, block: bool) -> bool:
        """Apply queued commands (waiting for one when idle); False once told to stop."""
        try:
            cmd = self._inbox.get(block=block)
            while True:
                if cmd[0] == "stop":
                    return False
                if cmd[0] == "add":
                    self._live[cmd[1].req.rid] = cmd[1]
                    self.engine.scheduler.add_request(cmd[1].req)
                elif cmd[0] == "flush_cache":
                    cmd[1](self.engine.scheduler.flush_cache())
                else:
                    self._abort(cmd[1])
                cmd = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _step(self) -> None:
        start, emitted = time.perf_counter(), self._emitted
        try:
            self.engine.scheduler.step()
            self.metrics.record_step(self._emitted - emitted, time.perf_counter() - start)
        except Exception as e:
            # Keep serving: fail what was in flight and start from an empty scheduler.
            logger.exception("scheduler step failed; failing %d requests", len(self._live))
            self.engine.scheduler.in_flight = None  # its requests are failed below
            for rid, live in list(self._live.items()):
                self._drop(live.req)
                del self._live[rid]
                self.metrics.add(requests_failed=1)
                self._post(live, RequestUpdate([], error=f"internal error: {e!r}"))
            # the failed step may have left unwritten K/V under the dropped requests' kv_len
            self.engine.scheduler.flush_cache()
        self._flush()

    def _abort(self, rid: str) -> None:
        live = self._live.pop(rid, None)
        if live is not None:
            self._drop(live.req)
            self.metrics.add(requests_aborted=1)
            logger.debug("aborted %s after %d tokens", rid, len(live.req.output_ids))

    def _drop(self, req: Req) -> None:
        """Take `req` out of the scheduler and give back its KV, between steps."""
        self.engine.scheduler.abort(req)

    def _on_update(self, req: Req) -> None:
        live = self._live.get(req.rid)
        if live is None:  # aborted earlier
            return
        new_ids = req.output_ids[live.sent:]
        live.sent = len(req.output_ids)
        self._emitted += len(new_ids)
        if req.finished:
            del self._live[req.rid]
            self.metrics.add(requests_finished=1, prompt_tokens=len(req.origin_input_ids),
                             generation_tokens=len(req.output_ids),
                             spec_verify_ct=req.spec_verify_ct,
                             spec_accepted_tokens=req.spec_accepted_tokens)
            logger.debug("finished %s: %d prompt + %d output tokens, %s, %.3f s", req.rid,
                         len(req.origin_input_ids), len(req.output_ids), req.finished_reason,
                         time.perf_counter() - live.start)
        self._post(live, RequestUpdate(new_ids, req if req.finished else None))

    def _post(self, live: _Live, update: RequestUpdate) -> None:
        self._outbox.setdefault(live.loop, []).append((live.stream, update))

    def _flush(self) -> None:
        """Hand the step's updates to their event loops, one callback per loop."""
        for loop, updates in self._outbox.items():
            try:
                loop.call_soon_threadsafe(_put_all, updates)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass
        self._outbox = {}


def _put_all(updates: list[_Update]) -> None:
    for stream, update in updates:
        stream.queue.put_nowait(update)

"""The HTTP front end's side of the scheduler process (SGLang's TokenizerManager).

`start()` spawns the process that builds and runs the Engine (`scheduler_process`) and waits
for its `EngineSpec`. On the event loop, `submit` refuses a prompt with more characters than
the context could hold, then tokenizes it on a pool thread (the tokenizer releases the GIL),
validates it against the engine's limits with the Engine's own checks and seeds
(`RequestFactory`), and sends it; text is decoded here too
(`RequestStream`). A reader thread receives the scheduler's messages and posts each step's
updates to their event loops in one `call_soon_threadsafe` per loop, so a loop wakes once a
step. If the scheduler process dies, `alive` turns false at once (its pipe closes), every
waiting request fails with the reason, and so does every later one; then
`on_scheduler_exit` is called (the HTTP server exits, so that a supervisor restarts it).
Under tensor parallelism the scheduler process is rank 0 and this side also starts the node's
follower ranks (`tp_ranks.py`); a follower that exits ends the scheduler process too (rank 0
may be waiting on it inside a collective), with the same consequences and the rank named.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess

from sglang_aux.srt.managers.io_struct import EngineSpec, RequestOut
from sglang_aux.srt.managers.request_factory import RequestFactory
from sglang_aux.srt.managers.request_stream import RequestStream, RequestUpdate
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler_process import run_scheduler_process
from sglang_aux.srt.managers.server_metrics import ServerMetrics
from sglang_aux.srt.managers.serving_engine import EngineFactory
from sglang_aux.srt.managers.tp_ranks import (
    node_ranks,
    start_followers,
    stop_followers,
    with_rendezvous,
)
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

TOKENIZER_THREADS = 4
STOP_TIMEOUT_S = 10.0  # for the scheduler process to leave its loop before it is terminated


class SchedulerGone(RuntimeError):
    """The scheduler process has exited: nothing can be served any more."""


@dataclass
class _Live:
    """A submitted request, until it finishes, fails or its abort is confirmed."""

    req: Req
    stream: RequestStream
    loop: asyncio.AbstractEventLoop  # the event loop that waits on `stream`
    start: float = field(default_factory=time.perf_counter)
    received: int = 0  # output tokens so far


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, make_engine: EngineFactory):
        """`make_engine` builds the engine in the scheduler process (the server passes
        `entrypoints.engine.Engine`): a module-level callable, pickled there by reference."""
        server_args = with_rendezvous(server_args)  # every rank is given the same address
        self.server_args = server_args  # replaced by the engine's resolved ones at start()
        self.metrics = ServerMetrics()
        self.spec: EngineSpec | None = None
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot run in a forked child
        child_commands, self._commands = ctx.Pipe(duplex=False)
        self._outputs, child_outputs = ctx.Pipe(duplex=False)
        tp_ranks = node_ranks(server_args)
        self._process = ctx.Process(
            target=run_scheduler_process, name="sglang_aux-scheduler", daemon=True,
            args=(server_args, child_commands, child_outputs, make_engine,
                  tp_ranks[0] if server_args.tp_size > 1 else None))
        self._make_engine = make_engine
        self._followers: list[BaseProcess] = []  # this node's other TP ranks, once started
        self._follower_exit: str | None = None  # why a follower ended the scheduler
        self._child_ends = (child_commands, child_outputs)
        self._tokenize = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")
        self._live: dict[str, _Live] = {}  # added on an event loop, removed by the reader
        self._replies: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._reply_ids = itertools.count()
        self._error: str | None = None  # why nothing can be served any more
        self._stopping = False  # shutdown() was called: the process is meant to exit
        self._gone = threading.Event()  # the scheduler process's pipe closed: it exited
        # called in the reader thread once an unexpected exit has failed every request
        self.on_scheduler_exit: Callable[[], None] | None = None
        self._lock = threading.Lock()  # `_error` against new entries in `_live`, `_replies`
        self._send_lock = threading.Lock()
        self._reap_lock = threading.Lock()  # see _wait_exit
        self._reader = threading.Thread(target=self._read, name="scheduler-reader", daemon=True)

    @property
    def tokenizer(self) -> Tokenizer:
        return self.spec.tokenizer

    @property
    def alive(self) -> bool:
        """Whether the scheduler process can still serve: false from the moment it exits."""
        return not self._gone.is_set()

    @property
    def scheduler_pid(self) -> int | None:
        return self._process.pid

    def start(self) -> EngineSpec:
        """Start the scheduler process and wait until its engine is built; re-raises its
        startup failure (the child's traceback in the exception's notes)."""
        self._process.start()
        for end in self._child_ends:  # the child's now: EOF here once it exits
            end.close()
        self._start_followers()
        try:
            msg = self._outputs.recv()
        except EOFError:
            stop_followers(self._followers)
            cause = f"{self._follower_exit}, so " if self._follower_exit else ""
            raise SchedulerGone(f"{cause}the scheduler process exited (exit code "
                                f"{self._wait_exit(None)}) before its engine was ready"
                                ) from None
        if msg[0] == "startup_error":
            _, error, text = msg
            self._wait_exit(STOP_TIMEOUT_S)
            stop_followers(self._followers)
            error.add_note(f"raised in the scheduler process:\n{text}")
            raise error
        self.spec = spec = msg[1]
        self.server_args = spec.server_args
        self.requests = RequestFactory(spec.tokenizer, spec.limits, spec.vocab_size,
                                       spec.server_args.random_seed)
        self._reader.start()
        return spec

    def _start_followers(self) -> None:
        """The node's tensor-parallel ranks after its first (the scheduler process's), watched
        from now on: one that fails while rank 0 starts would otherwise leave it waiting in a
        collective until `--dist-timeout`."""
        ranks = node_ranks(self.server_args)[1:]
        if self.server_args.tp_size > 1 and ranks:
            self._followers = start_followers(self.server_args, self._make_engine, ranks)
            threading.Thread(target=self._watch_followers, name="tp-follower-watch",
                             daemon=True).start()

    def _watch_followers(self) -> None:
        """Wait for a follower to exit; unless shutting down, end the scheduler process (the
        reader then fails every request, naming the rank)."""
        by_sentinel = {p.sentinel: p for p in self._followers}
        gone = by_sentinel[wait(list(by_sentinel))[0]]
        gone.join()
        if self._stopping:
            return
        self._follower_exit = (f"tensor-parallel rank process {gone.name} (pid {gone.pid}) "
                               f"exited with code {gone.exitcode}")
        logger.error("%s; stopping the scheduler process", self._follower_exit)
        self._process.terminate()

    async def submit(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | None = None,
                     rid: str | None = None, logprob: dict | None = None) -> RequestStream:
        """Validate and send a request (ValueError with the reason); event loop only. A
        prompt's text is tokenized on a pool thread: the event loop serves other requests
        meanwhile, and concurrent prompts tokenize in parallel. `rid`: the client's request
        id (a 400 while another live request has it), else a fresh one."""
        loop = asyncio.get_running_loop()
        if text is not None and input_ids is None:
            self.requests.limits.validate_text(text)  # before the pool spends time on it
            input_ids = await loop.run_in_executor(self._tokenize, self.tokenizer.encode, text)
            text = None
        if rid is not None and not isinstance(rid, str):
            raise ValueError(f"rid must be a string, got {rid!r}")
        req = self.requests.make(text=text, input_ids=input_ids,
                                 sampling_params=sampling_params, rid=rid, logprob=logprob)
        stream = RequestStream(self.tokenizer, req)
        self.metrics.add(requests_total=1)
        with self._lock:
            self._check_alive()
            if req.rid in self._live:
                raise ValueError(f"rid {req.rid!r} is already in use by a running request")
            self._live[req.rid] = _Live(req, stream, loop)
        try:
            self._send(("add", req.rid, req.origin_input_ids, req.sampling_params, req.seed,
                        req.logprob))
        except SchedulerGone:
            self._live.pop(req.rid, None)
            raise
        return stream

    def abort(self, rid: str) -> None:
        """Drop a request whose client went away (a no-op once it has finished)."""
        try:
            self._send(("abort", rid))
        except SchedulerGone:  # so is the request
            pass

    async def flush_cache(self) -> int | None:
        """`Scheduler.flush_cache` between steps: slots freed, None when busy."""
        return await self._ask("flush_cache")

    async def engine_info(self) -> dict:
        """The scheduler process's figures (`scheduler_info.engine_info`), read between steps."""
        return await self._ask("info")

    def shutdown(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the scheduler process (terminated if it does not stop in `timeout`)."""
        self._tokenize.shutdown(wait=False)
        self._stopping = True
        if self._process.pid is None:  # never started
            return
        try:
            self._send(("stop",))
        except SchedulerGone:
            pass
        code = self._wait_exit(timeout)
        if code is None:
            logger.warning("the scheduler process did not stop in %.0f s; terminating", timeout)
            self._process.terminate()
            code = self._wait_exit(timeout)
        if code is None:
            self._process.kill()
            code = self._wait_exit(None)
        logger.info("the scheduler process stopped (exit code %s)", code)
        stop_followers(self._followers)

    def _wait_exit(self, timeout: float | None) -> int | None:
        """Join the scheduler process; its exit code, or None while it runs. The reader thread
        (on EOF) and shutdown() both wait for it, and of two concurrent waitpid calls one gets
        ECHILD, which multiprocessing reports as still running: they take turns."""
        with self._reap_lock:
            self._process.join(timeout)
            return self._process.exitcode

    async def _ask(self, kind: str):
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        with self._lock:
            self._check_alive()
            reply_id = next(self._reply_ids)
            self._replies[reply_id] = (loop, answer)
        self._send((kind, reply_id))
        return await answer

    def _check_alive(self) -> None:
        if self._error is not None:
            raise SchedulerGone(self._error)

    def _send(self, msg: tuple) -> None:
        with self._send_lock:
            try:
                self._commands.send(msg)
            except OSError:  # the scheduler process closed its end: it is gone
                raise SchedulerGone(self._error or "the scheduler process is gone") from None

    # ---- everything below runs in the reader thread ----

    def _read(self) -> None:
        try:
            while True:
                msg = self._outputs.recv()
                if msg[0] == "step":
                    self._on_step(msg[1])
                elif msg[0] == "failed":
                    self._fail(msg[1], msg[2])
                elif msg[0] == "aborted":
                    if self._live.pop(msg[1], None) is not None:
                        self.metrics.add(requests_aborted=1)
                else:
                    loop, answer = self._replies.pop(msg[1])
                    _post(loop, _resolve, answer, msg[2])
        except (EOFError, OSError):  # the scheduler process exited
            pass
        self._gone.set()
        code = self._wait_exit(STOP_TIMEOUT_S)
        reason = (f"the scheduler process exited (exit code {code}); this "
                  "server cannot run requests any more")
        if self._follower_exit is not None:
            reason = f"{self._follower_exit}, so {reason}"
        with self._lock:
            self._error = reason
            replies, self._replies = self._replies, {}
        if self._live or not self._stopping:
            logger.log(logging.INFO if self._stopping else logging.ERROR,
                       "%s; failing %d requests", reason, len(self._live))
        self._fail(list(self._live), reason)
        for loop, answer in replies.values():
            _post(loop, _resolve, answer, None, RuntimeError(reason))
        if not self._stopping and self.on_scheduler_exit is not None:
            self.on_scheduler_exit()

    def _on_step(self, updates: list[RequestOut]) -> None:
        outbox: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestUpdate]]] = {}
        for rid, new_ids, logprobs, finished in updates:
            live = self._live.get(rid)
            if live is None:  # aborted meanwhile
                continue
            live.received += len(new_ids)
            if finished is not None:
                del self._live[rid]
                self.metrics.add(requests_finished=1,
                                 prompt_tokens=len(live.req.origin_input_ids),
                                 generation_tokens=live.received,
                                 spec_verify_ct=finished.spec_verify_ct,
                                 spec_accepted_tokens=finished.spec_accepted_tokens,
                                 spec_verify_tokens=finished.spec_verify_tokens)
                logger.debug("finished %s: %d prompt + %d output tokens, %s, %.3f s", rid,
                             len(live.req.origin_input_ids), live.received,
                             finished.finished_reason, time.perf_counter() - live.start)
            outbox.setdefault(live.loop, []).append(
                (live.stream, RequestUpdate(new_ids, finished, logprobs=logprobs)))
        for loop, batch in outbox.items():
            _post(loop, _put_all, batch)

    def _fail(self, rids: list[str], reason: str) -> None:
        for rid in rids:
            live = self._live.pop(rid, None)
            if live is not None:
                self.metrics.add(requests_failed=1)
                _post(live.loop, live.stream.queue.put_nowait, RequestUpdate([], error=reason))


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

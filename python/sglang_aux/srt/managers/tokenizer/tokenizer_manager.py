"""The HTTP front end's side of the scheduler process (SGLang's TokenizerManager).

`start()` starts the scheduler process and its follower ranks (`SchedulerHandle`) and waits
for the engine's `EngineSpec`. On the event loop, `submit` refuses a prompt with more
characters than the context could hold, then tokenizes it on a pool thread (the tokenizer
releases the GIL), validates it against the engine's limits with the Engine's own checks and
seeds (`RequestFactory`), and sends it as an `AddRequest`; text is decoded here too
(`RequestStream`). The scheduler's messages come back through the pipe reader
(`OutputReader`) and the asyncio bridge (`LoopBridge`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sglang_aux.srt.managers.io_struct import (
    AbortRequest,
    AddRequest,
    EngineSpec,
    FlushCacheRequest,
    InfoRequest,
    SchedulerCommand,
)
from sglang_aux.srt.managers.request_factory import RequestFactory
from sglang_aux.srt.managers.scheduler.serving_engine import EngineFactory
from sglang_aux.srt.managers.scheduler.tp_ranks import with_rendezvous
from sglang_aux.srt.managers.tokenizer.loop_bridge import LoopBridge
from sglang_aux.srt.managers.tokenizer.output_reader import OutputReader
from sglang_aux.srt.managers.tokenizer.request_stream import RequestStream
from sglang_aux.srt.managers.tokenizer.scheduler_handle import (
    STOP_TIMEOUT_S,
    SchedulerGone,
    SchedulerHandle,
)
from sglang_aux.srt.managers.tokenizer.server_metrics import ServerMetrics
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs

TOKENIZER_THREADS = 4


class TokenizerManager:
    def __init__(self, server_args: ServerArgs, make_engine: EngineFactory):
        """`make_engine` builds the engine in the scheduler process (the server passes
        `entrypoints.engine.Engine`): a module-level callable, pickled there by reference."""
        server_args = with_rendezvous(server_args)  # every rank is given the same address
        self.server_args = server_args  # replaced by the engine's resolved ones at start()
        self.metrics = ServerMetrics()
        self.spec: EngineSpec | None = None
        self.scheduler = SchedulerHandle(server_args, make_engine)
        self._bridge = LoopBridge(self.metrics)
        self._reader = OutputReader(self.scheduler, self._bridge)
        self._tokenize = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")

    @property
    def tokenizer(self) -> Tokenizer:
        return self.spec.tokenizer

    @property
    def alive(self) -> bool:
        """Whether the scheduler process can still serve: false from the moment it exits."""
        return not self._reader.gone.is_set()

    @property
    def scheduler_pid(self) -> int | None:
        return self.scheduler.pid

    @property
    def on_scheduler_exit(self) -> Callable[[], None] | None:
        """Called in the reader thread once an unexpected exit has failed every request."""
        return self._reader.on_scheduler_exit

    @on_scheduler_exit.setter
    def on_scheduler_exit(self, callback: Callable[[], None] | None) -> None:
        self._reader.on_scheduler_exit = callback

    def start(self) -> EngineSpec:
        """Start the scheduler process and wait until its engine is built; re-raises its
        startup failure (the child's traceback in the exception's notes)."""
        self.spec = spec = self.scheduler.start()
        self.server_args = spec.server_args
        self.requests = RequestFactory(spec.tokenizer, spec.limits, spec.vocab_size,
                                       spec.server_args.random_seed)
        self._reader.start()
        return spec

    async def submit(self, *, text: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict | None = None,
                     rid: str | None = None, logprob: dict | None = None) -> RequestStream:
        """Validate and send a request (ValueError with the reason); event loop only. A
        prompt's text is tokenized on a pool thread: the event loop serves other requests
        meanwhile, and concurrent prompts tokenize in parallel. `rid`: the client's request
        id (a 400 while another live request has it), else a fresh one."""
        if text is not None and input_ids is None:
            self.requests.limits.validate_text(text)  # before the pool spends time on it
            loop = asyncio.get_running_loop()
            input_ids = await loop.run_in_executor(self._tokenize, self.tokenizer.encode, text)
            text = None
        if rid is not None and not isinstance(rid, str):
            raise ValueError(f"rid must be a string, got {rid!r}")
        req = self.requests.make(text=text, input_ids=input_ids,
                                 sampling_params=sampling_params, rid=rid, logprob=logprob)
        stream = RequestStream(self.tokenizer, req)
        self.metrics.add(requests_total=1)
        self._bridge.add(req, stream)
        try:
            self._send(AddRequest(req.rid, req.origin_input_ids, req.sampling_params, req.seed,
                                  req.logprob))
        except SchedulerGone:
            self._bridge.discard(req.rid)
            raise
        return stream

    def abort(self, rid: str) -> None:
        """Drop a request whose client went away (a no-op once it has finished)."""
        try:
            self._send(AbortRequest(rid))
        except SchedulerGone:  # so is the request
            pass

    async def flush_cache(self) -> int | None:
        """`Scheduler.flush_cache` between steps: slots freed, None when busy."""
        reply_id, answer = self._bridge.new_reply()
        self._send(FlushCacheRequest(reply_id))
        return await answer

    async def engine_info(self) -> dict:
        """The scheduler process's figures (`scheduler_info.engine_info`), read between steps."""
        reply_id, answer = self._bridge.new_reply()
        self._send(InfoRequest(reply_id))
        return await answer

    def shutdown(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the scheduler process (terminated if it does not stop in `timeout`)."""
        self._tokenize.shutdown(wait=False)
        self.scheduler.stop(timeout)

    def _send(self, msg: SchedulerCommand) -> None:
        try:
            self.scheduler.send(msg)
        except SchedulerGone:  # say why, once the reader knows
            raise SchedulerGone(self._bridge.error or "the scheduler process is gone") from None

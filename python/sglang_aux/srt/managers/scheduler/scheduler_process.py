"""The scheduler loop in its own process, so it shares no GIL with the HTTP front end.

`run_scheduler_process` is the child's entry (multiprocessing "spawn": CUDA cannot be used
in a forked child). It builds the Engine (loading, graph capture and every replay run in
this process), tells the front end what it needs of it (`EngineSpec`), then loops: take the
commands that arrived (blocking only while idle), run `scheduler.step()` while there is
work, and after each step send one message with every request's new tokens
(`io_struct` lists the messages). A request whose admission fails is failed alone (the
scheduler isolates it); a step that raises fails the requests in flight, and the loop keeps
serving. The loop ends on `Stop` or when the front end's pipe closes (the server
died): nobody is left to serve.

Under tensor parallelism this process is rank 0: each command and step also goes to the
follower ranks (`tp_step_broadcast.py`), and a step that raises ends the process (the group
may be broken: a rank died or stopped answering), after failing the requests in flight with
the reason.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from sglang_aux.srt.distributed.parallel_state import destroy_distributed_environment
from sglang_aux.srt.managers.io_struct import (
    AbortRequest,
    AddRequest,
    EngineSpec,
    Finished,
    FlushCacheRequest,
    InfoRequest,
    NewLogprobs,
    Ready,
    Reply,
    RequestAborted,
    RequestOut,
    RequestsFailed,
    StartupError,
    StepOutput,
    Stop,
)
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.scheduler_info import engine_info
from sglang_aux.srt.managers.scheduler.serving_engine import EngineFactory, ServingEngine
from sglang_aux.srt.managers.scheduler.step_throughput import StepThroughput
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"

def run_scheduler_process(server_args: ServerArgs, commands: Connection, outputs: Connection,
                          make_engine: EngineFactory, tp_rank: int | None = None) -> None:
    """The child's main: build the engine (as tensor-parallel rank `tp_rank`, whose
    followers the front end started), report it ready (or why not), serve commands."""
    logging.basicConfig(level=server_args.log_level.upper(), format=LOG_FORMAT)
    with torch.no_grad():
        try:
            engine = (make_engine(server_args) if tp_rank is None
                      else make_engine(server_args, tp_rank=tp_rank))
        except BaseException as e:  # start() re-raises it in the front end
            _send_startup_error(outputs, e)
            return
        outputs.send(Ready(engine_spec(engine)))
        try:
            SchedulerLoop(engine, commands, outputs).run()
        except (BrokenPipeError, EOFError, ConnectionResetError):
            logger.info("the front end went away; the scheduler process exits")
        finally:
            destroy_distributed_environment()


def _send_startup_error(outputs: Connection, error: BaseException) -> None:
    text = traceback.format_exc()
    try:
        outputs.send(StartupError(error, text))
    except Exception:  # the exception does not pickle: its type and message do
        outputs.send(StartupError(RuntimeError(f"{type(error).__name__}: {error}"), text))


def engine_spec(engine: ServingEngine) -> EngineSpec:
    cfg, runner = engine.model_config, engine.worker.model_runner
    return EngineSpec(
        server_args=engine.server_args, tokenizer=engine.tokenizer,
        limits=engine.scheduler.limits, vocab_size=cfg.hf_config.vocab_size,
        architecture=cfg.architecture, context_len=cfg.context_len,
        dtype=str(cfg.dtype).removeprefix("torch."), device=str(runner.device),
        radix_cache=engine.scheduler.tree_cache is not None, pid=os.getpid(),
    )


@dataclass
class _Live:
    req: Req
    sent: int = 0  # output tokens sent so far
    prompt_logprobs_sent: bool = False


class SchedulerLoop:
    def __init__(self, engine: ServingEngine, commands: Connection, outputs: Connection):
        self.engine = engine
        self.sched = engine.scheduler
        self.steps = engine.step_broadcast  # the scheduler's commands and steps, to every rank
        self.commands = commands
        self.outputs = outputs
        self.throughput = StepThroughput()
        self._live: dict[str, _Live] = {}
        self._updates: list[RequestOut] = []  # of the current step
        self._emitted = 0  # output tokens sent
        self.sched.on_update = self._on_update

    def run(self) -> None:
        while self._take_commands(block=not self.sched.has_work()):
            if self.sched.has_work():
                self._step()

    def _take_commands(self, block: bool) -> bool:
        """Apply the commands that arrived (waiting for one when idle); False on `Stop`."""
        while block or self.commands.poll():
            block = False
            match self.commands.recv():
                case Stop():
                    self.steps.stop()
                    return False
                case AddRequest() as add:
                    self._add(add)
                case AbortRequest(rid=rid):
                    self._abort(rid)
                case FlushCacheRequest(reply_id=reply_id):
                    self.outputs.send(Reply(reply_id, self.steps.flush_cache()))
                case InfoRequest(reply_id=reply_id):
                    info = engine_info(self.engine, self.throughput)
                    self.outputs.send(Reply(reply_id, info))
                case unknown:
                    raise TypeError(f"unknown scheduler command {type(unknown).__name__}")
        return True

    def _add(self, add: AddRequest) -> None:
        req = add.to_req()
        try:
            self.steps.add_request(req)  # the front end validated it against the same limits
        except ValueError as e:
            self.outputs.send(RequestsFailed([req.rid], str(e)))
            return
        self._live[req.rid] = _Live(req)

    def _abort(self, rid: str) -> None:
        live = self._live.pop(rid, None)
        if live is not None:  # else it finished (or failed) already
            self.steps.abort(live.req)
            self.outputs.send(RequestAborted(rid))
            logger.debug("aborted %s after %d tokens", rid, live.sent)

    def _step(self) -> None:
        start, emitted = time.perf_counter(), self._emitted
        failed: list[str] = []
        try:
            self.steps.step()
            self.throughput.record_step(self._emitted - emitted, time.perf_counter() - start)
        except Exception as e:
            if self.steps.replicated:
                self._end_tensor_parallel(e)
            # Keep serving: fail what was in flight and start from an empty scheduler.
            logger.exception("scheduler step failed; failing %d requests", len(self._live))
            self.sched.in_flight = []  # its requests are failed below
            for live in self._live.values():
                self.sched.abort(live.req)
            failed, reason = list(self._live), f"internal error: {e!r}"
            self._live.clear()
            # the failed step may have left unwritten K/V under the dropped requests' kv_len
            self.sched.flush_cache()
        if self._updates:
            self.outputs.send(StepOutput(self._updates))
            self._updates = []
        if failed:
            self.outputs.send(RequestsFailed(failed, reason))

    def _end_tensor_parallel(self, error: Exception) -> None:
        """A tensor-parallel step failed: the ranks may no longer agree (or one is gone), so
        fail every request in flight with the reason and end the process."""
        reason = (f"tensor-parallel step failed on rank {self.steps.group.rank} of "
                  f"{self.steps.group.world_size} (a rank died or stopped answering?): "
                  f"{error!r}; the server stops")
        logger.error(reason)
        self.outputs.send(RequestsFailed(list(self._live), reason))
        raise SystemExit(1) from error

    def _on_update(self, req: Req) -> None:
        live = self._live.get(req.rid)
        if live is None:  # aborted earlier
            return
        new_ids = req.output_ids[live.sent:]
        logprobs = None
        if req.logprob is not None:
            # the prompt's entries exist once its prefill has run: before any output token
            prompt = [] if live.prompt_logprobs_sent else req.input_logprobs
            live.prompt_logprobs_sent |= bool(prompt)
            logprobs = NewLogprobs(prompt, req.output_logprobs[live.sent:])
        live.sent = len(req.output_ids)
        self._emitted += len(new_ids)
        finished = None
        if req.finished:
            del self._live[req.rid]
            if "message" in req.finished_reason:  # it failed alone (Admission._admit_one)
                self.outputs.send(RequestsFailed([req.rid], req.finished_reason["message"]))
                return
            finished = Finished.of(req)
        self._updates.append(RequestOut(req.rid, new_ids, logprobs, finished))

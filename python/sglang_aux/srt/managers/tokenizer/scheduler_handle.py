"""The front end's handle on the processes behind it: the scheduler process and, under tensor
parallelism, the node's follower ranks.

`start()` spawns the scheduler process (`scheduler_process`, which builds and runs the
Engine) and the followers (`tp_ranks.py`), and waits for the engine's `EngineSpec`. A
follower that exits ends the scheduler process too (rank 0 may be waiting on it in the
rendezvous or inside a collective); the reason then names the rank and the error it reported.
`stop()` asks the scheduler process to stop and reaps every process.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from multiprocessing.connection import wait

from sglang_aux.srt.managers.io_struct import (
    EngineSpec,
    Ready,
    SchedulerCommand,
    SchedulerMessage,
    StartupError,
    Stop,
)
from sglang_aux.srt.managers.scheduler.scheduler_process import run_scheduler_process
from sglang_aux.srt.managers.scheduler.serving_engine import EngineFactory
from sglang_aux.srt.managers.scheduler.tp_ranks import (
    Follower,
    node_ranks,
    start_followers,
    stop_followers,
)
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # for the scheduler process to leave its loop before it is terminated


class SchedulerGone(RuntimeError):
    """The scheduler process has exited: nothing can be served any more."""


class SchedulerHandle:
    def __init__(self, server_args: ServerArgs, make_engine: EngineFactory):
        """`server_args` with the rendezvous set (`tp_ranks.with_rendezvous`); `make_engine`
        builds the engine in the scheduler process: a module-level callable, pickled there
        by reference."""
        self.server_args = server_args
        self._make_engine = make_engine
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot run in a forked child
        child_commands, self._commands = ctx.Pipe(duplex=False)
        self._outputs, child_outputs = ctx.Pipe(duplex=False)
        tp_ranks = node_ranks(server_args)
        self.process = ctx.Process(
            target=run_scheduler_process, name="sglang_aux-scheduler", daemon=True,
            args=(server_args, child_commands, child_outputs, make_engine,
                  tp_ranks[0] if server_args.tp_size > 1 else None))
        self._child_ends = (child_commands, child_outputs)
        self._followers: list[Follower] = []  # this node's other TP ranks, once started
        self.follower_exit: str | None = None  # why a follower ended the scheduler process
        self.stopping = False  # stop() was called: the processes are meant to exit
        self._send_lock = threading.Lock()
        self._reap_lock = threading.Lock()  # see wait_exit

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def start(self) -> EngineSpec:
        """Start the processes and wait until the engine is built; re-raises its startup
        failure (the child's traceback in the exception's notes), or raises SchedulerGone
        naming the follower that ended start-up."""
        self.process.start()
        for end in self._child_ends:  # the child's now: EOF here once it exits
            end.close()
        self._start_followers()
        try:
            msg = self._outputs.recv()
        except EOFError:
            stop_followers(self._followers)
            cause = f"{self.follower_exit}, so " if self.follower_exit else ""
            raise SchedulerGone(f"{cause}the scheduler process exited (exit code "
                                f"{self.wait_exit(None)}) before its engine was ready"
                                ) from None
        match msg:
            case Ready(spec=spec):
                return spec
            case StartupError(error=error, traceback=text):
                self.wait_exit(STOP_TIMEOUT_S)
                stop_followers(self._followers)
                error.add_note(f"raised in the scheduler process:\n{text}")
                raise error
            case unknown:
                raise TypeError(f"unknown scheduler message {type(unknown).__name__} "
                                "before Ready")

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
        """Wait for a follower to exit; unless stopping, end the scheduler process (the
        front end then fails every request with the reason)."""
        by_sentinel = {f.process.sentinel: f for f in self._followers}
        gone = by_sentinel[wait(list(by_sentinel))[0]]
        gone.process.join()
        if self.stopping:
            return
        self.follower_exit = gone.failure()
        logger.error("%s; stopping the scheduler process", self.follower_exit)
        self.process.terminate()

    def send(self, msg: SchedulerCommand) -> None:
        """SchedulerGone when the scheduler process is gone."""
        with self._send_lock:
            try:
                self._commands.send(msg)
            except OSError:  # the scheduler process closed its end: it is gone
                raise SchedulerGone("the scheduler process is gone") from None

    def recv(self) -> SchedulerMessage:
        """The scheduler's next message; EOFError (or OSError) once it has exited."""
        return self._outputs.recv()

    def exit_reason(self) -> str:
        """Why the scheduler process, which has exited, can serve no more."""
        reason = (f"the scheduler process exited (exit code {self.wait_exit(STOP_TIMEOUT_S)}); "
                  "this server cannot run requests any more")
        return reason if self.follower_exit is None else f"{self.follower_exit}, so {reason}"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop the scheduler process (terminated if it does not stop in `timeout`) and the
        followers."""
        self.stopping = True
        if self.process.pid is None:  # never started
            return
        try:
            self.send(Stop())
        except SchedulerGone:
            pass
        code = self.wait_exit(timeout)
        if code is None:
            logger.warning("the scheduler process did not stop in %.0f s; terminating", timeout)
            self.process.terminate()
            code = self.wait_exit(timeout)
        if code is None:
            self.process.kill()
            code = self.wait_exit(None)
        logger.info("the scheduler process stopped (exit code %s)", code)
        stop_followers(self._followers)

    def wait_exit(self, timeout: float | None) -> int | None:
        """Join the scheduler process; its exit code, or None while it runs. The reader thread
        (on EOF) and stop() both wait for it, and of two concurrent waitpid calls one gets
        ECHILD, which multiprocessing reports as still running: they take turns."""
        with self._reap_lock:
            self.process.join(timeout)
            return self.process.exitcode

"""The front end's pipe reader: a thread that receives the scheduler process's messages and
hands each to the asyncio bridge. When the pipe closes (the scheduler process exited), `alive`
turns false at once, every waiting request fails with the reason, and so does every later one;
then, unless the front end is stopping, `on_scheduler_exit` is called (the HTTP server exits,
so that a supervisor restarts it)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sglang_aux.srt.managers.io_struct import (
    Reply,
    RequestAborted,
    RequestsFailed,
    StepOutput,
)
from sglang_aux.srt.managers.tokenizer.loop_bridge import LoopBridge
from sglang_aux.srt.managers.tokenizer.scheduler_handle import SchedulerHandle

logger = logging.getLogger(__name__)


class OutputReader:
    def __init__(self, scheduler: SchedulerHandle, bridge: LoopBridge):
        self.scheduler = scheduler
        self.bridge = bridge
        self.gone = threading.Event()  # the scheduler process's pipe closed: it exited
        # called in the reader thread once an unexpected exit has failed every request
        self.on_scheduler_exit: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._read, name="scheduler-reader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                match self.scheduler.recv():
                    case StepOutput(updates=updates):
                        self.bridge.on_step(updates)
                    case RequestsFailed(rids=rids, reason=reason):
                        self.bridge.fail(rids, reason)
                    case RequestAborted(rid=rid):
                        self.bridge.aborted(rid)
                    case Reply(reply_id=reply_id, value=value):
                        self.bridge.reply(reply_id, value)
                    case unknown:
                        raise TypeError(f"unknown scheduler message {type(unknown).__name__}")
        except (EOFError, OSError):  # the scheduler process exited
            pass
        self.gone.set()
        reason = self.scheduler.exit_reason()
        stopping = self.scheduler.stopping
        failed = self.bridge.close(reason)
        if failed or not stopping:
            logger.log(logging.INFO if stopping else logging.ERROR,
                       "%s; failed %d requests", reason, failed)
        if not stopping and self.on_scheduler_exit is not None:
            self.on_scheduler_exit()

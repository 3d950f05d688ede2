"""Rank 0 schedules; every other tensor-parallel rank replays its scheduler's inputs.

Each rank runs the same `Scheduler` over its own shard of the model (SGLang's layout: a
scheduler per rank, requests received on rank 0 and broadcast). Rank 0 applies each command
(a request added, aborted, the cache flushed) as it arrives and records it; before each step
it broadcasts the commands since the last step, and every follower applies the same commands
and runs the same step. The scheduler is deterministic given its commands and the tokens each
step produces, and those tokens are rank 0's (the workers broadcast them on the device), so
every rank schedules the same batches and runs the same forwards, collectives included.
"""

from __future__ import annotations

import logging
import pickle

from sglang_aux.srt.distributed.parallel_state import GroupCoordinator
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler import Scheduler

logger = logging.getLogger(__name__)

Command = tuple  # ("add", pickled Req) | ("abort", rid) | ("flush",)


class StepBroadcast:
    """Rank 0's side (the only side on one rank, where nothing is sent)."""

    def __init__(self, scheduler: Scheduler, group: GroupCoordinator):
        self.scheduler = scheduler
        self.group = group
        self._commands: list[Command] = []

    @property
    def replicated(self) -> bool:
        return self.group.world_size > 1

    def add_request(self, req: Req) -> None:
        """`Scheduler.add_request` (ValueError when it refuses; then nothing is sent)."""
        snapshot = pickle.dumps(req) if self.replicated else b""  # before the scheduler runs it
        self.scheduler.add_request(req)
        if self.replicated:
            self._commands.append(("add", snapshot))

    def abort(self, req: Req) -> None:
        self.scheduler.abort(req)
        if self.replicated:
            self._commands.append(("abort", req.rid))

    def flush_cache(self) -> int | None:
        freed = self.scheduler.flush_cache()
        if self.replicated:
            self._commands.append(("flush",))
        return freed

    def step(self) -> None:
        """Send the commands since the last step, then step with the followers."""
        if self.replicated:
            self.group.broadcast_object(("step", self._commands))
            self._commands = []
        self.scheduler.step()

    def stop(self) -> None:
        """Tell the followers to leave their loops (rank 0 is shutting down)."""
        if self.replicated:
            self.group.broadcast_object(("stop", []))


class FollowerLoop:
    """A follower rank's loop: apply rank 0's commands, step when it steps, until "stop"."""

    def __init__(self, scheduler: Scheduler, group: GroupCoordinator):
        self.scheduler = scheduler
        self.group = group
        self._live: dict[str, Req] = {}
        scheduler.on_update = self._on_update

    def run(self) -> None:
        while True:
            kind, commands = self.group.broadcast_object()
            for command in commands:
                self._apply(command)
            if kind == "stop":
                logger.info("rank %d: rank 0 stopped; leaving", self.group.rank)
                return
            self.scheduler.step()

    def _apply(self, command: Command) -> None:
        if command[0] == "add":
            req = pickle.loads(command[1])
            self.scheduler.add_request(req)  # rank 0 accepted it: so does this rank
            self._live[req.rid] = req
        elif command[0] == "abort":
            req = self._live.pop(command[1], None)
            if req is not None:
                self.scheduler.abort(req)
        elif command[0] == "flush":
            self.scheduler.flush_cache()
        else:
            raise ValueError(f"unknown step command {command[0]!r}")

    def _on_update(self, req: Req) -> None:
        if req.finished:
            self._live.pop(req.rid, None)

"""Rank 0 schedules; every other tensor-parallel rank replays its scheduler's inputs.

Each rank runs the same `Scheduler` over its own shard of the model (SGLang's layout: a
scheduler per rank, requests received on rank 0 and broadcast). Rank 0 applies each command
(a request added, aborted, the cache flushed) as it arrives and records it; before each step
it broadcasts the commands since the last step, and every follower applies the same commands
and runs the same step. The scheduler is deterministic given its commands and the tokens each
step produces, and those tokens are rank 0's (the workers broadcast them on the device), so
every rank schedules the same batches and runs the same forwards, collectives included. The
one input that is not a command or a token, the chunk pacer's step times, is rank 0's too:
its readings ride in each turn (`ReplayPacerReadings`) and a follower's own are never read.
"""

from __future__ import annotations

import logging
import pickle
from dataclasses import dataclass

from sglang_aux.srt.distributed.parallel_state import GroupCoordinator
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.scheduler import Scheduler

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayAdd:
    """Add the request rank 0 added."""

    snapshot: bytes  # the pickled Req as rank 0's scheduler received it


@dataclass(frozen=True)
class ReplayAbort:
    """Drop the request rank 0 dropped."""

    rid: str


@dataclass(frozen=True)
class ReplayFlush:
    """Flush the prefix cache, as rank 0 did."""


@dataclass(frozen=True)
class ReplayPacerReadings:
    """The step times rank 0's chunk pacer read since the last turn, in order."""

    readings: tuple[tuple[int, float], ...]


StepCommand = ReplayAdd | ReplayAbort | ReplayFlush | ReplayPacerReadings


@dataclass(frozen=True)
class Turn:
    """What rank 0 broadcasts before each step: the commands since the last one, then a step
    (or, with `stop`, the end)."""

    commands: list[StepCommand]
    stop: bool = False


class StepBroadcast:
    """Rank 0's side (the only side on one rank, where nothing is sent)."""

    def __init__(self, scheduler: Scheduler, group: GroupCoordinator):
        self.scheduler = scheduler
        self.group = group
        self._commands: list[StepCommand] = []
        if self.replicated and scheduler.chunk_pacer is not None:
            scheduler.chunk_pacer.role = "leader"

    @property
    def replicated(self) -> bool:
        return self.group.world_size > 1

    def add_request(self, req: Req) -> None:
        """`Scheduler.add_request` (ValueError when it refuses; then nothing is sent)."""
        snapshot = pickle.dumps(req) if self.replicated else b""  # before the scheduler runs it
        self.scheduler.add_request(req)
        if self.replicated:
            self._commands.append(ReplayAdd(snapshot))

    def abort(self, req: Req) -> None:
        self.scheduler.abort(req)
        if self.replicated:
            self._commands.append(ReplayAbort(req.rid))

    def flush_cache(self) -> int | None:
        freed = self.scheduler.flush_cache()
        if self.replicated:
            self._commands.append(ReplayFlush())
        return freed

    def step(self) -> None:
        """Send the commands since the last step, then step with the followers."""
        if self.replicated:
            pacer = self.scheduler.chunk_pacer
            readings = pacer.take_readings() if pacer is not None else []
            if readings:
                self._commands.append(ReplayPacerReadings(tuple(readings)))
            self.group.broadcast_object(Turn(self._commands))
            self._commands = []
        self.scheduler.step()

    def stop(self) -> None:
        """Tell the followers to leave their loops (rank 0 is shutting down)."""
        if self.replicated:
            self.group.broadcast_object(Turn([], stop=True))


class FollowerLoop:
    """A follower rank's loop: apply rank 0's commands, step when it steps, until it stops."""

    def __init__(self, scheduler: Scheduler, group: GroupCoordinator):
        self.scheduler = scheduler
        self.group = group
        self._live: dict[str, Req] = {}
        scheduler.on_update = self._on_update
        if scheduler.chunk_pacer is not None:
            scheduler.chunk_pacer.role = "follower"

    def run(self) -> None:
        while True:
            turn = self.group.broadcast_object()
            if not isinstance(turn, Turn):
                raise TypeError(f"rank 0 sent a {type(turn).__name__}, not a Turn")
            for command in turn.commands:
                self._apply(command)
            if turn.stop:
                logger.info("rank %d: rank 0 stopped; leaving", self.group.rank)
                return
            self.scheduler.step()

    def _apply(self, command: StepCommand) -> None:
        match command:
            case ReplayAdd(snapshot=snapshot):
                req = pickle.loads(snapshot)
                self.scheduler.add_request(req)  # rank 0 accepted it: so does this rank
                self._live[req.rid] = req
            case ReplayAbort(rid=rid):
                req = self._live.pop(rid, None)
                if req is not None:
                    self.scheduler.abort(req)
            case ReplayFlush():
                self.scheduler.flush_cache()
            case ReplayPacerReadings(readings=readings):
                for tokens, ms in readings:
                    self.scheduler.chunk_pacer.observe(tokens, ms)
            case unknown:
                raise TypeError(f"unknown step command {type(unknown).__name__}")

    def _on_update(self, req: Req) -> None:
        if req.finished:
            self._live.pop(req.rid, None)

"""Pacing a chunked prompt's chunks in mixed steps so that running requests keep a share of
their decode rate (`--chunked-prefill-decode-share`).

With mixed steps every step of a chunked prefill runs the running batch's decode (or DFlash
verify) step and the prompt's next chunk in one forward. A long chunk deep into a long prompt
makes that step many decode steps long: on an H100 (the shaped Qwen2.5-1.5B pair, a
32,000-token prompt, 8 running requests, 512-token chunks) the running requests kept 22% of
their tokens/s while it was prefilled. The pacer times steps on the device (CUDA events, read
when the step's tokens are; decode steps one in `decode_every`) and keeps the share by
interleaving: chunks keep the largest mixed size that fits and the running batch takes decode
steps of its own between them, as many as keep the share over the chunk's step and theirs:
k >= (share * chunk_ms - decode_ms) / (decode_ms * (1 - share)).

Why not shrink the chunks instead: every mixed step pays a fixed cost (about 1 ms over a decode
step on that H100), which full chunks pay once per chunk. Measured on an H100 (2026-12-05,
docs/benchmarks.md section 7), full chunks with decode steps owed between them prefilled 1.86x
faster than shrinking chunks at the same kept share.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch


@dataclass
class _Span:
    start: torch.cuda.Event | float
    end: torch.cuda.Event | float

    def ms(self) -> float:
        if isinstance(self.start, float):
            return (self.end - self.start) * 1e3
        self.end.synchronize()  # the step's tokens are read: its events are done or nearly
        return self.start.elapsed_time(self.end)


@dataclass
class ChunkPacer:
    share: float  # of their decode tokens/s the running requests keep, in (0, 1)
    sizes: list[int]  # chunk token counts a mixed forward takes (its graphs'), ascending
    cuda: bool  # device time from CUDA events; else the launch's host time (a CPU step)
    decode_every: int = 8
    # Tensor parallelism (tp_step_broadcast): the scheduler is replicated and must decide
    # alike on every rank, so rank 0 ("leader") keeps its readings for the followers, and a
    # follower's schedule takes those readings only, never its own step times.
    role: str = "alone"
    decode_ms: float | None = None  # a moving average of timed decode steps
    _last_chunk_ms: float | None = None  # the last chunk step read; None: a new prompt
    _decodes: int = 0
    _open: dict[int, tuple[int, _Span]] = field(default_factory=dict)  # id(step) -> chunk
    _start: torch.cuda.Event | float | None = None
    _readings: list[tuple[int, float]] = field(default_factory=list)  # leader: not yet sent

    def __post_init__(self) -> None:
        if not 0.0 < self.share < 1.0:
            raise ValueError(f"--chunked-prefill-decode-share must be in [0, 1) (0: off), "
                             f"got {self.share}")
        if not self.sizes or self.sizes != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise ValueError(f"chunk sizes must be ascending positive counts, got {self.sizes}")

    def new_prompt(self) -> None:
        """A chunked prompt starts: the last prompt's chunk steps owe it nothing."""
        self._last_chunk_ms = None

    def chunk_tokens(self, limit: int) -> int:
        """The next chunk's tokens: the largest size at most `limit` (the chunk size and the
        mixed budget), so the forward pads nothing; `limit` if no size fits."""
        return max((s for s in self.sizes if s <= limit), default=limit)

    def decode_steps_owed(self) -> int:
        """Decode steps the running batch takes before the next chunk (0 before a chunk and a
        decode step are read)."""
        if self._last_chunk_ms is None or self.decode_ms is None:
            return 0
        d, share = self.decode_ms, self.share
        return max(0, math.ceil((share * self._last_chunk_ms - d) / (d * (1.0 - share))))

    def start(self) -> None:
        """Marks the device's position before a launch (`timed` closes it)."""
        if self.role == "follower":
            return
        now: torch.cuda.Event | float
        if self.cuda:
            now = torch.cuda.Event(enable_timing=True)
            now.record()
        else:
            now = time.perf_counter()
        self._start = now

    def timed(self, step: object, chunk_tokens: int) -> None:
        """Closes the span `start` opened for `step`, a chunk of `chunk_tokens` (0: a
        decode step); read when the step completes."""
        if self.role == "follower":
            return
        start, self._start = self._start, None
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
        else:
            end = time.perf_counter()
        self._open[id(step)] = (chunk_tokens, _Span(start, end))

    def time_decode(self) -> bool:
        """Whether to time this decode step (one in `decode_every`)."""
        self._decodes += 1
        return self._decodes % self.decode_every == 1

    def completed(self, step: object) -> None:
        """A launched step's tokens are read: its span, if timed, updates the estimates."""
        timed = self._open.pop(id(step), None)
        if timed is None:
            return
        self.observe(timed[0], timed[1].ms())

    def observe(self, chunk_tokens: int, ms: float) -> None:
        """A step's device ms: a decode step's (`chunk_tokens` 0) or a chunk's."""
        if self.role == "leader":
            self._readings.append((chunk_tokens, ms))
        if chunk_tokens == 0:
            self.decode_ms = ms if self.decode_ms is None else 0.75 * self.decode_ms + 0.25 * ms
        else:
            self._last_chunk_ms = ms

    def take_readings(self) -> list[tuple[int, float]]:
        """The leader's readings since the last call, for the followers to `observe`."""
        readings, self._readings = self._readings, []
        return readings

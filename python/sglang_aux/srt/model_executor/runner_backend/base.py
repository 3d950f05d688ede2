"""The seam between a graph runner's logic and how a captured forward is replayed."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput

CapturedFn = Callable[[], LogitsProcessorOutput]

# Eager runs before each capture: lazy kernels compile and the allocator settles outside it.
NUM_WARMUPS = 2


class GraphBackend(ABC):
    """Captures a forward closure over static buffers and replays it.

    The output returned by `capture` lives in static storage: every replay rewrites the same
    tensors, which callers borrow until the next replay.
    """

    @abstractmethod
    def capture(self, fn: CapturedFn) -> tuple[Any, LogitsProcessorOutput]:
        """Run `fn` under capture; returns a handle and the static output."""

    @abstractmethod
    def replay(self, handle: Any) -> None: ...

    def synchronize(self) -> None:
        """Wait for captured work (a no-op off the GPU)."""

    def capture_session(self) -> AbstractContextManager[None]:
        """Held around a runner's run of captures (nothing off the GPU)."""
        return nullcontext()

    def warm_and_capture(self, fn: CapturedFn) -> tuple[Any, LogitsProcessorOutput]:
        """`NUM_WARMUPS` eager runs of `fn`, then `capture(fn)`."""
        for _ in range(NUM_WARMUPS):
            fn()
        self.synchronize()
        return self.capture(fn)

"""Holding a worker step to its one readback: CUDA's sync debug mode as a test harness."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def strict_sync(worker, step: str) -> Iterator[list[int]]:
    """Run every launch `worker.<step>` (prefill, decode or mixed) under sync debug mode "error":
    a synchronizing op anywhere in it raises (the step's tokens are waited for later, on its
    readback's event). Yields the list each launch appends its count of queued readbacks
    to. Restores the method and mode 0."""
    readback, run = worker.readback, getattr(worker, step)
    counts: list[int] = []

    def strict(*reqs):
        before = readback.num_copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            return run(*reqs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            counts.append(readback.num_copies - before)

    setattr(worker, step, strict)
    try:
        yield counts
    finally:
        setattr(worker, step, run)
        torch.cuda.set_sync_debug_mode(0)

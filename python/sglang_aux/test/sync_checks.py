"""Holding a worker step to its one readback: CUDA's sync debug mode as a test harness."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def strict_sync(worker, step: str) -> Iterator[list[int]]:
    """Run `worker.<step>` (prefill or decode) under sync debug mode "error" except inside
    the worker's readback; yields the list each call appends its readback count to. A
    synchronizing op anywhere else in the step raises. Restores both methods and mode 0."""
    readback = worker.readback
    fetch, run = readback.fetch, getattr(worker, step)
    counts: list[int] = []

    def allowed_fetch(t):
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return fetch(t)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    def strict(reqs):
        before = readback.num_copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            return run(reqs)
        finally:
            torch.cuda.set_sync_debug_mode(0)
            counts.append(readback.num_copies - before)

    readback.fetch = allowed_fetch
    setattr(worker, step, strict)
    try:
        yield counts
    finally:
        readback.fetch = fetch
        setattr(worker, step, run)
        torch.cuda.set_sync_debug_mode(0)

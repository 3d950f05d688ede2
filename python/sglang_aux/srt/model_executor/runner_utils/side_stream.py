"""A second CUDA stream for work that runs beside the current stream's next work.

`beside()` makes the side stream wait for everything already issued on the current stream,
then issues the block's work on the side stream; the current stream's next work runs
concurrently with it, until `join()` makes the current stream wait for the side stream. So
the side work sees all earlier writes, and everything issued after `join()` sees its writes.
The two must not touch the same memory in between (the scheduler's concurrent prefill: the
arrivals' rows and slots against the running batch's). Off CUDA both are no-ops: one queue.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class SideStream:
    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def beside(self) -> Iterator[None]:
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield

    def join(self) -> None:
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

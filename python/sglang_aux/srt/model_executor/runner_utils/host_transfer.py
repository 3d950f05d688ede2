"""The two host/device crossings of a decode step: step inputs in, chosen tokens out.

Both go through pinned host memory with non-blocking copies. `HostReadback.start` queues the
step's one device-to-host copy and records an event after it; `PendingCopy.wait` waits on that
event only (not on the whole device), so the host can launch the next step first. Copies are
counted so tests can hold a step to one.
"""

from __future__ import annotations

import torch


def to_device(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Host integers `[n, m]` as one int64 device tensor, in one (pinned, async) copy."""
    pinned = device.type == "cuda"
    host = torch.tensor(rows, dtype=torch.int64, pin_memory=pinned)
    return host.to(device, non_blocking=pinned)


def tensor_to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor of any dtype on `device`, from pinned memory without waiting for the
    device's queue (a copy from pageable memory syncs the stream first); a device tensor
    moved as `Tensor.to` does."""
    if device.type != "cuda" or t.is_cuda:
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


def to_device_into(dst: torch.Tensor, values: list[int]) -> None:
    """Host integers into the prefix `[:len(values)]` of the int64 tensor `dst` (a graph's
    static input, or a fresh one), in one (pinned, async) copy."""
    pinned = dst.device.type == "cuda"
    host = torch.tensor(values, dtype=torch.int64, pin_memory=pinned)
    dst[: len(values)].copy_(host, non_blocking=pinned)


class PendingCopy:
    """A device tensor's copy into host memory, queued on the current stream."""

    def __init__(self, t: torch.Tensor):
        if t.device.type != "cuda":
            self._host, self._done = t.clone(), None
            return
        self._host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        self._host.copy_(t, non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record()

    def wait(self) -> torch.Tensor:
        """The host tensor once the copy landed (the caller may keep it)."""
        if self._done is not None:
            self._done.synchronize()
        return self._host


class PendingRows:
    """Rows `[start, stop)` of a pending copy: one readback serving two steps (a mixed
    forward's step requests and its arrivals)."""

    def __init__(self, copy: PendingCopy, start: int, stop: int):
        self.copy, self.start, self.stop = copy, start, stop

    def wait(self) -> torch.Tensor:
        return self.copy.wait()[self.start : self.stop]


class HostReadback:
    def __init__(self, device: torch.device):
        self.device = device
        self.num_copies = 0

    def start(self, t: torch.Tensor) -> PendingCopy:
        """Queue `t`'s copy to the host, after the work that computes it."""
        self.num_copies += 1
        return PendingCopy(t)

"""The two host/device crossings of a decode step: step inputs in, chosen tokens out.

Both go through pinned host memory with non-blocking copies. `HostReadback.fetch` is the
step's one device-to-host copy: it waits on an event recorded after the copy (not on the whole
device), and counts itself so tests can hold a step to one.
"""

from __future__ import annotations

import torch


def to_device(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    """Host integers `[n, m]` as one int64 device tensor, in one (pinned, async) copy."""
    pinned = device.type == "cuda"
    host = torch.tensor(rows, dtype=torch.int64, pin_memory=pinned)
    return host.to(device, non_blocking=pinned)


def to_device_parts(parts: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Host integer lists of any lengths as int64 device tensors, in one copy (views of it)."""
    flat = [x for part in parts for x in part]
    whole = to_device([flat], device)[0]
    return list(whole.split([len(part) for part in parts]))


class HostReadback:
    def __init__(self, device: torch.device):
        self.device = device
        self.num_copies = 0

    def fetch(self, t: torch.Tensor) -> torch.Tensor:
        """`t` on the host once it is computed (a host tensor the caller may keep)."""
        self.num_copies += 1
        if self.device.type != "cuda":
            return t.clone()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        done.synchronize()
        return host

"""Device memory before and after an operation, the three ways GPU.md asks for."""

from __future__ import annotations

import torch


class MemoryProbe:
    """Snapshot at construction; `delta()` reports the change since.

    `free_memory_drop_bytes` is what SGLang's capture log reports (the device's free memory);
    the allocator's reserved and allocated deltas say where the memory went. Zero off CUDA.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self._start = self._read()

    def _read(self) -> tuple[int, int, int]:
        if not self.on_cuda:
            return 0, 0, 0
        torch.cuda.synchronize(self.device)
        # As SGLang's capture log: cached blocks nobody holds (eager warm-up transients) go
        # back first, so the figure is what stays taken. Graph pools stay reserved.
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info(self.device)
        return (free, torch.cuda.memory_reserved(self.device),
                torch.cuda.memory_allocated(self.device))

    def delta(self) -> dict[str, int]:
        free, reserved, allocated = self._read()
        return {
            "free_memory_drop_bytes": self._start[0] - free,
            "reserved_delta_bytes": reserved - self._start[1],
            "allocated_delta_bytes": allocated - self._start[2],
        }

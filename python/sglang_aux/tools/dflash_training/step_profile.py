"""torch.profiler over a few training steps: where a step's time goes (wall against the
device's busy time, and the ops that took it), logged once (`--profile-steps`)."""

from __future__ import annotations

import logging
import time

import torch
from torch.autograd import DeviceType

logger = logging.getLogger(__name__)


class StepProfile:
    """torch.profiler over `num_steps` training steps from step `first` on (after the slow
    first ones: allocations, kernel selection, compiling): when they end, logs the wall time
    a step took, the device's busy time within it (the sum of its kernels'), the most device
    memory the steps held above what was allocated when they began (what the rows'
    `--device-reserve-gb` must leave them, the batch included) and the ops that took the most
    self time, device first."""

    def __init__(self, num_steps: int, device: torch.device, first: int):
        self.first, self.last = first, first + num_steps
        self.num_steps, self.device = num_steps, device
        self.prof: torch.profiler.profile | None = None
        self.started = 0.0
        self.start_bytes = 0  # allocated on the device when the profiled steps began

    def before(self, step: int) -> None:
        if self.num_steps and step == self.first:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(torch.profiler.ProfilerActivity.CUDA)
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                self.start_bytes = torch.cuda.memory_allocated(self.device)
            self.prof = torch.profiler.profile(activities=activities)
            self.prof.__enter__()
            self.started = time.perf_counter()

    def after(self, step: int, total: int) -> None:
        """After `step` of `total` (a run shorter than the profile ends it early)."""
        if self.prof is None or step < min(self.last, total):
            return
        self.num_steps = step - self.first
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        wall = (time.perf_counter() - self.started) / self.num_steps
        self.prof.__exit__(None, None, None)
        events = self.prof.key_averages()
        busy = device_busy_us(events) / 1e3 / self.num_steps if cuda else float("nan")
        # MiB, not GiB: a tiny model's steps hold under the 5 MiB that "0.00 GiB" would round
        peak = ((torch.cuda.max_memory_allocated(self.device) - self.start_bytes) / 2**20
                if cuda else float("nan"))
        logger.info("profile of %d steps: %.1f ms a step, the device busy %.1f ms of it, "
                    "%.2f MiB at most above the steps' start\n%s",
                    self.num_steps, wall * 1e3, busy, peak, events.table(
                        sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                        row_limit=30))
        self.prof = None


def device_busy_us(events) -> float:
    """Microseconds the device spent in kernels, from profiler events: each kernel counted
    once, by its own device event (an op's self device time repeats its kernels', so summing
    every event counts a kernel twice)."""
    return sum(e.self_device_time_total for e in events
               if e.device_type != DeviceType.CPU and not e.is_user_annotation)

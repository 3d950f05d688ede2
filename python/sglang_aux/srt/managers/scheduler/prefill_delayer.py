"""Holding back a prefill until more arrivals can share it (`--enable-prefill-delayer`).

A prefill step stalls every running request for its length, and on a small model that length
hardly depends on how many requests share it: a prefill graph takes up to `batch` requests for
about the cost of one. Under steady traffic arrivals trickle in one per step or two, so without
delay nearly every arrival pays its own prefill step. While requests are running, the delayer
lets decode steps go on until `batch` requests wait (or as many as the free rows take), or until
the oldest waiting request has been passed over `max_delay_passes` times; SGLang's flag of the
same name serves the same end (there across data-parallel ranks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefillDelayer:
    batch: int  # requests one prefill takes at about the cost of one
    max_delay_passes: int
    delayed: int = 0  # steps the waiting requests have been passed over since the last prefill

    def __post_init__(self) -> None:
        if self.batch < 1 or self.max_delay_passes < 0:
            raise ValueError(f"a prefill delayer needs batch >= 1 and max delay passes >= 0, "
                             f"got {self.batch} and {self.max_delay_passes}")

    def allow(self, num_waiting: int, num_running: int, max_running: int) -> bool:
        """Whether to prefill now; a False counts one pass (the caller runs a decode step)."""
        want = min(self.batch, max_running - num_running)
        if num_running == 0 or num_waiting >= want or self.delayed >= self.max_delay_passes:
            self.delayed = 0
            return True
        self.delayed += 1
        return False

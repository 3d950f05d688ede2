"""A launched step whose tokens the host has not read yet (what the overlap scheduler holds).

A worker's `prefill` or `decode` queues the forward, the device-side row update and the one
readback, and returns at once. `tokens()` waits for that readback and runs `unpack` for each
request still live: one that finished or was aborted after the launch drops its row (the step
ran for it anyway, into slots and a request row that only later-launched work reuses, so
stream order keeps that safe).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_executor.runner_utils.host_transfer import PendingCopy, PendingRows


@dataclass
class PendingStep:
    reqs: list[Req]
    copy: PendingCopy | PendingRows  # one row per request
    # (request, its readback row) -> its new tokens; the host bookkeeping of one request
    unpack: Callable[[Req, object], list[int]]
    kv_growth: int  # the most tokens the step adds to a request's kv_len (0: a prefill)
    _tokens: list[list[int]] | None = field(default=None, repr=False)

    def tokens(self) -> list[list[int]]:
        """Each request's new tokens (none for a request no longer live); the bookkeeping
        runs once, later calls return the same lists."""
        if self._tokens is None:
            rows = self.copy.wait().tolist()
            self._tokens = [[] if r.finished else self.unpack(r, row)
                            for r, row in zip(self.reqs, rows, strict=True)]
        return self._tokens

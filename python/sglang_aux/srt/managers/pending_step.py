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
from sglang_aux.srt.managers.step_logprobs import StepLogprobs
from sglang_aux.srt.model_executor.runner_utils.host_transfer import PendingCopy, PendingRows
from sglang_aux.srt.sampling.logprobs import PositionLogprobs


@dataclass
class PendingStep:
    reqs: list[Req]
    copy: PendingCopy | PendingRows  # one row per request
    # (request, its readback row) -> its new tokens; the host bookkeeping of one request
    unpack: Callable[[Req, object], list[int]]
    kv_growth: int  # the most tokens the step adds to a request's kv_len (0: a prefill)
    # set: the readback also carries logprobs (`StepLogprobs.pack`)
    logprobs: StepLogprobs | None = None
    _tokens: list[list[int]] | None = field(default=None, repr=False)
    _logprobs: list[list[PositionLogprobs] | None] = field(default_factory=list, repr=False)

    def tokens(self) -> list[list[int]]:
        """Each request's new tokens (none for a request no longer live); the bookkeeping
        runs once, later calls return the same lists."""
        if self._tokens is None:
            host = self.copy.wait()
            if self.logprobs is not None:
                host = self.logprobs.split(host)
            rows = host.tolist()
            self._tokens = [[] if r.finished else self.unpack(r, row)
                            for r, row in zip(self.reqs, rows, strict=True)]
            if self.logprobs is not None:
                self._logprobs = [self.logprobs.output(i, t) for i, t in enumerate(self._tokens)]
        return self._tokens

    def output_logprobs(self) -> list[list[PositionLogprobs] | None]:
        """After `tokens()`: each request's entries of its new tokens (None: it asked for
        none)."""
        return self._logprobs or [None] * len(self.reqs)

"""Which waiting requests one prefill takes: in arrival order, while request rows and KV last,
within a graph's or a mixed forward's limits, with chunked prefill's token cap; each admitted
request gets its reservation (`KvReservation.take`) and the worker's per-request work."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.kv_reservation import KvReservation
from sglang_aux.srt.managers.scheduler.worker import Worker

logger = logging.getLogger(__name__)


class Admission:
    def __init__(self, worker: Worker, kv: KvReservation, eos_token_ids: set[int], *,
                 max_running_requests: int, chunked_prefill_size: int | None,
                 notify: Callable[[Req], None]):
        self.worker = worker
        self.kv = kv
        self.eos_token_ids = eos_token_ids
        self.max_running_requests = max_running_requests
        # set: most new tokens one prefill step runs; a longer prompt is prefilled in chunks
        self.chunked_prefill_size = chunked_prefill_size
        self.notify = notify  # a request that failed at admission
        self.cache_hit_tokens = 0  # prompt tokens admitted with their K/V already cached
        self.admitted_prompt_tokens = 0

    def admit(self, waiting: deque[Req], num_running: int, limits: tuple[int, int] | None,
              strict: bool = False) -> tuple[list[Req], Req | None]:
        """(requests for one prefill, taken from `waiting` in order, the request to prefill
        in chunks or None). With `limits` (a prefill graph's), only as many requests and
        uncached tokens as one graph takes (a larger prefill runs eagerly, many times slower
        on a small model: the rest wait one step). `strict`: the first request must fit the
        token budget too (a mixed forward). With chunked prefill, no more than N uncached
        tokens; a first request with more is admitted as the chunked one instead (a mixed
        forward takes its chunks too)."""
        admitted, tokens = [], 0
        width, budget = limits or (None, None)
        n = self.chunked_prefill_size
        if n is not None:
            budget = n if budget is None else min(budget, n)
        while waiting and num_running + len(admitted) < self.max_running_requests:
            if width is not None and len(admitted) == width:
                break
            req = waiting[0]
            if not self.kv.take(req):
                break
            uncached = len(req.origin_input_ids) - req.kv_len
            if self.next_chunk(req) is not None:
                if admitted:
                    self.kv.untake(req)
                    break
                waiting.popleft()
                if self._admit_one(req):
                    return [], req
                continue
            if (admitted or strict) and budget is not None and tokens + uncached > budget:
                self.kv.untake(req)
                break
            waiting.popleft()
            if self._admit_one(req):
                tokens += uncached
                admitted.append(req)
        return admitted, None

    def next_chunk(self, req: Req) -> int | None:
        """Tokens of `req`'s next prefill step when it is a chunk that is not the last; None
        when the rest runs in one prefill. Prompt logprobs come from one prefill of the
        positions from their start on (`StepLogprobs`), so chunks stop there."""
        n, rest = self.chunked_prefill_size, len(req.origin_input_ids) - req.kv_len
        if n is None or rest <= n:
            return None
        stop = len(req.origin_input_ids) if req.logprob is None else req.logprob.start_len
        return min(n, stop - req.kv_len) if stop > req.kv_len else None

    def _admit_one(self, req: Req) -> bool:
        """The worker's per-request admission work; an error there is this request's alone:
        it fails (finish reason `abort` with the message), its row and KV go back and the
        prefix cache keeps what it holds, while the others are admitted and run."""
        try:
            self.worker.admit(req, self.eos_token_ids)
        except Exception as e:
            logger.warning("request %s failed at admission: %r", req.rid, e)
            self.kv.untake(req)
            req.finished_reason = {"type": "abort", "message": f"admission failed: {e}"}
            self.notify(req)
            return False
        self.cache_hit_tokens += req.cached_tokens
        self.admitted_prompt_tokens += len(req.origin_input_ids)
        return True

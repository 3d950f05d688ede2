"""What the scheduler drives: `ModelWorker` (managers/model_worker.py) or a speculative worker
(speculative/dflash_worker.py), typed here so that this layer never imports the one above it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import Req

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.model_runner import ModelRunner


class Worker(Protocol):
    tokens_per_req: int  # most tokens one decode step can add to a request
    logprob_refusal: str | None  # why requests asking for logprobs are refused; None: served

    @property
    def model_runner(self) -> ModelRunner: ...  # the target's: pools, graph limits, device

    # the worker's own step counters, reported among the scheduler's statistics
    @property
    def step_stats(self) -> dict[str, int]: ...

    def server_info(self) -> dict: ...  # what /get_server_info adds for this worker

    # per-request work once its row and KV are reserved; raising fails that request alone
    def admit(self, req: Req, eos_token_ids: set[int]) -> None: ...

    def prefill(self, reqs: list[Req]) -> PendingStep: ...  # rows and KV already reserved

    def decode(self, reqs: list[Req]) -> PendingStep: ...

    # the K/V (and draft context) of `req`'s next `num_tokens` prompt tokens: a chunk of a
    # chunked prefill that is not its last; nothing sampled, nothing read back
    def prefill_chunk(self, req: Req, num_tokens: int) -> None: ...

    # a decode step of `reqs` with the prefill of `arrivals` in one forward: (step, prefill);
    # with `chunk`, of the one chunked request's next `chunk` tokens, not its last: (step,)
    def mixed(self, reqs: list[Req], arrivals: list[Req],
              chunk: int | None = None) -> list[PendingStep]: ...

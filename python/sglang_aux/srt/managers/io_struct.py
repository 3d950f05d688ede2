"""What the HTTP front end and the scheduler process send each other over their pipes.

Front end -> scheduler, one tuple per command, taken between steps:
  ("add", rid, input_ids, SamplingParams, seed, LogprobParams | None)  a validated request
  ("abort", rid)                                  its client went away
  ("flush_cache", reply_id) / ("info", reply_id)  answered with a "reply"
  ("stop",)
Scheduler -> front end:
  ("ready", EngineSpec) or ("startup_error", exception, traceback text), once
  ("step", [(rid, new_ids, NewLogprobs | None, Finished | None), ...])  one message per
                                                  step, every update
  ("failed", [rid, ...], reason)                  these requests failed (a step, or one's
                                                  admission)
  ("aborted", rid)                                the request was dropped
  ("reply", reply_id, value)
Token ids travel as lists and requests as their fields: nothing holds a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.logprobs import PositionLogprobs
from sglang_aux.srt.server_args import ServerArgs


@dataclass(frozen=True)
class EngineSpec:
    """What the front end needs of the engine, sent once when it is ready."""

    server_args: ServerArgs  # as the engine resolved them (model_path is the folder)
    tokenizer: Tokenizer
    limits: RequestLimits
    vocab_size: int
    architecture: str
    context_len: int
    dtype: str  # "float32", ...
    device: str
    radix_cache: bool  # whether the prefix cache is on
    pid: int  # the scheduler process's


@dataclass(frozen=True)
class Finished:
    """A finished request's fields that its output dict reads (besides the token ids)."""

    finished_reason: dict
    cached_tokens: int
    spec_verify_ct: int
    spec_accepted_tokens: int
    spec_accept_histogram: list[int]
    spec_verify_tokens: int

    @classmethod
    def of(cls, req: Req) -> Finished:
        return cls(req.finished_reason, req.cached_tokens, req.spec_verify_ct,
                   req.spec_accepted_tokens, list(req.spec_accept_histogram),
                   req.spec_verify_tokens)

    def apply(self, req: Req) -> None:
        """Copy the fields onto the front end's copy of the request."""
        req.finished_reason = self.finished_reason
        req.cached_tokens = self.cached_tokens
        req.spec_verify_ct = self.spec_verify_ct
        req.spec_accepted_tokens = self.spec_accepted_tokens
        req.spec_accept_histogram = self.spec_accept_histogram
        req.spec_verify_tokens = self.spec_verify_tokens


@dataclass(frozen=True)
class NewLogprobs:
    """The logprob entries an update brings (only to a request that asks): the prompt's,
    with the first update after its prefill, and those of the update's new output ids."""

    input: list[PositionLogprobs]
    output: list[PositionLogprobs]


# rid, new output ids, their logprob entries, set on the last
RequestOut = tuple[str, list[int], NewLogprobs | None, Finished | None]

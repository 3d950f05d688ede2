"""What the HTTP front end and the scheduler process send each other over their pipes: one
frozen dataclass per kind, pickled; each receiver dispatches on the class (`match`) and an
unknown one is an error naming its type.

Front end -> scheduler (`SchedulerCommand`), taken between steps:
  `AddRequest` a validated request; `AbortRequest` its client went away; `FlushCacheRequest`
  and `InfoRequest`, each answered with a `Reply`; `Stop`.
Scheduler -> front end (`SchedulerMessage`):
  `Ready` or `StartupError`, once; `StepOutput` one message per step, every request's update;
  `RequestsFailed` these requests failed (a step, or one's admission); `RequestAborted` the
  request was dropped; `Reply`.
A follower rank that fails sends its starter one `RankFailed`.
Token ids travel as lists and requests as their fields: nothing holds a tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.logprobs import LogprobParams, PositionLogprobs
from sglang_aux.srt.sampling.sampling_params import SamplingParams
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


@dataclass(frozen=True)
class RequestOut:
    """One request's update of a step: its new output ids, their logprob entries, and on its
    last update, `finished`."""

    rid: str
    new_ids: list[int]
    logprobs: NewLogprobs | None = None
    finished: Finished | None = None


# ---- front end -> scheduler ----

@dataclass(frozen=True)
class AddRequest:
    """A request the front end validated against the engine's limits."""

    rid: str
    input_ids: list[int]
    sampling_params: SamplingParams
    seed: int
    logprob: LogprobParams | None

    def to_req(self) -> Req:
        return Req(self.rid, self.input_ids, self.sampling_params, seed=self.seed,
                   logprob=self.logprob)


@dataclass(frozen=True)
class AbortRequest:
    """Drop the request: its client went away."""

    rid: str


@dataclass(frozen=True)
class FlushCacheRequest:
    """Free the prefix cache when idle; the `Reply` carries the slots freed (None: busy)."""

    reply_id: int


@dataclass(frozen=True)
class InfoRequest:
    """The scheduler process's figures (`scheduler_info.engine_info`) in a `Reply`."""

    reply_id: int


@dataclass(frozen=True)
class Stop:
    """Leave the loop, telling the follower ranks to stop too."""


SchedulerCommand = AddRequest | AbortRequest | FlushCacheRequest | InfoRequest | Stop


# ---- scheduler -> front end ----

@dataclass(frozen=True)
class Ready:
    """The engine is built; what the front end needs of it."""

    spec: EngineSpec


@dataclass(frozen=True)
class StartupError:
    """Why the engine could not be built: the exception (its type and message when it does
    not pickle) and the child's traceback text."""

    error: BaseException
    traceback: str


@dataclass(frozen=True)
class StepOutput:
    """Every request's update of one step, in one message."""

    updates: list[RequestOut]


@dataclass(frozen=True)
class RequestsFailed:
    """These requests failed (a step raised, or one's admission did), saying why."""

    rids: list[str]
    reason: str


@dataclass(frozen=True)
class RequestAborted:
    """The request an `AbortRequest` named was dropped (it had not finished)."""

    rid: str


@dataclass(frozen=True)
class Reply:
    """The answer to the `FlushCacheRequest` or `InfoRequest` of `reply_id`."""

    reply_id: int
    value: object


SchedulerMessage = Ready | StartupError | StepOutput | RequestsFailed | RequestAborted | Reply


@dataclass(frozen=True)
class RankFailed:
    """A follower rank's failure, sent to the process that started it before it exits."""

    rank: int
    error: str  # "TypeName: message"

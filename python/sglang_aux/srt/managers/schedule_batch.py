"""Requests and the ForwardBatches built from them.

A request's KV holds `kv_len` tokens: the prompt and every output token but the last, whose
K/V is written by the forward that consumes it. Its reservation, `kv_reserved` slots mapped
once in its `req_to_token` row (`reserve_kv`), covers every position it can ever write, so a
decode step allocates nothing: its slots are a gather from the row.

With the prefix cache, positions `[0, cached_tokens)` of a row map to slots the cache owns
(shared with other requests, read only: every forward writes at `>= kv_len` only) and the
rest of the reservation is the request's own.

Invariant (speculative steps): positions `[kv_len, kv_reserved)` hold K/V that no forward
reads before writing it again. A step writes its whole block at `[kv_len, kv_len + width)`
and attention reads only `< seq_lens`, its own block included; the positions of rejected
drafts fall past the new `kv_len`, so the next step overwrites them before any read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_aux.srt.constrained.request_grammar import RequestGrammar
from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardMode,
)
from sglang_aux.srt.mem_cache.radix_cache import TreeNode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.sampling.logprobs import LogprobParams, PositionLogprobs
from sglang_aux.srt.sampling.sampling_params import SamplingParams


@dataclass
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_len: int = 0
    kv_reserved: int = 0  # positions `[0, kv_reserved)` of the row have slots
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    # the cached prefix's end in the tree, locked while the request runs
    last_node: TreeNode | None = field(default=None, repr=False)
    # the most that launched steps whose tokens the host has not read add to kv_len (the
    # row's device kv_len is at most kv_len + pending_tokens)
    pending_tokens: int = 0
    finished_reason: dict | None = None
    seed: int = 0  # keys the request's random draws (with the token position)
    # speculative bookkeeping: verify steps and tokens they produced (accepted drafts + bonus)
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    # target tokens those steps verified (a block each; fewer under DSpark's compact verify)
    spec_verify_tokens: int = 0
    # [num_draft_tokens]: entry i counts the verify steps that accepted i drafts
    spec_accept_histogram: list[int] = field(default_factory=list)
    logprob: LogprobParams | None = None  # set: the request asks for logprobs
    input_logprobs: list[PositionLogprobs] = field(default_factory=list)  # from start_len
    output_logprobs: list[PositionLogprobs] = field(default_factory=list)  # per output token
    # set at admission when its sampling params name a grammar (`Scheduler`)
    grammar: RequestGrammar | None = field(default=None, repr=False)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def record_spec_verify(self, accepted_drafts: int, num_draft_tokens: int,
                           verify_tokens: int) -> None:
        """One verify step of a `num_draft_tokens` block that verified `verify_tokens` of it
        and accepted `accepted_drafts`."""
        if not self.spec_accept_histogram:
            self.spec_accept_histogram = [0] * num_draft_tokens
        self.spec_verify_ct += 1
        self.spec_verify_tokens += verify_tokens
        self.spec_accepted_tokens += accepted_drafts + 1
        self.spec_accept_histogram[accepted_drafts] += 1


def reserve_kv(runner: ModelRunner, req: Req, n: int) -> None:
    """Map positions `[kv_reserved, n)` of the request's row to fresh slots (one allocation,
    one row write); a no-op when `n` is already covered."""
    if n <= req.kv_reserved:
        return
    slots = runner.token_to_kv_pool_allocator.alloc(n - req.kv_reserved)
    runner.req_to_token_pool.write(req.req_pool_idx, req.kv_reserved, slots)
    req.kv_reserved = n


def map_cached_prefix(runner: ModelRunner, req: Req, slots: torch.Tensor) -> None:
    """Positions `[0, len(slots))` of the request's fresh row read the cache's `slots`: the
    request starts with that much K/V (target and, with DFlash, draft context) in place."""
    if req.kv_reserved:
        raise RuntimeError(f"request {req.rid} already holds {req.kv_reserved} slots")
    runner.req_to_token_pool.write(req.req_pool_idx, 0, slots)
    req.kv_len = req.kv_reserved = req.cached_tokens = slots.numel()


def release_kv(runner: ModelRunner, req: Req, keep: int = 0) -> None:
    """Give back the slots of positions `[keep, kv_reserved)` and the request row; the first
    `keep` belong elsewhere now (the prefix cache)."""
    row = req.req_pool_idx
    pool = runner.req_to_token_pool
    runner.token_to_kv_pool_allocator.free(pool.req_to_token[row, keep : req.kv_reserved])
    pool.free(row)
    req.req_pool_idx, req.kv_reserved = None, 0


def _extend_lists(runner: ModelRunner, reqs: list[Req], chunk: int | None = None
                  ) -> tuple[list[int], list[int], list[int], list[int], list[int]]:
    """Host lists of every request's uncached tokens, or of its next `chunk` of them
    (reserving slots where the reservation is short; kv_len then counts them): ids,
    positions, token rows, prefix and new lengths."""
    ids, positions, token_rows, prefix, ext = [], [], [], [], []
    for r in reqs:
        tokens = (r.origin_input_ids + r.output_ids)[r.kv_len:]
        if chunk is not None:
            tokens = tokens[:chunk]
        reserve_kv(runner, r, r.kv_len + len(tokens))
        ids += tokens
        positions += range(r.kv_len, r.kv_len + len(tokens))
        token_rows += [r.req_pool_idx] * len(tokens)
        prefix.append(r.kv_len)
        ext.append(len(tokens))
        r.kv_len += len(tokens)
    return ids, positions, token_rows, prefix, ext


def extend_inputs(runner: ModelRunner, reqs: list[Req],
                  capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL,
                  chunk: int | None = None) -> ForwardInputs:
    """A prefill of every request's uncached tokens, or of its next `chunk` of them (chunked
    prefill), reserving slots where the reservation is short (kv_len then counts them), as
    host values (`ModelRunner.prepare` makes the batch: one copy, the slots gathered from the
    request rows on the device)."""
    ids, positions, token_rows, prefix, ext = _extend_lists(runner, reqs, chunk)
    return ForwardInputs(ForwardMode.EXTEND, arrival_rows=[r.req_pool_idx for r in reqs],
                         ids=ids, positions=positions, token_rows=token_rows, prefix=prefix,
                         ext=ext, capture_hidden_mode=capture_hidden_mode)


def _step_bounds(reqs: list[Req], tokens_per_req: int) -> list[int]:
    """Upper bounds of the requests' device kv_lens, checked against their reservations."""
    bounds = [r.kv_len + r.pending_tokens for r in reqs]
    for r, bound in zip(reqs, bounds, strict=True):
        if bound + tokens_per_req > r.kv_reserved:
            raise RuntimeError(f"request {r.rid}: a {tokens_per_req}-token step at up to "
                               f"{bound} passes its {r.kv_reserved} reserved slots")
    return bounds


def step_inputs(reqs: list[Req], mode: ForwardMode, tokens_per_req: int) -> ForwardInputs:
    """A decode step of `tokens_per_req` tokens per request at positions `[kv_len, kv_len +
    tokens_per_req)` of each row's device kv_len. The host sends the rows; the runner's
    `StepPrologue` for `mode` derives the rest on the device (the row's last token first,
    then the prologue's block tokens or fill token)."""
    return ForwardInputs(mode, step_rows=[r.req_pool_idx for r in reqs],
                         step_kv_bounds=_step_bounds(reqs, tokens_per_req),
                         step_width=tokens_per_req)


def mixed_inputs(runner: ModelRunner, reqs: list[Req], arrivals: list[Req],
                 tokens_per_req: int, chunk: int | None = None) -> ForwardInputs:
    """One MIXED forward: a step of `tokens_per_req` tokens for each of `reqs`, as
    `step_inputs` steps them, then the prefill of every arrival's uncached tokens, or of its
    next `chunk` of them (chunked prefill), as `extend_inputs` does (reserving its slots).

    The batch `ModelRunner.prepare` makes has its logits rows in this order: every live step
    token, each arrival's last token, then padding; so `next_token_logits[:len(reqs) *
    tokens_per_req + len(arrivals)]` are the live ones. Requests: the step ones from 0, the
    arrivals from `mixed_step_bs`."""
    if not reqs or not arrivals:
        raise ValueError(f"a mixed batch needs step requests and arrivals, got {len(reqs)} "
                         f"and {len(arrivals)}")
    bounds = _step_bounds(reqs, tokens_per_req)
    ids, positions, token_rows, prefix, ext = _extend_lists(runner, arrivals, chunk)
    return ForwardInputs(ForwardMode.MIXED, step_rows=[r.req_pool_idx for r in reqs],
                         step_kv_bounds=bounds, arrival_rows=[r.req_pool_idx for r in arrivals],
                         ids=ids, positions=positions, token_rows=token_rows, prefix=prefix,
                         ext=ext, step_width=tokens_per_req)

"""A ragged step's inputs: requests of different token counts, spread over one token-major
forward on the device.

DSpark's compact verify gives request i `lens[i]` tokens (its anchor, then `lens[i] - 1`
drafts), counts the device chose from the draft's confidences, which the host never reads.
So the forward is laid out token-major: each of its `n` tokens (a captured token bucket) is
a pseudo-request of width 1 with its own row, position, KV slot and length (position + 1).
The fixed-layout attention already masks per query (`key < seq_len`, causal on positions),
so a token sees its request's context and the block tokens before it, and padding costs
only the bucket's rounding, never a request's unused drafts. (Padding each request to the
longest length with a mask would spend the tokens compact verify exists to save.)

The host sends the requests' rows, padded to `n` with the padding row; `lens` (owner's
static storage) holds their counts, 0 past the live requests. The prologue keeps the rows in
`request_rows` (the epilogue and the host need them per request), then overwrites the
batch's `req_pool_indices` with each token's row. Tokens past the live ones are inert: the
padding row at position 0, as a padded step request.

It also sets `fb.ragged` (`RaggedRequests`): each request's row, length, context before the
step and first token row, `[min(n, max_requests)]` each (no step holds more requests), so
an attention backend that can (Triton's) reads a request's keys once for all its tokens
instead of once per token, with no program for a slot no request can take.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue


@dataclass(frozen=True, kw_only=True)
class RaggedStepPrologue(StepPrologue):
    # n -> `[n]` int64 tokens per request (0 past the live ones), static storage
    lens: Callable[[int], torch.Tensor]
    # n -> `[n]` int64 static storage the prologue fills with the requests' rows
    request_rows: Callable[[int], torch.Tensor]
    width: int  # the most tokens a request verifies (its lens never exceed it)
    # the most requests a step holds (0: one per token): `fb.ragged` covers that many slots,
    # so attention launches no program for slots no request can take
    max_requests: int = 0

    def __post_init__(self):
        if self.width < 1:
            raise ValueError(f"a ragged step's width must be >= 1, got {self.width}")
        if self.max_requests < 0:
            raise ValueError(f"a ragged step's most requests must be >= 0 (0: one per token), "
                             f"got {self.max_requests}")

    def __call__(self, fb: ForwardBatch) -> None:
        n = fb.batch_size  # tokens, one pseudo-request each
        pool = fb.req_to_token_pool
        req_rows = self.request_rows(n)
        req_rows.copy_(fb.req_pool_indices)
        lens = self.lens(n)
        ends = lens.cumsum(0)
        starts = ends - lens
        token = torch.arange(n, device=lens.device)
        owner = torch.searchsorted(ends, token, right=True).clamp_max_(n - 1)
        live = token < ends[-1]
        offset = torch.where(live, token - starts[owner], 0)
        r = min(n, self.max_requests) if self.max_requests else n
        fb.ragged = RaggedRequests(request_rows=req_rows[:r], lens=lens[:r],
                                   prefix_lens=pool.kv_lens[req_rows[:r]], q_start=starts[:r],
                                   width=self.width)
        rows = torch.where(live, req_rows[owner], PADDING_REQ_ROW)
        torch.add(pool.kv_lens[rows], offset, out=fb.positions)
        fb.out_cache_loc.copy_(pool.req_to_token[rows, fb.positions])
        if self.block_tokens is None:
            drafted = torch.full_like(offset, self.fill_token_id)
        else:
            block = self.block_tokens(n)  # `[<= n, width - 1]`: the owner's rows
            drafted = block[owner.clamp_max(block.shape[0] - 1), (offset - 1).clamp_min(0)]
        fb.input_ids.copy_(torch.where(offset == 0, pool.last_tokens[rows], drafted))
        fb.req_pool_indices.copy_(rows)
        torch.add(fb.positions, 1, out=fb.seq_lens)

"""How many tokens each request verifies this step (`--speculative-verify-mode`), and the
verify forward that runs them.

static: every request verifies its whole verify width W, `[anchor, proposals]`, in a
request-major TARGET_VERIFY forward (graphs per batch size); under a draft length schedule
narrower at some batch sizes, the leading w(bs) of it (graphs per batch size and width).

compact (SGLang's `SGLANG_RAGGED_VERIFY_MODE=compact`, here for the whole family): each
proposal k of a request comes with a confidence, the estimated probability that it is
accepted given proposals 0..k-1 were: DSpark's confidence head, or for DFlash, whose draft has
none, the draft's own probability of its proposal (`draft_proposals.max_probability`).
Proposal k is accepted only if proposals 0..k all are, so its survival is
`cumprod(confidence[r])[k]`, and verifying it is worth that survival in expected accepted
tokens. Every request verifies its anchor (1 token); the budget's extra tokens go to the
globally most likely survivals, one top-k over all requests (SGLang's `compact` mode), so a
request verifies 1 + (its chosen survivals) <= W tokens. Survivals below `survival_eps` are
never chosen. Ties go to the earlier block position, then the lower request index. Survival
does not grow along a row, so each request's choice is a prefix. The verify forward is ragged
(`RaggedStepPrologue`: token-major, graphs per token bucket); the step's bucket is the one
that holds the most the budget allows, `bs + min(budget, bs * (W - 1))`, known on the host
without reading the confidences: no host sync, fixed shapes. A step whose logits are
processed, grammar-restricted or scored verifies every token, as static. The draft length
schedule's width for the step's batch size caps the budget (`plan`'s `width`; 1: the anchors
alone), whichever of the two is smaller.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts, StreamedAux
from sglang_aux.srt.model_executor.runner.ragged_step_prologue import RaggedStepPrologue
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.server_args import ServerArgs

SURVIVAL_EPS = 1e-6  # SGLang's default


@dataclass
class CompactVerifyLens:
    verify_lens: torch.Tensor  # [bs] int32, in [1, W], summing to <= num_tokens
    num_tokens: int  # the captured token bucket the step's verify graph runs


def round_up_to_bucket(num_tokens: int, buckets: Sequence[int]) -> int:
    """The smallest captured token bucket holding `num_tokens`."""
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
        raise ValueError(f"token buckets must be distinct, ascending and >= 1, got "
                         f"{list(buckets)}")
    if num_tokens > buckets[-1]:
        raise ValueError(f"{num_tokens} verify tokens exceed the largest captured bucket "
                         f"{buckets[-1]}")
    return buckets[bisect.bisect_left(buckets, num_tokens)]


def compact_verify_lens(confidence: torch.Tensor, budget: int, buckets: Sequence[int],
                        survival_eps: float = SURVIVAL_EPS) -> CompactVerifyLens:
    """Verify lengths for confidences `[bs, W - 1]` (each in [0, 1]) under `budget` extra
    tokens beyond one per request, and the token bucket of the step."""
    if confidence.dim() != 2 or confidence.shape[0] < 1 or confidence.shape[1] < 1:
        raise ValueError(f"confidence {tuple(confidence.shape)} must be [bs >= 1, "
                         "proposals >= 1]")
    if budget < 0:
        raise ValueError(f"the verify token budget must be >= 0, got {budget}")
    bs, num_proposals = confidence.shape
    take = min(budget, bs * num_proposals)
    num_tokens = round_up_to_bucket(bs + take, buckets)
    survival = torch.cumprod(confidence.float(), dim=1)  # [bs, W - 1]
    # position-major: flat index k * bs + r, so a stable sort breaks ties by (k, r)
    flat = survival.t().reshape(-1)
    valid = flat >= survival_eps
    order = torch.argsort(torch.where(valid, flat, -1.0), descending=True, stable=True)
    chosen = order[:take]
    extra = torch.zeros(bs, dtype=torch.int64, device=confidence.device)
    extra.scatter_add_(0, chosen % bs, valid[chosen].to(torch.int64))
    return CompactVerifyLens((1 + extra).to(torch.int32), num_tokens)


class VerifyPlan:
    """A speculative worker's verify planning: the mode, compact verify's budget, and the
    per-step lengths and request rows a ragged verify forward reads (row prefixes of storage
    allocated once, borrowed until the next verify step)."""

    def __init__(self, server_args: ServerArgs, verify_width: int, rows: int,
                 target_runner: ModelRunner):
        self.compact = server_args.speculative_verify_mode == "compact"
        self.verify_width = verify_width
        self.align_to_bucket = server_args.speculative_dspark_align_verify_tokens_to_graph_tier
        self.budget_frac = server_args.compact_verify_budget_frac
        self.max_tokens = server_args.compact_verify_max_tokens
        self.target_runner = target_runner  # its captured token buckets
        device = target_runner.device
        self.max_requests = rows  # a step's most requests: a ragged step's request slots
        # a ragged step's per-token lengths and request rows (at most every request's W)
        self.verify_lens = torch.zeros(rows * verify_width, dtype=torch.int64, device=device)
        self.request_rows = torch.zeros(rows * verify_width, dtype=torch.int64, device=device)

    def forward_parts(self, proposals: torch.Tensor, epilogue: Epilogue,
                      streamed_aux: StreamedAux | None) -> ForwardParts:
        """The TARGET_VERIFY forward: its prologue builds `[anchor, proposals]` from
        `proposals` `[rows, W - 1]` (static; a narrower step takes the leading ones), or
        spreads them over a ragged step's tokens."""
        w = self.verify_width
        if not self.compact:
            return ForwardParts(epilogue.mode, w,
                                StepPrologue(block_tokens=lambda bs: proposals[:bs]),
                                epilogue, streamed_aux)
        prologue = RaggedStepPrologue(block_tokens=lambda n: proposals[:n],
                                      lens=lambda n: self.verify_lens[:n],
                                      request_rows=lambda n: self.request_rows[:n],
                                      width=w, max_requests=self.max_requests)
        return ForwardParts(epilogue.mode, w, prologue, epilogue, streamed_aux, ragged=True)

    def ragged_inputs(self, inputs: ForwardInputs, every_token: bool,
                      confidence: torch.Tensor, width: int) -> ForwardInputs:
        """A compact verify step's inputs: `plan`'s token count, token-major, the requests'
        rows first; each token's length bounded by its request's bound plus W."""
        bs = len(inputs.step_rows)
        n = self.plan(bs, every_token, confidence, width)
        bound = max(inputs.step_kv_bounds) + self.verify_width - 1
        return dataclasses.replace(
            inputs, step_rows=inputs.step_rows + [PADDING_REQ_ROW] * (n - bs),
            step_kv_bounds=[bound] * n, step_width=1)

    def budget(self, bs: int) -> int:
        """The most proposals a step of `bs` requests verifies beyond their anchors under
        `--compact-verify-budget-frac` or `--compact-verify-max-tokens`."""
        proposals = bs * (self.verify_width - 1)
        if self.max_tokens is not None:
            return min(proposals, max(0, self.max_tokens - bs))
        return min(proposals, round(self.budget_frac * proposals))

    def plan(self, bs: int, every_token: bool, confidence: torch.Tensor, width: int) -> int:
        """Each request's verify length into `verify_lens[:bs]` (0 after, up to the step's
        tokens) from its proposals' confidences `[rows, W - 1]`, and the step's token count:
        the captured bucket holding the budget, or exactly the budget where no graph does (an
        eager step). `width` (the draft length schedule's, <= W) caps the budget at
        `bs * (width - 1)` proposals; 1 verifies the anchors alone. No host sync: the lengths
        stay on the device."""
        w = self.verify_width
        if every_token:
            take = bs * (w - 1)
        else:
            take = min(self.budget(bs), bs * (width - 1))
        graphs = self.target_runner.step_graphs
        buckets = [x.step_bs for x in graphs.layouts] if graphs is not None else []
        if not buckets or bs + take > buckets[-1]:
            buckets = [bs + take]
        if every_token:
            lens = torch.full((bs,), w, dtype=torch.int64, device=self.verify_lens.device)
            num_tokens = round_up_to_bucket(bs + take, buckets)
        else:
            if self.align_to_bucket:
                take = min(round_up_to_bucket(bs + take, buckets) - bs, bs * (width - 1))
            plan = compact_verify_lens(confidence[:bs], take, buckets)
            lens, num_tokens = plan.verify_lens, plan.num_tokens
        self.verify_lens[:num_tokens].zero_()
        self.verify_lens[:bs] = lens
        return num_tokens

    def block_index(self, n: int, r: int) -> torch.Tensor:
        """`[r, W]`: the token rows of the first `r` requests' verify tokens in a ragged
        forward of `n` tokens (rows past a request's length repeat a valid row, never read)."""
        lens = self.verify_lens[:n]
        starts = lens.cumsum(0) - lens
        offsets = torch.arange(self.verify_width, device=lens.device)
        return (starts[:r, None] + offsets).clamp_max_(n - 1)

"""What one forward holds, and its inputs: host values in one packed int64 tensor.

A `ForwardLayout` gives a forward's sizes, padding included: `step_bs` requests taking a step
of `tokens_per_req` tokens each (DECODE, TARGET_VERIFY, DRAFT_BLOCK, and the lead of a MIXED
forward), then `arrivals` requests prefilling `arrival_tokens` new tokens (EXTEND, and the
rest of a MIXED forward). A step's logits rows are every step token's, or with
`logits_per_req` n each request's tokens at block offsets 1..n (a DFlash draft block's
proposals, of which a static step narrower than the block verifies n). A captured graph has
one layout; an eager forward's is its live sizes.

The host knows the step requests' rows and the arrivals' tokens (`ForwardInputs`, built by
`managers/schedule_batch.py`). `ForwardLayout.pack` lays them out as one int64 tensor, each
ForwardBatch field a view of it, so one copy lands every host value in place (a step's host
values are only its rows). `ForwardLayout.complete` derives the rest on the device: the step
requests' tokens, positions, slots and lengths from their rows (`StepPrologue`), their prefix
lengths, and the arrival tokens' KV slots. A graph runs it inside the graph, before the model;
an eager forward runs it right after the copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import AuxProjection
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

# The packed tensor's parts, in order: the host writes every part before `out_cache_loc` (a
# step: `req_pool_indices` only), `complete` writes the rest.
_PARTS = ("req_pool_indices", "seq_lens", "extend_prefix_lens", "extend_seq_lens",
          "extend_start_loc", "logits_rows", "token_rows", "input_ids", "positions",
          "out_cache_loc")


@dataclass(frozen=True)
class ForwardInputs:
    """What the host sends for one forward: the rows of the requests taking a step (and upper
    bounds of their device kv_lens), and each arrival's row and uncached tokens."""

    mode: ForwardMode
    step_rows: list[int] = field(default_factory=list)
    step_kv_bounds: list[int] = field(default_factory=list)
    arrival_rows: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)  # the arrivals' new tokens, in order
    positions: list[int] = field(default_factory=list)
    token_rows: list[int] = field(default_factory=list)  # each new token's request row
    prefix: list[int] = field(default_factory=list)  # per arrival: cached tokens
    ext: list[int] = field(default_factory=list)  # per arrival: new tokens
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    aux_projection: AuxProjection | None = None  # a staged MXFP8 fc input (eager only)
    # tokens per step request; 0: the mode's registered width (`ForwardParts.layout_width`)
    step_width: int = 0
    # logits rows per step request (block offsets 1..n); 0: the mode's registered count
    # (`ForwardParts.logits_per_req`)
    logits_per_req: int = 0


@dataclass(frozen=True)
class PackedInputs:
    """`ForwardLayout.pack`'s result: the one copy, and host lists for host-side code."""

    values: list[int]  # the packed tensor's host part
    # [num_reqs]: upper bounds of the lengths (a step request's device kv_len may be lower,
    # overlap), cached and new tokens per request
    seq_lens_cpu: list[int]
    extend_prefix_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]
    live_logits_rows: int  # the first rows of the logits are the live requests'


@dataclass(frozen=True)
class ForwardLayout:
    mode: ForwardMode
    step_bs: int = 0
    tokens_per_req: int = 0
    arrivals: int = 0
    arrival_tokens: int = 0
    logits_per_req: int = 0  # a step request's logits rows: block offsets 1..n; 0: every token

    def __post_init__(self):
        if self.logits_per_req and not (0 < self.logits_per_req < self.tokens_per_req
                                        and self.mode.is_cuda_graph()):
            raise ValueError(f"{self.logits_per_req} logits rows per request need a step mode "
                             f"of more tokens per request, got {self}")

    @classmethod
    def of(cls, inputs: ForwardInputs, tokens_per_req: int,
           logits_per_req: int = 0) -> ForwardLayout:
        """The live layout of `inputs` (no padding)."""
        step = bool(inputs.step_rows)
        return cls(inputs.mode, len(inputs.step_rows), tokens_per_req if step else 0,
                   len(inputs.arrival_rows), len(inputs.ids), logits_per_req if step else 0)

    def fits(self, live: ForwardLayout) -> bool:
        return (live.mode == self.mode and live.step_bs <= self.step_bs
                and live.tokens_per_req in (0, self.tokens_per_req)
                and live.logits_per_req == (self.logits_per_req if live.step_bs else 0)
                and live.arrivals <= self.arrivals and live.arrival_tokens <= self.arrival_tokens)

    @property
    def step_tokens(self) -> int:
        return self.step_bs * self.tokens_per_req

    @property
    def num_tokens(self) -> int:
        return self.step_tokens + self.arrival_tokens

    @property
    def num_reqs(self) -> int:
        return self.step_bs + self.arrivals

    @property
    def num_logits_rows(self) -> int:
        """Every step token's (or `logits_per_req` a request), then each arrival's last
        token's."""
        return self.step_bs * (self.logits_per_req or self.tokens_per_req) + self.arrivals

    def _sizes(self) -> list[int]:
        t, r = self.num_tokens, self.num_reqs
        e = r if self.mode.is_extend() else 0
        return [r, r, e, e, e, self.num_logits_rows if e else 0, self.arrival_tokens, t, t, t]

    @property
    def num_values(self) -> int:
        """Length of the packed tensor."""
        return sum(self._sizes())

    def pack(self, inputs: ForwardInputs) -> PackedInputs:
        """`inputs` laid out as this layout, padded: padded step requests on the padding row;
        padded arrival tokens and requests inert (the padding row's slot, no new tokens).
        Placeholders (0) stand where `complete` writes. Logits rows: every live step token,
        each arrival's last token, then padding (row 0)."""
        s, w = self.step_bs, self.tokens_per_req
        bs, n, live = len(inputs.step_rows), len(inputs.arrival_rows), len(inputs.ids)
        if not self.fits(ForwardLayout.of(inputs, w, self.logits_per_req)):
            raise ValueError(f"{bs} step requests and {n} arrivals over {live} tokens do not "
                             f"fit {self}")
        pad_s, pad_a, pad_t, st = s - bs, self.arrivals - n, self.arrival_tokens - live, s * w
        rows = [*inputs.step_rows, *[PADDING_REQ_ROW] * pad_s, *inputs.arrival_rows,
                *[PADDING_REQ_ROW] * pad_a]
        seq_lens = [p + e for p, e in zip(inputs.prefix, inputs.ext, strict=True)]
        # a padded step request holds one step at positions [0, w): every query sees a key
        seq_lens_cpu = [b + w for b in inputs.step_kv_bounds] + [w] * pad_s + seq_lens \
            + [1] * pad_a
        prefix_cpu = [*inputs.step_kv_bounds, *[0] * pad_s, *inputs.prefix, *[0] * pad_a]
        ext_cpu = [w] * s + inputs.ext + [0] * pad_a
        if not self.mode.is_extend():
            return PackedInputs(rows, seq_lens_cpu, prefix_cpu, ext_cpu,
                                bs * (self.logits_per_req or w))
        starts = [st + x for x in accumulate(inputs.ext, initial=0)][:-1]
        values = [
            *rows,
            *[0] * s, *seq_lens, *[1] * pad_a,  # seq_lens
            *[0] * s, *inputs.prefix, *[0] * pad_a,  # extend_prefix_lens
            *ext_cpu,  # extend_seq_lens
            *[i * w for i in range(s)], *starts, *[st + live] * pad_a,  # extend_start_loc
            *range(bs * w), *[x + e - 1 for x, e in zip(starts, inputs.ext, strict=True)],
            *[0] * (pad_a + st - bs * w),  # logits_rows
            *inputs.token_rows, *[PADDING_REQ_ROW] * pad_t,  # token_rows
            *[0] * st, *inputs.ids, *[0] * pad_t,  # input_ids
            *[0] * st, *inputs.positions, *[0] * pad_t,  # positions
        ]
        return PackedInputs(values, seq_lens_cpu, prefix_cpu, ext_cpu, bs * w + n)

    def padding(self) -> PackedInputs:
        """A batch of padding only (what a graph's warm-ups and capture read)."""
        return self.pack(ForwardInputs(self.mode))

    def _views(self, packed: torch.Tensor) -> dict[str, torch.Tensor]:
        return dict(zip(_PARTS, packed[: self.num_values].split(self._sizes()), strict=True))

    def batch(self, packed: torch.Tensor, runner: ModelRunnerView, host: PackedInputs,
              seq_lens_cpu: torch.Tensor, **fields) -> ForwardBatch:
        """The ForwardBatch whose int64 tensors are views of `packed`; `fields`: a graph's
        output storage and capture flag, an eager forward's capture mode."""
        views = self._views(packed)
        del views["token_rows"]
        extend = self.mode.is_extend()
        if not extend:
            for name in ("extend_prefix_lens", "extend_seq_lens", "extend_start_loc",
                         "logits_rows"):
                views[name] = None
        return ForwardBatch(
            forward_mode=self.mode,
            batch_size=self.num_reqs,
            **views,
            seq_lens_cpu=seq_lens_cpu,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            extend_prefix_lens_cpu=host.extend_prefix_lens_cpu if extend else None,
            extend_seq_lens_cpu=host.extend_seq_lens_cpu if extend else None,
            mixed_step_bs=self.step_bs if self.mode.is_mixed() else 0,
            mixed_step_width=self.tokens_per_req if self.mode.is_mixed() else 0,
            logits_per_req=self.logits_per_req,
            **fields,
        )

    def complete(self, packed: torch.Tensor, fb: ForwardBatch,
                 step: StepPrologue | None) -> None:
        """Write what the host did not send into `fb` (this layout's batch over `packed`), on
        the device: the step requests' inputs from their rows (`step`), their prefix lengths,
        and the arrival tokens' KV slots from their rows."""
        s, w, t = self.step_bs, self.tokens_per_req, self.step_tokens
        if s:
            if step is None:
                raise ValueError(f"{self.mode.name} forwards need a step prologue")
            sub = fb if not self.mode.is_mixed() else ForwardBatch(
                forward_mode=ForwardMode.TARGET_VERIFY, batch_size=s,
                input_ids=fb.input_ids[:t], req_pool_indices=fb.req_pool_indices[:s],
                seq_lens=fb.seq_lens[:s], seq_lens_cpu=fb.seq_lens_cpu[:s],
                out_cache_loc=fb.out_cache_loc[:t], positions=fb.positions[:t],
                req_to_token_pool=fb.req_to_token_pool, token_to_kv_pool=fb.token_to_kv_pool,
                attn_backend=fb.attn_backend)
            step(sub)
            if self.mode.is_extend():
                torch.sub(fb.seq_lens[:s], w, out=fb.extend_prefix_lens[:s])
        if self.arrival_tokens:
            rows = self._views(packed)["token_rows"]
            fb.out_cache_loc[t:] = fb.req_to_token_pool.req_to_token[rows, fb.positions[t:]]

    def live(self, fb: ForwardBatch, inputs: ForwardInputs) -> dict[str, object]:
        """Fields that narrow this layout's batch to the live requests of `inputs`, where
        they lead (a step, a prefill); a MIXED batch keeps its padded layout."""
        bs, n = len(inputs.step_rows), len(inputs.arrival_rows)
        if self.mode.is_mixed():
            return {}
        reqs = bs or n
        tokens = bs * self.tokens_per_req or len(inputs.ids)
        out = {"batch_size": reqs}
        for name in ("input_ids", "positions", "out_cache_loc"):
            out[name] = getattr(fb, name)[:tokens]
        for name in ("req_pool_indices", "seq_lens", "seq_lens_cpu", "extend_prefix_lens",
                     "extend_seq_lens", "extend_start_loc", "logits_rows"):
            value = getattr(fb, name)
            out[name] = None if value is None else value[:reqs]
        if self.mode.is_extend():
            out["extend_prefix_lens_cpu"] = inputs.prefix
            out["extend_seq_lens_cpu"] = inputs.ext
        return out

"""A MIXED forward's inputs: one packed int64 tensor from the host, completed on the device.

The host knows everything about the arrivals (tokens, positions, rows, lengths) and the layout
(the step requests' rows, extend lengths and start rows, the logits rows). It sends them as
one int64 tensor laid out by `MixedLayout`, each ForwardBatch field a view of it, so the one
copy lands every host value in place. `MixedPrologue` derives the rest from device state: the
step requests' inputs from their rows (`StepPrologue`), their prefix lengths
(`seq_lens - width`) and the arrival tokens' KV slots (a gather from their request rows). A
mixed graph runs it inside the graph, before the model, so a replay needs only the copy; an
eager MIXED forward runs the same code over a fresh tensor (`schedule_batch.build_mixed_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

# The ForwardBatch fields in the packed tensor, in order; after them come the arrival tokens'
# request rows, then `out_cache_loc`, which the prologue writes whole (so the host sends the
# values before it only).
_FIELDS = ("input_ids", "positions", "req_pool_indices", "seq_lens", "extend_prefix_lens",
           "extend_seq_lens", "extend_start_loc", "logits_rows")


@dataclass(frozen=True)
class MixedLayout:
    """The sizes of one MIXED forward, padding included: `step_bs` step requests of `width`
    tokens, then `arrivals` requests over `arrival_tokens` tokens."""

    step_bs: int
    width: int
    arrivals: int
    arrival_tokens: int

    @property
    def num_tokens(self) -> int:
        return self.step_bs * self.width + self.arrival_tokens

    @property
    def num_reqs(self) -> int:
        return self.step_bs + self.arrivals

    @property
    def num_logits_rows(self) -> int:
        return self.step_bs * self.width + self.arrivals

    def _sizes(self) -> list[int]:
        t, r = self.num_tokens, self.num_reqs
        return [t, t, r, r, r, r, r, self.num_logits_rows, self.arrival_tokens, t]

    @property
    def num_values(self) -> int:
        """Length of the packed tensor."""
        return sum(self._sizes())

    def pack(self, *, step_rows: list[int], step_kv_bounds: list[int], arrival_rows: list[int],
             ids: list[int], positions: list[int], token_rows: list[int], prefix: list[int],
             ext: list[int]) -> MixedHostInputs:
        """The host's values for live step requests (their rows, and upper bounds of their
        device kv_lens) and live arrivals (their new tokens' ids, positions and request rows;
        per arrival its row, prefix and new-token counts), padded to this layout: padded step
        requests on the padding row, padded arrival tokens and requests inert as a prefill
        graph's padding. Placeholders (0) stand where the prologue writes.

        Logits rows, in order: every live step token, each arrival's last token, then
        padding (row 0); so the first `len(step_rows) * width + len(arrival_rows)` are live."""
        s, w, bs, n = self.step_bs, self.width, len(step_rows), len(arrival_rows)
        live = len(ids)
        pad_reqs, pad_tokens, step_tokens = self.arrivals - n, self.arrival_tokens - live, s * w
        if bs > s or n > self.arrivals or live > self.arrival_tokens:
            raise ValueError(f"{bs} step requests and {n} arrivals over {live} tokens do not "
                             f"fit {self}")
        starts = [step_tokens + x for x in accumulate(ext, initial=0)][:-1]
        seq_lens = [p + e for p, e in zip(prefix, ext, strict=True)]
        step = [0] * step_tokens
        values = [
            *step, *ids, *[0] * pad_tokens,  # input_ids
            *step, *positions, *[0] * pad_tokens,  # positions
            *step_rows, *[PADDING_REQ_ROW] * (s - bs), *arrival_rows,
            *[PADDING_REQ_ROW] * pad_reqs,  # req_pool_indices
            *[0] * s, *seq_lens, *[1] * pad_reqs,  # seq_lens
            *[0] * s, *prefix, *[0] * pad_reqs,  # extend_prefix_lens
            *[w] * s, *ext, *[0] * pad_reqs,  # extend_seq_lens
            *range(0, step_tokens, w), *starts,
            *[step_tokens + live] * pad_reqs,  # extend_start_loc
            *range(bs * w), *[x + e - 1 for x, e in zip(starts, ext, strict=True)],
            *[0] * (pad_reqs + step_tokens - bs * w),  # logits_rows
            *token_rows, *[PADDING_REQ_ROW] * pad_tokens,  # the arrival tokens' rows
        ]
        return MixedHostInputs(
            layout=self, values=values,
            seq_lens_cpu=[b + w for b in step_kv_bounds] + [w] * (s - bs) + seq_lens
            + [1] * pad_reqs,
            extend_seq_lens_cpu=[w] * s + ext + [0] * pad_reqs)

    def padding(self) -> list[int]:
        """The host values of a batch of padding only (what a graph's warm-up and capture
        read: every row and slot they touch is inert)."""
        return self.pack(step_rows=[], step_kv_bounds=[], arrival_rows=[], ids=[], positions=[],
                         token_rows=[], prefix=[], ext=[]).values

    def _views(self, packed: torch.Tensor
               ) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
        """`packed`'s views: the `_FIELDS`, the arrival tokens' rows, `out_cache_loc`."""
        *fields, token_rows, out_cache_loc = packed[: self.num_values].split(self._sizes())
        return dict(zip(_FIELDS, fields, strict=True)), token_rows, out_cache_loc

    def token_rows(self, packed: torch.Tensor) -> torch.Tensor:
        """`[arrival_tokens]`: each arrival token's request row, in `packed`."""
        return self._views(packed)[1]

    def batch(self, packed: torch.Tensor, runner: ModelRunnerView, *, seq_lens_cpu: torch.Tensor,
              extend_seq_lens_cpu: list[int], **graph_fields) -> ForwardBatch:
        """The MIXED ForwardBatch whose int64 tensors are views of `packed` (its prefix
        `[:num_values]`); `graph_fields`: a graph's output storage and capture flag."""
        fields, _, out_cache_loc = self._views(packed)
        return ForwardBatch(
            forward_mode=ForwardMode.MIXED,
            batch_size=self.num_reqs,
            **fields,
            out_cache_loc=out_cache_loc,
            seq_lens_cpu=seq_lens_cpu,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            extend_seq_lens_cpu=extend_seq_lens_cpu,
            mixed_step_bs=self.step_bs,
            mixed_step_width=self.width,
            **graph_fields,
        )


@dataclass(frozen=True)
class MixedHostInputs:
    """What the host sends for one MIXED forward (`MixedLayout.pack`)."""

    layout: MixedLayout
    values: list[int]  # the packed tensor's prefix, up to `out_cache_loc`: the one copy
    # [num_reqs] each, host lists for host-side code: upper bounds of the lengths (the step
    # requests' device kv_lens may be lower, overlap), and new tokens per request
    seq_lens_cpu: list[int]
    extend_seq_lens_cpu: list[int]


@dataclass(frozen=True)
class MixedPrologue:
    step: StepPrologue  # the step requests' inputs, as their decode graphs derive them

    def __call__(self, fb: ForwardBatch, token_rows: torch.Tensor) -> None:
        """Complete `fb` (a `MixedLayout.batch` the host's values filled) in place: the step
        requests' inputs from their rows (already in `req_pool_indices`), their prefix
        lengths, and the arrival tokens' KV slots from `token_rows` `[arrival_tokens]`."""
        s, w = fb.mixed_step_bs, fb.mixed_step_width
        t, pool = s * w, fb.req_to_token_pool
        rows = fb.req_pool_indices[:s]  # the step prologue's copy of them lands on themselves
        self.step(ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY, batch_size=s, input_ids=fb.input_ids[:t],
            req_pool_indices=rows, seq_lens=fb.seq_lens[:s], seq_lens_cpu=fb.seq_lens_cpu[:s],
            out_cache_loc=fb.out_cache_loc[:t], positions=fb.positions[:t],
            req_to_token_pool=pool, token_to_kv_pool=fb.token_to_kv_pool,
            attn_backend=fb.attn_backend), rows)
        torch.sub(fb.seq_lens[:s], w, out=fb.extend_prefix_lens[:s])
        fb.out_cache_loc[t:] = pool.req_to_token[token_rows, fb.positions[t:]]

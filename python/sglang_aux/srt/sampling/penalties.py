"""Penalties and min_new_tokens of every request row, applied to logits on the device.

SGLang's definitions, over a request's output tokens (the prompt does not count): frequency
subtracts frequency_penalty times a token's count and presence subtracts presence_penalty
from every token that occurred; then repetition divides a positive logit, and multiplies a
negative one, by repetition_penalty for every token that occurred; min_new_tokens sets the
EOS and stop token ids to -inf while fewer output tokens than it precede the one chosen.

Each row's output-token counts and length live on the device and advance from the tokens a
step emitted, so a step needs no host sync. A DFlash verify scores B block positions in one
forward: position j is processed as target-only decoding would after emitting the block's
drafts 0..j-1 (counted, and counted in the length), so acceptance against it is exact.

The `[rows, vocab]` tables are allocated when the first request that needs them is written;
a row with default parameters is left bit-identical.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sglang_aux.srt.constrained.token_bitmask import apply_token_bitmask
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.srt.sampling.sampling_rows import SamplingRows


class _Staged(NamedTuple):
    penalties: tuple[float, float, float]  # frequency, presence, repetition
    min_new_tokens: int
    stop_ids: list[int]  # what min_new_tokens masks
    output_ids: list[int]
    needed: bool  # the request processes its logits


class PenaltyRows:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str):
        self.num_rows, self.vocab_size = num_rows + 1, vocab_size  # row 0 pads
        self.device = torch.device(device)
        self.params: torch.Tensor | None = None  # [rows, 3]: frequency, presence, repetition
        self.min_new_tokens: torch.Tensor | None = None  # [rows] int64
        self.out_len: torch.Tensor | None = None  # [rows] int64, output tokens so far
        self.counts: torch.Tensor | None = None  # [rows, vocab] int32, of each output token
        self.stop_mask: torch.Tensor | None = None  # [rows, vocab] bool, what min_new masks
        self._staged: dict[int, _Staged] = {}  # row -> its parameters, until written

    def stage(self, row: int, params: SamplingParams, output_ids: list[int],
              eos_token_ids: set[int]) -> None:
        """Keep an admitted request's parameters for `write`; its output so far (a request
        that runs again) seeds its counts."""
        # ids past the vocabulary are never chosen: nothing to mask
        stop = sorted(t for t in {*eos_token_ids, *params.stop_token_ids}
                      if t < self.vocab_size) if params.min_new_tokens else []
        self._staged[row] = _Staged(
            (params.frequency_penalty, params.presence_penalty, params.repetition_penalty),
            params.min_new_tokens, stop, list(output_ids), params.processes_logits)

    def write(self, rows: list[int]) -> None:
        """Store the staged rows (newly admitted requests); nothing while no request has
        needed the tables."""
        staged = [self._staged.pop(row) for row in rows]
        if self.params is None:
            if not any(s.needed for s in staged):
                return
            self._allocate()
        n = len(rows)
        counts = torch.zeros((n, self.vocab_size), dtype=torch.int32)
        stop = torch.zeros((n, self.vocab_size), dtype=torch.bool)
        for i, s in enumerate(staged):
            counts[i].index_add_(0, torch.tensor(s.output_ids, dtype=torch.int64),
                                 torch.ones(len(s.output_ids), dtype=torch.int32))
            stop[i, s.stop_ids] = True
        index = self._to_device(torch.tensor(rows, dtype=torch.int64))
        self.params.index_copy_(0, index, self._to_device(
            torch.tensor([s.penalties for s in staged], dtype=torch.float32)))
        ints = self._to_device(torch.tensor([[s.min_new_tokens, len(s.output_ids)]
                                             for s in staged], dtype=torch.int64))
        self.min_new_tokens.index_copy_(0, index, ints[:, 0])
        self.out_len.index_copy_(0, index, ints[:, 1])
        self.counts.index_copy_(0, index, self._to_device(counts))
        self.stop_mask.index_copy_(0, index, self._to_device(stop))

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.device.type == "cuda":  # pinned and non-blocking: a pageable copy would wait
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def _allocate(self) -> None:
        n, v, dev = self.num_rows, self.vocab_size, self.device
        self.params = torch.zeros((n, 3), dtype=torch.float32, device=dev)
        self.params[:, 2] = 1.0
        self.min_new_tokens = torch.zeros(n, dtype=torch.int64, device=dev)
        self.out_len = torch.zeros(n, dtype=torch.int64, device=dev)
        self.counts = torch.zeros((n, v), dtype=torch.int32, device=dev)
        self.stop_mask = torch.zeros((n, v), dtype=torch.bool, device=dev)

    def apply(self, logits: torch.Tensor, rows: torch.Tensor,
              drafts: torch.Tensor | None = None) -> torch.Tensor:
        """The processed float32 copy of `logits` `[n * b, vocab]` (b consecutive positions per
        row of `rows` `[n]`). With `drafts` `[n, b - 1]` (a DFlash block after its anchor),
        position j counts drafts 0..j-1 as emitted; without, b is 1."""
        n = rows.shape[0]
        b = logits.shape[0] // n
        x = logits.to(torch.float32, copy=True).view(n, b, -1)
        counts = self.counts[rows]
        frequency, presence, repetition = (t[:, None, None] for t in self.params[rows].unbind(-1))
        x = _penalize(x, counts[:, None, :], frequency, presence, repetition)
        if drafts is not None and b > 1:
            # position j, draft column i: its count after the drafts before position j; every
            # draft equal to it gives the same count, so duplicate scatters write one value
            same = (drafts[:, :, None] == drafts[:, None, :]).to(torch.int32).cumsum(1)
            before = torch.cat([torch.zeros_like(same[:, :1]), same], dim=1)  # [n, b, b-1]
            k = counts.gather(1, drafts)[:, None, :] + before
            cols = drafts[:, None, :].expand(n, b, b - 1)
            raw = logits.view(n, b, -1).gather(2, cols).to(torch.float32)
            x.scatter_(2, cols, _penalize(raw, k, frequency, presence, repetition))
        emitted = self.out_len[rows][:, None] + torch.arange(b, device=x.device)
        short = (emitted < self.min_new_tokens[rows][:, None])[:, :, None]
        x.masked_fill_(short & self.stop_mask[rows][:, None, :], float("-inf"))
        return x.view(n * b, -1)

    def advance(self, rows: torch.Tensor, tokens: torch.Tensor,
                added: torch.Tensor | int) -> None:
        """Count the first `added` `[n]` (or all) of `tokens` `[n, w]`, emitted by `rows`."""
        n, w = tokens.shape
        ones = torch.ones((n, w), dtype=torch.int32, device=tokens.device)
        if isinstance(added, torch.Tensor):
            ones *= torch.arange(w, device=tokens.device) < added[:, None]
        else:
            added = torch.full((n,), added, dtype=torch.int64, device=tokens.device)
        self.counts.index_put_((rows[:, None].expand(n, w), tokens), ones, accumulate=True)
        self.out_len.index_add_(0, rows, added)


def sample_next_tokens(sampling_rows: SamplingRows, penalty_rows: PenaltyRows,
                       logits: torch.Tensor, params: list[SamplingParams], rows: torch.Tensor,
                       positions: torch.Tensor,
                       token_bitmask: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row at `positions`; when a request processes its logits (penalties,
    min_new_tokens, min_p: known on the host), from the processed logits, counted for the
    next step; with `token_bitmask` (`[rows, words]` on the device: a request has a grammar),
    only among the tokens it allows."""
    all_greedy = all(p.is_greedy for p in params)
    penalized = any(p.processes_logits for p in params)
    if penalized:
        logits = penalty_rows.apply(logits, rows)
    if token_bitmask is not None:
        # the forward's logits stay raw (logprobs read them): a processed copy is masked
        logits = apply_token_bitmask(logits if penalized else logits.to(torch.float32, copy=True),
                                     token_bitmask)
    tokens = sampling_rows.sample(logits, rows, positions, all_greedy, min_p=penalized)
    if penalized:
        penalty_rows.advance(rows, tokens[:, None], 1)
    return tokens


def _penalize(x: torch.Tensor, k: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor,
              repetition: torch.Tensor) -> torch.Tensor:
    """Logits `x` of tokens emitted `k` times (broadcast): additive penalties, then the
    repetition scaling. Zero penalties and repetition 1 leave `x` exact."""
    seen = k > 0
    x = x - frequency * k.to(torch.float32) - presence * seen.to(torch.float32)
    return torch.where(seen, torch.where(x < 0, x * repetition, x / repetition), x)

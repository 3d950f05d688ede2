"""The logprobs of one step's requests that ask for them (`Req.logprob`).

Computed on the device once the step's tokens are chosen, only for the rows of those
requests, and carried in the step's one readback: the token tensor, then the values
(float64 bit-cast to int64), flattened into one int64 tensor. Output positions: `positions`
per request (1 for a prefill or a decode step, the block for a DFlash verify step, whose
rows are the target's verify logits, so accepted tokens get exactly the target's values);
the host keeps those of the tokens the request emitted. A prefill also computes the prompt
entries from `start_len` on, from the forward's final hidden states (`needs_hidden`).
"""

from __future__ import annotations

from itertools import accumulate

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.layers.vocab_parallel_embedding import lm_head_logits
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device
from sglang_aux.srt.sampling.logprobs import (
    PositionLogprobs,
    num_columns,
    position_logprobs,
    unpack_position,
)


def prompt_rows(req: Req) -> int:
    """Logits rows `req`'s prompt entries need: positions `[start_len, len - 1)` predict
    tokens `start_len + 1 ..`; the entry of token `start_len` itself is None (as SGLang)."""
    lp = req.logprob
    if lp is None:
        return 0
    return max(len(req.origin_input_ids) - 1 - lp.start_len, 0)


class StepLogprobs:
    def __init__(self, reqs: list[Req], positions: int, prefill: bool):
        self.reqs = reqs
        self.positions = positions
        self.prefill = prefill
        self.index = [i for i, r in enumerate(reqs) if r.logprob is not None]
        wanted = [reqs[i].logprob for i in self.index]
        self.top_n = max(p.top_n for p in wanted)
        self.num_ids = max(len(p.token_ids or ()) for p in wanted)
        self.cols = num_columns(self.top_n, self.num_ids)
        # a prefill of a request whose prompt entries need logits rows
        self.needs_hidden = prefill and any(prompt_rows(r) for r in reqs)
        self._token_shape: tuple[int, ...] = ()
        self._out: dict[int, list[float]] = {}

    @classmethod
    def of(cls, reqs: list[Req], positions: int = 1, prefill: bool = False
           ) -> StepLogprobs | None:
        """None when no request of the step asks for logprobs (the step pays nothing)."""
        if not any(r.logprob is not None for r in reqs):
            return None
        return cls(reqs, positions, prefill)

    def _ids(self, rows: list[Req], repeat: list[int], device: torch.device
             ) -> torch.Tensor | None:
        if not self.num_ids:
            return None
        per = [list(r.logprob.token_ids or ()) + [0] * (self.num_ids - len(r.logprob.token_ids
                                                                          or ()))
               for r in rows]
        return to_device([p for p, k in zip(per, repeat, strict=True) for _ in range(k)],
                         device)

    def pack(self, tokens: torch.Tensor, logits: torch.Tensor, chosen: torch.Tensor,
             hidden: torch.Tensor | None = None, lm_head_weight: torch.Tensor | None = None,
             extend: tuple[list[int], list[int]] | None = None) -> torch.Tensor:
        """The readback: `tokens` (any shape), then the output values of the logprob requests
        from their logits rows (`logits` `[bs * positions, vocab]`, tokens `chosen`
        `[bs, positions]`), then (a prefill: `hidden` `[num_tokens, H]` and `extend`, each
        request's cached prefix and new-token counts) every prompt's entries; one flat int64
        tensor."""
        self._token_shape = tuple(tokens.shape)
        dev, p, bs = logits.device, self.positions, len(self.reqs)
        rows = [i * p + j for i in self.index for j in range(p)]
        rows_t = to_device([rows], dev)[0]
        wanted = [self.reqs[i] for i in self.index]
        out = position_logprobs(logits[:bs * p][rows_t], chosen.reshape(-1)[rows_t],
                                self.top_n, self._ids(wanted, [p] * len(wanted), dev))
        parts = [tokens.reshape(-1), out.view(torch.int64).reshape(-1)]
        if self.needs_hidden:
            parts.append(self._prompt(hidden, lm_head_weight, *extend, dev))
        return torch.cat(parts)

    def _prompt(self, hidden: torch.Tensor, weight: torch.Tensor, prefix: list[int],
                ext: list[int], dev: torch.device) -> torch.Tensor:
        rows, toks, reqs, counts = [], [], [], []
        for r, start, cached in zip(self.reqs, accumulate([0, *ext[:-1]]), prefix, strict=True):
            n = prompt_rows(r)
            if not n:
                continue
            # the prefill ran the prompt from its cached prefix on, which ends at or before
            # start_len (KvReservation.take)
            first = start + r.logprob.start_len - cached
            rows += range(first, first + n)
            toks += r.origin_input_ids[r.logprob.start_len + 1:]
            reqs.append(r)
            counts.append(n)
        rows_t, toks_t = to_device([rows, toks], dev)
        values = position_logprobs(lm_head_logits(hidden[rows_t], weight), toks_t, self.top_n,
                                   self._ids(reqs, counts, dev))
        return values.view(torch.int64).reshape(-1)

    def split(self, host: torch.Tensor) -> torch.Tensor:
        """The token part of a readback `pack` built; keeps the values for `output` and
        writes each prompt's entries into its request (`Req.input_logprobs`)."""
        n_tok = 1
        for d in self._token_shape:
            n_tok *= d
        floats = host[n_tok:].view(torch.float64).tolist()
        width = self.positions * self.cols
        for k, i in enumerate(self.index):
            self._out[i] = floats[k * width:(k + 1) * width]
        at = len(self.index) * width
        for r in self.reqs:
            lp = r.logprob
            if not self.prefill or lp is None or lp.start_len >= len(r.origin_input_ids):
                continue
            n = prompt_rows(r)
            ids = r.origin_input_ids[lp.start_len:]
            entries: list[PositionLogprobs] = [(None, ids[0], None, None)]
            for j in range(n):
                values = floats[at + j * self.cols:at + (j + 1) * self.cols]
                entries.append(unpack_position(values, ids[j + 1], lp, self.top_n))
            at += n * self.cols
            r.input_logprobs = entries
        return host[:n_tok].view(self._token_shape)

    def output(self, i: int, tokens: list[int]) -> list[PositionLogprobs] | None:
        """Entries of the `tokens` request `i` emitted (its first positions), or None."""
        values = self._out.get(i)
        if values is None:
            return None
        lp, c = self.reqs[i].logprob, self.cols
        return [unpack_position(values[j * c:(j + 1) * c], t, lp, self.top_n)
                for j, t in enumerate(tokens)]


def packed_prefill(logprobs: StepLogprobs | None, tokens: torch.Tensor,
                   out: LogitsProcessorOutput, fb: ForwardBatch,
                   lm_head_weight: torch.Tensor) -> torch.Tensor:
    """A prefill's readback: its first tokens, with the logprobs of the requests that ask."""
    if logprobs is None:
        return tokens
    return logprobs.pack(tokens, out.next_token_logits, tokens, out.hidden_states,
                         lm_head_weight, (fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu))

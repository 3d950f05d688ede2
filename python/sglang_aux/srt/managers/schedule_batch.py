"""Requests and the ForwardBatches built from them.

A request's KV holds `kv_len` tokens: the prompt and every output token but the last, whose
K/V is written by the forward that consumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_aux.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.sampling.sampling_params import SamplingParams


@dataclass
class Req:
    rid: str
    origin_input_ids: list[int]
    sampling_params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    req_pool_idx: int | None = None
    kv_len: int = 0
    finished_reason: dict | None = None
    generator: torch.Generator | None = None
    # speculative bookkeeping: verify steps and tokens they produced (accepted drafts + bonus)
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    # [num_draft_tokens]: entry i counts the verify steps that accepted i drafts
    spec_accept_histogram: list[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.origin_input_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.origin_input_ids[-1]

    def record_spec_verify(self, accepted_drafts: int, num_draft_tokens: int) -> None:
        """One verify step of a `num_draft_tokens` block that accepted `accepted_drafts`."""
        if not self.spec_accept_histogram:
            self.spec_accept_histogram = [0] * num_draft_tokens
        self.spec_verify_ct += 1
        self.spec_accepted_tokens += accepted_drafts + 1
        self.spec_accept_histogram[accepted_drafts] += 1


def _ints(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def alloc_tokens(runner: ModelRunner, req: Req, n: int) -> torch.Tensor:
    """Allocate `n` KV slots for positions `[kv_len, kv_len + n)` of `req`; returns them."""
    slots = runner.token_to_kv_pool_allocator.alloc(n)
    runner.req_to_token_pool.write(req.req_pool_idx, req.kv_len, slots)
    return slots


def build_extend_batch(runner: ModelRunner, reqs: list[Req],
                       capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
                       ) -> ForwardBatch:
    """Prefill every request's uncached tokens (allocates their slots)."""
    dev = runner.device
    ids, positions, locs, prefix, ext = [], [], [], [], []
    for r in reqs:
        tokens = (r.origin_input_ids + r.output_ids)[r.kv_len:]
        locs.append(alloc_tokens(runner, r, len(tokens)))
        ids += tokens
        positions += range(r.kv_len, r.kv_len + len(tokens))
        prefix.append(r.kv_len)
        ext.append(len(tokens))
        r.kv_len += len(tokens)
    seq_lens = [r.kv_len for r in reqs]
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(reqs),
        input_ids=_ints(ids, dev),
        req_pool_indices=_ints([r.req_pool_idx for r in reqs], dev),
        seq_lens=_ints(seq_lens, dev),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=torch.cat(locs).to(torch.int64),
        positions=_ints(positions, dev),
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend,
        extend_prefix_lens_cpu=prefix,
        extend_seq_lens_cpu=ext,
        capture_hidden_mode=capture_hidden_mode,
    )


def build_fixed_batch(runner: ModelRunner, reqs: list[Req], mode: ForwardMode,
                      input_ids: list[int], out_cache_loc: torch.Tensor,
                      start_lens: list[int]) -> ForwardBatch:
    """A fixed-layout batch of `len(input_ids) // len(reqs)` tokens per request at positions
    `[start, start + n)` per request, over slots already allocated (`out_cache_loc`)."""
    dev, bs = runner.device, len(reqs)
    n = len(input_ids) // bs
    positions = [s + j for s in start_lens for j in range(n)]
    seq_lens = [s + n for s in start_lens]
    return ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=_ints(input_ids, dev),
        req_pool_indices=_ints([r.req_pool_idx for r in reqs], dev),
        seq_lens=_ints(seq_lens, dev),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=out_cache_loc.to(dev, torch.int64),
        positions=_ints(positions, dev),
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend,
    )


def build_decode_batch(runner: ModelRunner, reqs: list[Req]) -> ForwardBatch:
    """One token per request: each request's last token, at position `kv_len`."""
    starts = [r.kv_len for r in reqs]
    locs = torch.cat([alloc_tokens(runner, r, 1) for r in reqs])
    for r in reqs:
        r.kv_len += 1
    return build_fixed_batch(runner, reqs, ForwardMode.DECODE, [r.last_token for r in reqs],
                             locs, starts)

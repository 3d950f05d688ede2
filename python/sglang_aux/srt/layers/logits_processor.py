"""From final hidden states to next-token logits (and what else the caller asked to keep)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import CaptureHiddenMode, ForwardBatch
from sglang_aux.srt.layers.vocab_parallel_embedding import lm_head_logits


@dataclass
class LogitsProcessorOutput:
    # EXTEND: one row per request (its last token); fixed-layout modes: one row per token, or
    # `ForwardBatch.logits_per_req` per request; MIXED: one per `ForwardBatch.logits_rows`
    # entry.
    next_token_logits: torch.Tensor  # [rows, vocab]
    hidden_states: torch.Tensor | None = None  # final hidden states, per capture_hidden_mode
    aux_hidden_states: torch.Tensor | None = None  # [num_tokens, K * hidden]


class LogitsProcessor:
    """Applies the LM head to the rows that need logits.

    With `forward_batch.next_token_logits_buffer` set (graph capture), the logits are written
    into that buffer, so the graph's output lives in runner-owned storage. Under tensor
    parallelism `lm_head_weight` is this rank's vocabulary rows and the logits are gathered:
    every rank holds the whole `[rows, vocab]`; a `replicated` head (the draft vocabulary's
    cut head, `speculative/token_map.py`) is whole on every rank already.
    """

    def __call__(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                 forward_batch: ForwardBatch,
                 aux_hidden_states: torch.Tensor | None = None,
                 replicated: bool = False) -> LogitsProcessorOutput:
        rows = hidden
        if forward_batch.logits_rows is not None:
            rows = hidden[forward_batch.logits_rows]
        elif forward_batch.logits_per_req:
            n, bs = forward_batch.logits_per_req, forward_batch.batch_size
            rows = hidden.view(bs, -1, hidden.shape[-1])[:, 1 : 1 + n].reshape(bs * n, -1)
        elif forward_batch.forward_mode.is_extend():
            ext = forward_batch.extend_seq_lens
            if ext is None:  # a batch built by hand with host lists only
                ext = torch.tensor(forward_batch.extend_seq_lens_cpu, device=hidden.device)
            # a padded request (0 new tokens) repeats the previous row; its logits are unused
            rows = hidden[(ext.cumsum(0) - 1).clamp_min(0)]
        logits = lm_head_logits(rows, lm_head_weight, forward_batch.next_token_logits_buffer,
                                replicated)
        kept = hidden if forward_batch.capture_hidden_mode == CaptureHiddenMode.FULL else None
        return LogitsProcessorOutput(logits, kept, aux_hidden_states)

"""Static storage a mixed graph runner owns: every input and output of its MIXED graphs.

A graph of `step_bs` step requests (`width` tokens each) and `arrival_tokens` arrival tokens
reads the prefixes `[:step_bs * width + arrival_tokens]` (tokens), `[:step_bs + max_arrivals]`
(requests) and `[:step_bs * width + max_arrivals]` (logits rows). `build_mixed_batch` pads a
live batch to exactly that layout, so `load` is one copy of same-shaped tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW, PADDING_SLOT
from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch

_FIELDS = ("input_ids", "positions", "out_cache_loc", "req_pool_indices", "seq_lens",
           "extend_prefix_lens", "extend_seq_lens", "extend_start_loc", "logits_rows")


@dataclass
class MixedInputBuffers:
    input_ids: torch.Tensor  # [max_tokens]
    positions: torch.Tensor  # [max_tokens]
    out_cache_loc: torch.Tensor  # [max_tokens]
    req_pool_indices: torch.Tensor  # [max_reqs]
    seq_lens: torch.Tensor  # [max_reqs]
    seq_lens_cpu: torch.Tensor  # [max_reqs], host
    extend_prefix_lens: torch.Tensor  # [max_reqs]
    extend_seq_lens: torch.Tensor  # [max_reqs]
    extend_start_loc: torch.Tensor  # [max_reqs]
    logits_rows: torch.Tensor  # [max_logits_rows]
    next_token_logits_buffer: torch.Tensor  # [max_logits_rows, vocab]
    # [>= max_tokens, K * hidden]: the runner's one shared aux buffer when its rows suffice;
    # the mixed epilogue consumes rows [:num_tokens] in-graph.
    aux_hidden_states: torch.Tensor | None
    # [>= max_tokens, H_draft] fp32: the streamed projection's accumulator, likewise.
    aux_projection_acc: torch.Tensor | None

    @classmethod
    def create(cls, *, max_tokens: int, max_reqs: int, max_logits_rows: int, vocab_size: int,
               dtype: torch.dtype, device: torch.device | str,
               aux_hidden_states: torch.Tensor | None = None,
               aux_projection_acc: torch.Tensor | None = None) -> MixedInputBuffers:
        for name, t in (("aux buffer", aux_hidden_states), ("aux accumulator", aux_projection_acc)):
            if t is not None and t.shape[0] < max_tokens:
                raise ValueError(f"the {name} {tuple(t.shape)} has fewer rows than the "
                                 f"{max_tokens} tokens of the largest mixed graph")
        ints = dict(dtype=torch.int64, device=device)
        return cls(
            input_ids=torch.zeros(max_tokens, **ints),
            positions=torch.zeros(max_tokens, **ints),
            out_cache_loc=torch.full((max_tokens,), PADDING_SLOT, **ints),
            req_pool_indices=torch.full((max_reqs,), PADDING_REQ_ROW, **ints),
            seq_lens=torch.ones(max_reqs, **ints),
            seq_lens_cpu=torch.ones(max_reqs, dtype=torch.int64),
            extend_prefix_lens=torch.zeros(max_reqs, **ints),
            extend_seq_lens=torch.zeros(max_reqs, **ints),
            extend_start_loc=torch.zeros(max_reqs, **ints),
            logits_rows=torch.zeros(max_logits_rows, **ints),
            next_token_logits_buffer=torch.zeros((max_logits_rows, vocab_size), dtype=dtype,
                                                 device=device),
            aux_hidden_states=aux_hidden_states,
            aux_projection_acc=aux_projection_acc,
        )

    def load(self, batch: ForwardBatch, static: ForwardBatch) -> None:
        """Copy `batch` into the graph's static views `static` (the same shapes): one launch."""
        dst = [getattr(static, name) for name in _FIELDS]
        src = [getattr(batch, name) for name in _FIELDS]
        for name, d, s in zip(_FIELDS, dst, src, strict=True):
            if d.shape != s.shape:
                raise ValueError(f"{name}: the batch's {tuple(s.shape)} is not the graph's "
                                 f"{tuple(d.shape)}")
        torch._foreach_copy_(dst, src)
        static.seq_lens_cpu.copy_(batch.seq_lens_cpu)

"""Static storage a prefill graph runner owns: every input and output of its EXTEND graphs.

A graph of `num_tokens` tokens takes up to `max_bs` requests. `load(batch, num_tokens)` copies
a live batch into the prefixes and makes the rest inert: padded tokens sit after the live ones
at position 0 and write their K/V into the padding slot; padded requests read the padding row
and have no new tokens, so attention gives them no work and their logits rows go unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW, PADDING_SLOT

_TOKEN_MAJOR = ("input_ids", "out_cache_loc", "positions")
_REQUEST_MAJOR = ("req_pool_indices", "seq_lens", "extend_prefix_lens", "extend_seq_lens",
                  "extend_start_loc")


@dataclass
class PrefillInputBuffers:
    input_ids: torch.Tensor  # [max_tokens]
    positions: torch.Tensor  # [max_tokens]
    out_cache_loc: torch.Tensor  # [max_tokens]
    req_pool_indices: torch.Tensor  # [max_bs]
    seq_lens: torch.Tensor  # [max_bs]
    seq_lens_cpu: torch.Tensor  # [max_bs], host
    extend_prefix_lens: torch.Tensor  # [max_bs]
    extend_seq_lens: torch.Tensor  # [max_bs]
    extend_start_loc: torch.Tensor  # [max_bs]
    next_token_logits_buffer: torch.Tensor  # [max_bs, vocab]: one row per request
    # [>= max_tokens, K * hidden]: the runner's one shared aux buffer, borrowed from its decode
    # graphs when they have one; the prefill epilogue consumes rows [:num_tokens] in-graph.
    aux_hidden_states: torch.Tensor | None
    # [>= max_tokens, H_draft] fp32: the streamed projection's accumulator, likewise.
    aux_projection_acc: torch.Tensor | None
    padding: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def create(cls, *, max_tokens: int, max_bs: int, vocab_size: int, dtype: torch.dtype,
               device: torch.device | str, aux_hidden_states: torch.Tensor | None = None,
               aux_projection_acc: torch.Tensor | None = None) -> PrefillInputBuffers:
        for name, t in (("aux buffer", aux_hidden_states), ("aux accumulator", aux_projection_acc)):
            if t is not None and t.shape[0] < max_tokens:
                raise ValueError(f"the {name} {tuple(t.shape)} has fewer rows than the "
                                 f"{max_tokens} tokens of the largest prefill graph")
        ints = dict(dtype=torch.int64, device=device)
        buffers = cls(
            input_ids=torch.zeros(max_tokens, **ints),
            positions=torch.zeros(max_tokens, **ints),
            out_cache_loc=torch.full((max_tokens,), PADDING_SLOT, **ints),
            req_pool_indices=torch.full((max_bs,), PADDING_REQ_ROW, **ints),
            seq_lens=torch.ones(max_bs, **ints),
            seq_lens_cpu=torch.ones(max_bs, dtype=torch.int64),
            extend_prefix_lens=torch.zeros(max_bs, **ints),
            extend_seq_lens=torch.zeros(max_bs, **ints),
            extend_start_loc=torch.zeros(max_bs, **ints),
            next_token_logits_buffer=torch.zeros((max_bs, vocab_size), dtype=dtype,
                                                 device=device),
            aux_hidden_states=aux_hidden_states,
            aux_projection_acc=aux_projection_acc,
        )
        buffers.padding = {name: getattr(buffers, name).clone()
                           for name in (*_TOKEN_MAJOR, *_REQUEST_MAJOR)}
        return buffers

    @property
    def max_bs(self) -> int:
        return self.req_pool_indices.shape[0]

    @property
    def max_tokens(self) -> int:
        return self.input_ids.shape[0]

    def load(self, batch: ForwardBatch, num_tokens: int) -> None:
        """Copy `batch` into rows `[:batch.num_tokens]` / `[:batch.batch_size]`, padding
        tokens up to `num_tokens` and requests up to `max_bs`: one launch."""
        live_tokens, live_bs = batch.num_tokens, batch.batch_size
        dst, src = [], []
        for names, live, end in ((_TOKEN_MAJOR, live_tokens, num_tokens),
                                 (_REQUEST_MAJOR, live_bs, self.max_bs)):
            for name in names:
                buf = getattr(self, name)
                dst += [buf[:live], buf[live:end]]
                src += [getattr(batch, name), self.padding[name][live:end]]
        torch._foreach_copy_(dst, src)
        self.seq_lens_cpu[:live_bs].copy_(batch.seq_lens_cpu)
        self.seq_lens_cpu[live_bs:].fill_(1)

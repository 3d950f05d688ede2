"""Static storage a mixed graph runner owns: every input and output of its MIXED graphs.

Every int64 input of a graph is a view of one buffer, `packed`, laid out by the graph's
`MixedLayout` from offset 0 (so the graphs' views overlap; one replays at a time). A replay's
one input copy writes the host's values into its prefix; the graph's prologue writes the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MixedInputBuffers:
    packed: torch.Tensor  # [the largest layout's num_values] int64
    next_token_logits_buffer: torch.Tensor  # [max_logits_rows, vocab]
    # [>= max_tokens, K * hidden]: the runner's one shared aux buffer when its rows suffice;
    # the mixed epilogue consumes rows [:num_tokens] in-graph.
    aux_hidden_states: torch.Tensor | None
    # [>= max_tokens, H_draft] fp32: the streamed projection's accumulator, likewise.
    aux_projection_acc: torch.Tensor | None

    @classmethod
    def create(cls, *, num_values: int, max_tokens: int, max_logits_rows: int,
               vocab_size: int, dtype: torch.dtype, device: torch.device | str,
               aux_hidden_states: torch.Tensor | None = None,
               aux_projection_acc: torch.Tensor | None = None) -> MixedInputBuffers:
        """Storage for the largest layout's `num_values` inputs, tokens and logits rows."""
        for name, t in (("aux buffer", aux_hidden_states), ("aux accumulator", aux_projection_acc)):
            if t is not None and t.shape[0] < max_tokens:
                raise ValueError(f"the {name} {tuple(t.shape)} has fewer rows than the "
                                 f"{max_tokens} tokens of the largest mixed graph")
        return cls(
            packed=torch.zeros(num_values, dtype=torch.int64, device=device),
            next_token_logits_buffer=torch.zeros((max_logits_rows, vocab_size), dtype=dtype,
                                                 device=device),
            aux_hidden_states=aux_hidden_states,
            aux_projection_acc=aux_projection_acc,
        )

"""Static storage a graph runner owns: every graph input and output, at its largest layout.

Every int64 input of a graph is a view of `packed`, laid out by the graph's `ForwardLayout`
from offset 0 (the graphs' views overlap; one replays at a time), so a replay's one input
copy writes the host's values into its prefix. Logits rows are row prefixes of `logits`;
aux rows come from the runner's `AuxStorage`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_aux.srt.model_executor.runner.forward_layout import ForwardLayout


@dataclass(frozen=True)
class GraphBuffers:
    packed: torch.Tensor  # [the largest layout's num_values] int64
    logits: torch.Tensor  # [the largest layout's logits rows, vocab]
    seq_lens_cpu: torch.Tensor  # [the largest layout's requests], host

    @classmethod
    def create(cls, layouts: list[ForwardLayout], *, vocab_size: int, dtype: torch.dtype,
               device: torch.device) -> GraphBuffers:
        def most(attr: str) -> int:
            return max(getattr(layout, attr) for layout in layouts)

        return cls(
            packed=torch.zeros(most("num_values"), dtype=torch.int64, device=device),
            logits=torch.zeros((most("num_logits_rows"), vocab_size), dtype=dtype,
                               device=device),
            seq_lens_cpu=torch.ones(most("num_reqs"), dtype=torch.int64),
        )

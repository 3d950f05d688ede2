"""Static storage a graph runner owns: every graph input and output, at its largest layout.

SGLang's `DecodeInputBuffers` (its decode and TARGET_VERIFY graphs' inputs, allocated once at
the largest size); here one instance per `GraphRunner` serves every captured mode. Every
int64 input of a graph is a view of `packed`, laid out by the graph's `ForwardLayout` from
offset 0 (the graphs' views overlap; one replays at a time), so a replay's one input copy
writes the host's values into its prefix. Logits rows are row prefixes of
`next_token_logits_buffer`. The aux rows SGLang keeps here as `aux_hidden_states` live in the
runner's `AuxStorage` instead, since every mode's forwards share them
(`runner_utils/aux_storage.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodeInputBuffers:
    packed: torch.Tensor  # [the largest layout's num_values] int64
    next_token_logits_buffer: torch.Tensor  # [the largest layout's logits rows, vocab]
    seq_lens_cpu: torch.Tensor  # [the largest layout's requests], host

    @classmethod
    def create(cls, *, num_values: int, num_logits_rows: int, num_reqs: int, vocab_size: int,
               dtype: torch.dtype, device: torch.device) -> DecodeInputBuffers:
        """Buffers for layouts of at most these sizes (each the largest over the layouts)."""
        return cls(
            packed=torch.zeros(num_values, dtype=torch.int64, device=device),
            next_token_logits_buffer=torch.zeros((num_logits_rows, vocab_size), dtype=dtype,
                                                 device=device),
            seq_lens_cpu=torch.ones(num_reqs, dtype=torch.int64),
        )

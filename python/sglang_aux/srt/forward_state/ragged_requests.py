"""Where each request of a ragged step lies in its token-major forward.

A ragged step (compact verify, `runner/ragged_step_prologue.py`) gives each of its `n` tokens
(a captured token bucket) an entry of its own, so the batch's per-token fields say nothing of
which tokens belong together. These `[r]` device tensors do (r: the most requests a step of
`n` tokens holds, at most n): request slot `b` holds
`lens[b]` tokens (0 past the live requests, which then store nothing), rows
`q_start[b] ... q_start[b] + lens[b] - 1` of the forward, at positions `prefix_lens[b] + i`
of request row `request_rows[b]`. Attention reads a request's keys once for all its tokens
from them. Their shape is the bucket's and the prologue fills them on the device, so a graph
captured per bucket replays any split of its tokens into requests without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RaggedRequests:
    request_rows: torch.Tensor  # [r] request row of each slot (the padding row past the live)
    lens: torch.Tensor  # [r] tokens of each slot, in [0, width]
    prefix_lens: torch.Tensor  # [r] each request's context before the step
    q_start: torch.Tensor  # [r] its first token's row in the forward
    width: int  # the most tokens a request holds (the verify width): sizes kernel grids

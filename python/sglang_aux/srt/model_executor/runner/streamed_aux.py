"""A graph runner's streamed aux projection: the draft fc its forwards project aux states into.

With one, the runner owns a `[max_num_token, width]` fp32 accumulator instead of the shared
`[max_num_token, K * hidden]` aux buffer; every forward of `mode` gets a projection over the
accumulator's row prefix (graphs) or a fresh one (eager), reset before the model runs, and
the epilogue consumes its result inside the same forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.forward_state.protocols import AuxProjection


@dataclass(frozen=True)
class StreamedAux:
    mode: ForwardMode  # the forwards that stream
    width: int  # H_draft: the accumulator's columns
    # (num_tokens, aux dtype, acc [num_tokens, width] fp32 or None to allocate) -> projection
    new: Callable[[int, torch.dtype, torch.Tensor | None], AuxProjection]

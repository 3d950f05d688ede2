"""What every forward of one mode runs besides the model, inside its graph when one replays.

A runner's workers register one `ForwardParts` per mode they run (`ModelRunner.init_forwards`):
how many tokens each stepping request holds, the prologue that derives a step's inputs from
its rows, the epilogue that consumes the outputs, and the streamed projection the model feeds.

A ragged step (`ragged`, DSpark's compact verify) gives each request its own token count, at
most `tokens_per_req`, chosen on the device: its forwards are token-major, one pseudo-request
per token (a layout of width 1 whose `step_bs` is the token count), and its graphs are
captured per token bucket (`capture_sizes.ragged_token_buckets`); `RaggedStepPrologue`
spreads the requests over the tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.layers.aux_hidden_states import AuxProjection
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue


@dataclass(frozen=True)
class StreamedAux:
    """The draft fc projection a forward's aux states stream into, instead of packed aux rows:
    every forward gets one over the runner's `[rows, width]` fp32 accumulator (`AuxStorage`),
    reset before the model runs; the epilogue consumes its result inside the same forward."""

    width: int  # H_draft: the accumulator's columns
    # (num_tokens, aux dtype, acc [num_tokens, width] fp32 or None to allocate) -> projection
    new: Callable[[int, torch.dtype, torch.Tensor | None], AuxProjection]


@dataclass(frozen=True)
class ForwardParts:
    mode: ForwardMode
    tokens_per_req: int = 0  # tokens per stepping request (a step mode, MIXED); 0: none
    prologue: StepPrologue | None = None  # required when tokens_per_req > 0
    epilogue: Epilogue | None = None
    streamed_aux: StreamedAux | None = None
    # EXTEND: prefills of at least this many tokens bring their own staged projection
    # (`ForwardInputs.aux_projection`), so the aux storage needs no rows for them
    staged_from_tokens: int | None = None
    ragged: bool = False  # token-major steps of per-request lengths up to tokens_per_req
    # a step's logits rows per request, block offsets 1..n (`ForwardLayout.logits_per_req`;
    # a DFlash draft's proposals); 0: every token's
    logits_per_req: int = 0

    @property
    def layout_width(self) -> int:
        """Tokens per stepping entry of this mode's layouts: 1 for a ragged step."""
        return 1 if self.ragged and self.tokens_per_req else self.tokens_per_req

    def __post_init__(self):
        if self.epilogue is not None and self.epilogue.mode != self.mode:
            raise ValueError(f"a {self.epilogue.mode.name} epilogue for {self.mode.name}")
        steps = self.mode.is_cuda_graph() or self.mode.is_mixed()
        if steps != (self.tokens_per_req > 0) or (steps and self.prologue is None):
            raise ValueError(f"{self.mode.name} forwards need tokens per request and a step "
                             f"prologue exactly when requests step, got {self.tokens_per_req} "
                             f"and {self.prologue}")
        if self.staged_from_tokens is not None and (self.mode != ForwardMode.EXTEND
                                                    or self.staged_from_tokens < 1):
            raise ValueError(f"staged projections start at a positive size of an EXTEND "
                             f"forward, got {self.staged_from_tokens} for {self.mode.name}")
        if self.ragged and not self.mode.is_cuda_graph():
            raise ValueError(f"only step modes run ragged, not {self.mode.name}")
        if self.logits_per_req and (self.ragged or not self.mode.is_cuda_graph()
                                    or self.logits_per_req >= self.tokens_per_req):
            raise ValueError(f"{self.logits_per_req} logits rows per request need a fixed step "
                             f"mode of more tokens per request, got {self.mode.name} of "
                             f"{self.tokens_per_req}")

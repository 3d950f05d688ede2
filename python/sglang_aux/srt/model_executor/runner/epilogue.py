"""Step work that consumes a forward's outputs inside the forward's own graph.

A captured graph's outputs are borrowed until its next replay. An epilogue turns that hazard
into a rule: whatever must read them (the DFlash commit of the shared aux buffer, greedy
acceptance, draft argmax) runs right after the model forward in the same closure, so it is
captured with the graph and replayed with it; an eager forward of the same mode runs the same
function after the model. The epilogue writes its results into storage its owner allocated
once for the largest batch (row prefixes `[:forward_batch.batch_size]`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode


@dataclass(frozen=True)
class Epilogue:
    mode: ForwardMode  # the forwards it follows
    fn: Callable[[ForwardBatch, LogitsProcessorOutput], None]

    def __call__(self, forward_batch: ForwardBatch, out: LogitsProcessorOutput) -> None:
        self.fn(forward_batch, out)

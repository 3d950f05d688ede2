"""Step work that consumes a forward's outputs inside the forward's own graph.

A captured graph's outputs are borrowed until its next replay. An epilogue turns that hazard
into a rule: whatever must read them (the DFlash commit of the shared aux buffer, greedy
acceptance, draft argmax) runs right after the model forward in the same closure, so it is
captured with the graph and replayed with it; an eager forward of the same mode runs the same
function after the model. The epilogue writes its results into storage its owner allocated
once for the largest batch (row prefixes `[:forward_batch.batch_size]`).

Sampling (softmax, sort, draws over the vocabulary) is a separate step, `sampling_fn`, for
batches with a sampled request only (`ForwardBatch.has_sampling`): it runs after `fn`, reads
the logits and `fn`'s results (all in static storage) and overwrites the rows that sample. A
graph runner captures it as a tail graph per size, replayed right after that size's graph
into the same pool, so greedy batches replay exactly the graph they would without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput

EpilogueFn = Callable[[ForwardBatch, LogitsProcessorOutput], None]


def run_model(model, fb: ForwardBatch, epilogue: Epilogue | None) -> LogitsProcessorOutput:
    """One forward as every graph captures it and the eager path runs it: the projection it
    feeds starts over (host state only), the model, then the epilogue."""
    if fb.aux_projection is not None:
        fb.aux_projection.reset()
    out = model.forward(fb.input_ids, fb.positions, fb)
    if epilogue is not None:
        epilogue(fb, out)
    return out


@dataclass(frozen=True)
class Epilogue:
    mode: ForwardMode  # the forwards it follows
    fn: EpilogueFn
    sampling_fn: EpilogueFn | None = None

    def __call__(self, forward_batch: ForwardBatch, out: LogitsProcessorOutput) -> None:
        """Everything a replay of `forward_batch` runs after the model (its graph, then its
        sampling tail): the eager path's one implementation of both."""
        self.fn(forward_batch, out)
        if forward_batch.has_sampling and self.sampling_fn is not None:
            self.sampling_fn(forward_batch, out)

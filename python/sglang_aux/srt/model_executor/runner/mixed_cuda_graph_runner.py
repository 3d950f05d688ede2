"""Captures one MIXED graph per (step requests, arrival tokens): a running batch's step and
arrivals' prefills in one forward.

On a small model a prefill step stalls the running batch for a whole forward of
latency-bound kernels (SmolLM2, a harness arrival: ~1.5 ms against a bs-32 verify step's
~1.5 ms). Riding the arrivals' tokens in the step's own forward costs their attention and a
few wider GEMMs instead. A graph holds `step_bs` step requests (the decode graphs' sizes,
padded with the padding row) and up to `max_arrivals` arrivals over `arrival_tokens` tokens
(padded as a prefill graph pads): its `MixedLayout`. Its inputs are views of one packed
buffer and its prologue (`MixedPrologue`) runs inside it, so a launch is `prepare_mixed`'s one
host-to-device copy and the replay.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue, run_model
from sglang_aux.srt.model_executor.runner.mixed_prologue import (
    MixedHostInputs,
    MixedLayout,
    MixedPrologue,
)
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device_into
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.model_executor.runner_utils.mixed_buffers import MixedInputBuffers

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

logger = logging.getLogger(__name__)


class MixedCudaGraphRunner:
    def __init__(self, model_runner: ModelRunnerView, *, width: int, step_bs: list[int],
                 arrival_tokens: list[int], max_arrivals: int, backend: GraphBackend,
                 buffers: MixedInputBuffers, prologue: MixedPrologue,
                 epilogue: Epilogue | None = None, streamed_aux: StreamedAux | None = None):
        for name, part in (("epilogue", epilogue), ("streamed projection", streamed_aux)):
            if part is not None and part.mode != ForwardMode.MIXED:
                raise ValueError(f"a {part.mode.name} {name} on MIXED graphs")
        if width < 1 or max_arrivals < 1 or not step_bs or not arrival_tokens:
            raise ValueError(f"mixed graphs need a width, arrivals, step sizes and arrival "
                             f"tokens, got {width}, {max_arrivals}, {step_bs}, {arrival_tokens}")
        self.model_runner = model_runner
        self.width = width
        self.step_bs = sorted(step_bs)
        self.arrival_tokens = sorted(arrival_tokens)
        self.max_arrivals = max_arrivals
        largest = self.graph_layout(self.step_bs[-1], self.arrival_tokens[-1])
        have = (buffers.packed.shape[0], buffers.next_token_logits_buffer.shape[0])
        need = (largest.num_values, largest.num_logits_rows)
        if any(h < n for h, n in zip(have, need, strict=True)):
            raise ValueError(f"buffers for (input values, logits rows) {have} do not fit the "
                             f"largest mixed graph's {need}")
        self.backend = backend
        self.buffers = buffers
        self.prologue = prologue
        self.epilogue = epilogue
        self.streamed_aux = streamed_aux
        self.graphs: dict[tuple[int, int], object] = {}
        self.outputs: dict[tuple[int, int], LogitsProcessorOutput] = {}
        self.forward_batches: dict[tuple[int, int], ForwardBatch] = {}
        self.capture_stats: dict[str, object] = {}

    def graph_layout(self, step_bs: int, arrival_tokens: int) -> MixedLayout:
        """The layout of the graph `(step_bs, arrival_tokens)`."""
        return MixedLayout(step_bs, self.width, self.max_arrivals, arrival_tokens)

    def padded_layout(self, step_bs: int, num_arrivals: int, arrival_tokens: int
                      ) -> MixedLayout | None:
        """The layout of the smallest graph that fits, or None."""
        i = bisect.bisect_left(self.step_bs, step_bs)
        j = bisect.bisect_left(self.arrival_tokens, arrival_tokens)
        if (i == len(self.step_bs) or j == len(self.arrival_tokens)
                or not 0 < num_arrivals <= self.max_arrivals or not self.graphs):
            return None
        return self.graph_layout(self.step_bs[i], self.arrival_tokens[j])

    def has_layout(self, layout: MixedLayout) -> bool:
        """Whether a captured graph has `layout` (`prepare_mixed` takes it)."""
        key = (layout.step_bs, layout.arrival_tokens)
        return key in self.graphs and self.graph_layout(*key) == layout

    def capture_prepare(self, layout: MixedLayout) -> ForwardBatch:
        """The static batch of a graph: views of the packed buffer, which gets a batch of
        padding only (what the warm-ups read). Its host list says one arrival holds every
        arrival token: that sizes the extend attention's grid for any batch the graph
        replays."""
        b, runner = self.buffers, self.model_runner
        to_device_into(b.packed, layout.padding())
        tokens = layout.num_tokens
        projection = None
        if self.streamed_aux is not None:
            projection = self.streamed_aux.new(tokens, runner.model_config.dtype,
                                               b.aux_projection_acc[:tokens])
        return layout.batch(
            b.packed, runner,
            # host lengths: read by host-side code of a prepared batch, none in the graph
            seq_lens_cpu=torch.ones(layout.num_reqs, dtype=torch.int64),
            extend_seq_lens_cpu=[self.width] * layout.step_bs + [layout.arrival_tokens]
            + [0] * (layout.arrivals - 1),
            next_token_logits_buffer=b.next_token_logits_buffer[: layout.num_logits_rows],
            aux_hidden_states_buffer=None if b.aux_hidden_states is None
            else b.aux_hidden_states[:tokens],
            aux_projection=projection,
            is_capturing=True,
        )

    def capture(self) -> None:
        """Capture every layout, largest first (later graphs reuse its pool blocks); each
        graph runs the prologue, then the model and the epilogue."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        model, attn = self.model_runner.model, self.model_runner.attn_backend
        for bs in reversed(self.step_bs):
            for n in reversed(self.arrival_tokens):
                layout = self.graph_layout(bs, n)
                fb = self.capture_prepare(layout)
                token_rows = layout.token_rows(self.buffers.packed)
                attn.init_forward_metadata_capture_cuda_graph(fb)

                def run(fb: ForwardBatch = fb, token_rows: torch.Tensor = token_rows
                        ) -> LogitsProcessorOutput:
                    self.prologue(fb, token_rows)
                    return run_model(model, fb, self.epilogue)

                key = (bs, n)
                self.graphs[key], self.outputs[key] = self.backend.warm_and_capture(run)
                self.forward_batches[key] = fb
        seconds = time.perf_counter() - start
        self.capture_stats = {"forward_mode": "MIXED", "step_bs": self.step_bs,
                              "arrival_tokens": self.arrival_tokens,
                              "max_arrivals": self.max_arrivals, "seconds": round(seconds, 3),
                              **probe.delta()}
        logger.info("Captured MIXED graphs for %s step requests x %s arrival tokens (<= %d "
                    "arrivals) in %.2f s; free memory dropped %.1f MiB", self.step_bs,
                    self.arrival_tokens, self.max_arrivals, seconds,
                    self.capture_stats["free_memory_drop_bytes"] / 2**20)

    def prepare_mixed(self, host: MixedHostInputs) -> ForwardBatch:
        """Queue a MIXED forward's host values (laid out as a captured graph's layout) into the
        packed buffer (one pinned copy) and return its batch: that graph's static views,
        which the replay's prologue completes."""
        layout = host.layout
        if not self.has_layout(layout):
            raise ValueError(f"no mixed graph has the layout {layout}")
        to_device_into(self.buffers.packed, host.values)
        static = self.forward_batches[layout.step_bs, layout.arrival_tokens]
        return dataclasses.replace(
            static, seq_lens_cpu=torch.tensor(host.seq_lens_cpu),
            extend_seq_lens_cpu=host.extend_seq_lens_cpu, next_token_logits_buffer=None,
            aux_hidden_states_buffer=None, aux_projection=None, is_capturing=False,
            prepared_graph_bs=layout.step_bs)

    def _key(self, batch: ForwardBatch) -> tuple[int, int]:
        bs = batch.mixed_step_bs
        return bs, batch.num_tokens - bs * batch.mixed_step_width

    def can_run_graph(self, batch: ForwardBatch) -> bool:
        """Whether `batch` is one `prepare_mixed` made (any other runs eagerly)."""
        return (batch.forward_mode == ForwardMode.MIXED
                and batch.prepared_graph_bs is not None
                and self._key(batch) in self.graphs)

    def execute(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay for `batch` (from `prepare_mixed`). The outputs are views of static storage
        (logits `[step_bs * width + max_arrivals, vocab]` in `logits_rows` order, aux rows
        `[num_tokens, K * H]`), valid until the next replay of any graph sharing that storage:
        the epilogue, captured with the graph, consumes the aux rows; the worker reads the
        logits (and the batch's views) before its next forward."""
        key = self._key(batch)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            self.forward_batches[key])
        self.backend.replay(self.graphs[key])
        out = self.outputs[key]
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits,
            hidden_states=None,
            aux_hidden_states=out.aux_hidden_states,
        )

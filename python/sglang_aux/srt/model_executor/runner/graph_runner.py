"""Captures one graph per layout of one forward mode and replays the smallest that fits.

Every graph runs `ForwardLayout.complete` (the inputs the host did not send), the model and
the mode's epilogue over static storage: int64 inputs and logits in `DecodeInputBuffers`, aux rows
in the runner's `AuxStorage`. Largest layout first, into one graph memory pool, two eager
warm-ups before each capture; the epilogue's sampling step gets a tail graph per layout.
Keep this file to the mechanics: which layouts comes from `capture_sizes.py`, the replay
mechanism from `GraphBackend`, graph or eager from `ModelRunner.prepare`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.runner.epilogue import EpilogueFn, run_model
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs, ForwardLayout
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_utils.aux_storage import AuxStorage
from sglang_aux.srt.model_executor.runner_utils.buffers import DecodeInputBuffers
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device_into
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

logger = logging.getLogger(__name__)


class GraphRunner:
    def __init__(self, model_runner: ModelRunnerView, parts: ForwardParts,
                 layouts: list[ForwardLayout], backend: GraphBackend,
                 aux_storage: AuxStorage | None):
        if not layouts or any(layout.mode != parts.mode for layout in layouts):
            raise ValueError(f"{parts.mode.name} graphs need {parts.mode.name} layouts, got "
                             f"{layouts}")
        self.model_runner = model_runner
        self.parts = parts
        self.layouts = sorted(layouts, key=lambda x: (x.num_tokens, x.num_reqs))
        self.backend = backend
        self.aux_storage = aux_storage
        cfg = model_runner.model_config
        self.buffers = DecodeInputBuffers.create(
            num_values=max(x.num_values for x in layouts),
            num_logits_rows=max(x.num_logits_rows for x in layouts),
            num_reqs=max(x.num_reqs for x in layouts), vocab_size=cfg.logits_width,
            dtype=cfg.dtype, device=model_runner.device)
        model_runner.attn_backend.init_cuda_graph_state(
            max(x.num_reqs for x in layouts), max(x.num_tokens for x in layouts))
        # per layout, in `layouts` order: the graph, its sampling tail, output, static batch
        self.graphs: list[object] = []
        self.sampling_graphs: list[object] = []
        self.outputs: list[LogitsProcessorOutput] = []
        self.static: list[ForwardBatch] = []
        self.capture_stats: dict[str, object] = {}

    @property
    def mode(self):
        return self.parts.mode

    def fit(self, live: ForwardLayout) -> int | None:
        """The index of the smallest captured layout that takes `live`, or None."""
        if not self.graphs:
            return None
        return next((i for i, x in enumerate(self.layouts) if x.fits(live)), None)

    def capture_prepare(self, layout: ForwardLayout) -> ForwardBatch:
        """A layout's static batch (SGLang's name) over a batch of padding only (what the
        warm-ups read): views of the buffers, and `aux_hidden_states_buffer` the layout's
        row prefix of the aux storage. Its host lists say one arrival holds every arrival
        token: that sizes the extend attention's grid for any batch the graph replays."""
        b, n = self.buffers, layout.num_tokens
        host = layout.padding()
        to_device_into(b.packed, host.values)
        seq_lens_cpu = b.seq_lens_cpu[: layout.num_reqs]
        seq_lens_cpu.copy_(torch.tensor(host.seq_lens_cpu))
        if layout.arrivals:
            host = dataclasses.replace(host, extend_seq_lens_cpu=(
                [layout.tokens_per_req] * layout.step_bs + [layout.arrival_tokens]
                + [0] * (layout.arrivals - 1)))
        rows = None if self.aux_storage is None else self.aux_storage.rows(n)
        if self.aux_storage is not None and rows is None:
            raise ValueError(f"the aux storage {tuple(self.aux_storage.buffer.shape)} has "
                             f"fewer rows than the {n} tokens of {layout}")
        streamed, projection = self.parts.streamed_aux, None
        if streamed is not None:
            projection = streamed.new(n, self.model_runner.model_config.dtype, rows)
        return layout.batch(
            b.packed, self.model_runner, host, seq_lens_cpu,
            next_token_logits_buffer=b.next_token_logits_buffer[: layout.num_logits_rows],
            aux_hidden_states_buffer=None if streamed is not None else rows,
            aux_projection=projection, is_capturing=True)

    def capture(self, added: list[ForwardLayout] | None = None) -> None:
        """Capture every layout, largest first (later graphs reuse its pool blocks); or, once
        captured, the `added` layouts too (a step's narrower widths: the buffers, sized for
        the first layouts, must hold them), inside the backend's `capture_session`."""
        with self.backend.capture_session():
            self._capture(added)

    def _capture(self, added: list[ForwardLayout] | None) -> None:
        if added is not None:
            b = self.buffers
            too_big = [x for x in added if x.mode != self.mode
                       or x.num_values > b.packed.numel() or x.num_reqs > b.seq_lens_cpu.numel()
                       or x.num_logits_rows > b.next_token_logits_buffer.shape[0]]
            if too_big or not self.graphs:
                raise ValueError(f"layouts to add to the captured {self.layouts} must be "
                                 f"{self.mode.name} ones the buffers hold, got {too_big}")
            if not added:
                return
        new = sorted(added if added is not None else self.layouts,
                     key=lambda x: (x.num_tokens, x.num_reqs))
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        model, attn = self.model_runner.model, self.model_runner.attn_backend
        packed, parts = self.buffers.packed, self.parts
        captured = []
        for layout in reversed(new):
            fb = self.capture_prepare(layout)
            attn.init_forward_metadata_capture_cuda_graph(fb)

            def run(fb: ForwardBatch = fb, layout: ForwardLayout = layout
                    ) -> LogitsProcessorOutput:
                layout.complete(packed, fb, parts.prologue)
                return run_model(model, fb, parts.epilogue)

            captured.append((*self.backend.warm_and_capture(run), fb))
        graphs, outputs, static = (list(x) for x in zip(*reversed(captured), strict=True))
        seconds = time.perf_counter() - start
        stats = {"forward_mode": self.mode.name,
                 "layouts": [dataclasses.astuple(x)[1:] for x in new],
                 "seconds": round(seconds, 3), **probe.delta()}
        logger.info("Captured %d %s graphs in %.2f s; free memory dropped %.1f MiB",
                    len(new), self.mode.name, seconds, stats["free_memory_drop_bytes"] / 2**20)
        epilogue = parts.epilogue
        tails = []
        if epilogue is not None and epilogue.sampling_fn is not None:
            tails, stats["sampling_tail"] = self._capture_sampling_tails(
                epilogue.sampling_fn, new, static, outputs)
        if added is None:
            self.graphs, self.outputs, self.static = graphs, outputs, static
            self.sampling_graphs, self.capture_stats = tails, stats
            return
        self.capture_stats.setdefault("added", []).append(stats)
        layouts = self.layouts + new
        order = sorted(range(len(layouts)),
                       key=lambda i: (layouts[i].num_tokens, layouts[i].num_reqs))

        def merged(old: list, more: list) -> list:
            return [(old + more)[i] for i in order]

        self.graphs, self.outputs = merged(self.graphs, graphs), merged(self.outputs, outputs)
        self.static, self.layouts = merged(self.static, static), merged(self.layouts, new)
        if tails:
            self.sampling_graphs = merged(self.sampling_graphs, tails)

    def _capture_sampling_tails(self, sampling_fn: EpilogueFn, layouts: list[ForwardLayout],
                                static: list[ForwardBatch], outputs: list[LogitsProcessorOutput]
                                ) -> tuple[list[object], dict[str, object]]:
        """One tail graph per layout of `layouts`, after every main graph (so its memory is
        measured on its own): the sampling step over that layout's static inputs and
        outputs."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        tails = []
        for layout, fb, out in zip(reversed(layouts), reversed(static), reversed(outputs),
                                   strict=True):
            # the graphs' views overlap: give this one its padding batch back first
            to_device_into(self.buffers.packed, layout.padding().values)
            layout.complete(self.buffers.packed, fb, self.parts.prologue)

            def tail(fb: ForwardBatch = fb, out: LogitsProcessorOutput = out
                     ) -> LogitsProcessorOutput:
                sampling_fn(fb, out)
                return out

            tails.append(self.backend.warm_and_capture(tail)[0])
        stats = {"seconds": round(time.perf_counter() - start, 3), **probe.delta()}
        logger.info("Captured %s sampling tails in %.2f s; free memory dropped %.1f MiB",
                    self.mode.name, stats["seconds"], stats["free_memory_drop_bytes"] / 2**20)
        return tails[::-1], stats

    def prepare(self, i: int, inputs: ForwardInputs) -> ForwardBatch:
        """Queue `inputs`, padded to layout `i`, into the packed buffer (one pinned copy) and
        return the batch: views of that graph's static inputs, narrowed to the live requests
        where they lead, which the replay's `complete` fills."""
        layout, static = self.layouts[i], self.static[i]
        host = layout.pack(inputs)
        to_device_into(self.buffers.packed, host.values)
        seq_lens_cpu = torch.tensor(host.seq_lens_cpu)
        # host values the CPU backend reads when its eager replay re-runs the static batch
        if layout.mode.is_extend():
            static.extend_prefix_lens_cpu = host.extend_prefix_lens_cpu
            static.extend_seq_lens_cpu = host.extend_seq_lens_cpu
        else:
            seq_lens_cpu = static.seq_lens_cpu.copy_(seq_lens_cpu)
        fb = dataclasses.replace(
            static, seq_lens_cpu=seq_lens_cpu, next_token_logits_buffer=None,
            aux_hidden_states_buffer=None, aux_projection=None, is_capturing=False,
            prepared_graph=i)
        return dataclasses.replace(fb, **layout.live(fb, inputs))

    def replay_padding(self, i: int) -> None:
        """Replay graph `i` over its padding batch, as its warm-ups ran it (KV writes to the
        padding slot): what a step of its size costs, without a request (the start-up step
        cost probe; not between a step's forward and its readback)."""
        layout, static = self.layouts[i], self.static[i]
        host = layout.padding()
        to_device_into(self.buffers.packed, host.values)
        static.seq_lens_cpu.copy_(torch.tensor(host.seq_lens_cpu))
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(static)
        self.backend.replay(self.graphs[i])

    def replay(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay the graph `prepare` gave `batch`, then its sampling tail when a request
        samples. The outputs are views of static storage covering `batch` (its logits rows,
        its tokens' aux rows), valid until the next replay of any graph sharing it: the
        epilogue, captured with the graph, consumes the aux rows; callers read the logits
        before their next forward."""
        i = batch.prepared_graph
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(self.static[i])
        self.backend.replay(self.graphs[i])
        if batch.has_sampling and self.sampling_graphs:
            self.backend.replay(self.sampling_graphs[i])
        out = self.outputs[i]
        rows = (batch.logits_rows.shape[0] if batch.logits_rows is not None
                else batch.batch_size * batch.logits_per_req or batch.num_tokens)
        aux = out.aux_hidden_states
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:rows], hidden_states=None,
            aux_hidden_states=None if aux is None else aux[: batch.num_tokens])

"""Captures one MIXED graph per (step requests, arrival tokens): a running batch's step and
arrivals' prefills in one forward.

On a small model a prefill step stalls the running batch for a whole forward of
latency-bound kernels (SmolLM2, a harness arrival: ~1.5 ms against a bs-32 verify step's
~1.5 ms). Riding the arrivals' tokens in the step's own forward costs their attention and a
few wider GEMMs instead. A graph holds `step_bs` step requests (the decode graphs' sizes,
padded with the padding row) and up to `max_arrivals` arrivals over `arrival_tokens` tokens
(padded as a prefill graph pads); `build_mixed_batch` lays a live batch out exactly so.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue, run_model
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.model_executor.runner_utils.mixed_buffers import MixedInputBuffers

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class MixedCudaGraphRunner:
    def __init__(self, model_runner: ModelRunner, *, width: int, step_bs: list[int],
                 arrival_tokens: list[int], max_arrivals: int, backend: GraphBackend,
                 buffers: MixedInputBuffers, epilogue: Epilogue | None = None,
                 streamed_aux: StreamedAux | None = None):
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
        need = self.layout_sizes(self.step_bs[-1], self.arrival_tokens[-1])
        have = (buffers.input_ids.shape[0], buffers.req_pool_indices.shape[0],
                buffers.logits_rows.shape[0])
        if any(h < n for h, n in zip(have, need, strict=True)):
            raise ValueError(f"buffers for (tokens, requests, logits rows) {have} do not fit "
                             f"the largest mixed graph's {need}")
        self.backend = backend
        self.buffers = buffers
        self.epilogue = epilogue
        self.streamed_aux = streamed_aux
        self.graphs: dict[tuple[int, int], object] = {}
        self.outputs: dict[tuple[int, int], LogitsProcessorOutput] = {}
        self.forward_batches: dict[tuple[int, int], ForwardBatch] = {}
        self.capture_stats: dict[str, object] = {}

    def layout_sizes(self, step_bs: int, arrival_tokens: int) -> tuple[int, int, int]:
        """(tokens, requests, logits rows) of the graph `(step_bs, arrival_tokens)`."""
        w, a = self.width, self.max_arrivals
        return step_bs * w + arrival_tokens, step_bs + a, step_bs * w + a

    def padded_layout(self, step_bs: int, num_arrivals: int, arrival_tokens: int
                      ) -> tuple[int, int, int] | None:
        """(step requests, arrivals, arrival tokens) of the smallest graph that fits, or None."""
        i = bisect.bisect_left(self.step_bs, step_bs)
        j = bisect.bisect_left(self.arrival_tokens, arrival_tokens)
        if (i == len(self.step_bs) or j == len(self.arrival_tokens)
                or not 0 < num_arrivals <= self.max_arrivals or not self.graphs):
            return None
        return self.step_bs[i], self.max_arrivals, self.arrival_tokens[j]

    def capture_prepare(self, step_bs: int, arrival_tokens: int) -> ForwardBatch:
        """The static batch of a graph. Its host list says one arrival holds every arrival
        token: that sizes the extend attention's grid for any batch the graph replays."""
        b, runner, a = self.buffers, self.model_runner, self.max_arrivals
        tokens, reqs, rows = self.layout_sizes(step_bs, arrival_tokens)
        projection = None
        if self.streamed_aux is not None:
            projection = self.streamed_aux.new(tokens, runner.model_config.dtype,
                                               b.aux_projection_acc[:tokens])
        return ForwardBatch(
            forward_mode=ForwardMode.MIXED,
            batch_size=reqs,
            input_ids=b.input_ids[:tokens],
            req_pool_indices=b.req_pool_indices[:reqs],
            seq_lens=b.seq_lens[:reqs],
            seq_lens_cpu=b.seq_lens_cpu[:reqs],
            out_cache_loc=b.out_cache_loc[:tokens],
            positions=b.positions[:tokens],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            extend_seq_lens_cpu=[self.width] * step_bs + [arrival_tokens] + [0] * (a - 1),
            extend_prefix_lens=b.extend_prefix_lens[:reqs],
            extend_seq_lens=b.extend_seq_lens[:reqs],
            extend_start_loc=b.extend_start_loc[:reqs],
            next_token_logits_buffer=b.next_token_logits_buffer[:rows],
            aux_hidden_states_buffer=None if b.aux_hidden_states is None
            else b.aux_hidden_states[:tokens],
            aux_projection=projection,
            is_capturing=True,
            mixed_step_bs=step_bs,
            mixed_step_width=self.width,
            logits_rows=b.logits_rows[:rows],
        )

    def capture(self) -> None:
        """Capture every layout, largest first (later graphs reuse its pool blocks)."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        model, attn = self.model_runner.model, self.model_runner.attn_backend
        for bs in reversed(self.step_bs):
            for n in reversed(self.arrival_tokens):
                fb = self.capture_prepare(bs, n)
                attn.init_forward_metadata_capture_cuda_graph(fb)

                def run(fb: ForwardBatch = fb) -> LogitsProcessorOutput:
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

    def _key(self, batch: ForwardBatch) -> tuple[int, int]:
        bs = batch.mixed_step_bs
        return bs, batch.num_tokens - bs * batch.mixed_step_width

    def can_run_graph(self, batch: ForwardBatch) -> bool:
        return (batch.forward_mode == ForwardMode.MIXED
                and batch.mixed_step_width == self.width
                and batch.batch_size == batch.mixed_step_bs + self.max_arrivals
                and self._key(batch) in self.graphs
                and batch.aux_projection is None)

    def execute(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay for `batch` (laid out as its graph's layout). The outputs are views of
        static storage (logits `[step_bs * width + max_arrivals, vocab]` in `logits_rows`
        order, aux rows `[num_tokens, K * H]`), valid until the next replay of any graph
        sharing that storage: the epilogue, captured with the graph, consumes the aux rows;
        the worker reads the logits before its next forward."""
        key = self._key(batch)
        static = self.forward_batches[key]
        self.buffers.load(batch, static)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(static)
        self.backend.replay(self.graphs[key])
        out = self.outputs[key]
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits,
            hidden_states=None,
            aux_hidden_states=out.aux_hidden_states,
        )

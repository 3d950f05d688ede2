"""Captures one graph per batch size for a fixed-layout forward and replays the smallest fit.

Keep this file to the capture/replay mechanics; buffers live in `DecodeInputBuffers`, the
replay mechanism behind `GraphBackend`, model specifics in the model.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue, EpilogueFn, run_model
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_utils.buffers import DecodeInputBuffers
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

logger = logging.getLogger(__name__)



class DecodeCudaGraphRunner:
    """Graphs for `forward_mode` with `captured_req_width` tokens per request
    (1 for DECODE, the block size for TARGET_VERIFY and DRAFT_BLOCK). With `streamed_aux`,
    each graph projects its aux states into a row prefix of one runner-owned accumulator.
    The aux storage has at least `aux_rows` rows: the runner's prefill graphs borrow it."""

    def __init__(self, model_runner: ModelRunnerView, *, forward_mode: ForwardMode,
                 captured_req_width: int, capture_bs: list[int], backend: GraphBackend,
                 epilogue: Epilogue | None = None, streamed_aux: StreamedAux | None = None,
                 aux_rows: int = 0, step_prologue: StepPrologue | None = None):
        if not forward_mode.is_cuda_graph():
            raise ValueError(f"{forward_mode.name} has no fixed layout to capture")
        if epilogue is not None and epilogue.mode != forward_mode:
            raise ValueError(f"a {epilogue.mode.name} epilogue on {forward_mode.name} graphs")
        if streamed_aux is not None and streamed_aux.mode != forward_mode:
            raise ValueError(f"a {streamed_aux.mode.name} streamed projection on "
                             f"{forward_mode.name} graphs")
        self.epilogue = epilogue
        self.streamed_aux = streamed_aux
        # With one, every graph derives its inputs from `buffers.step_rows` and replays only
        # batches `prepare_step` made (any other batch runs eagerly).
        self.step_prologue = step_prologue
        self.model_runner = model_runner
        self.forward_mode = forward_mode
        self.captured_req_width = captured_req_width
        self.capture_bs = sorted(capture_bs)
        self.max_bs = self.capture_bs[-1]
        self.max_num_token = self.max_bs * captured_req_width
        self.backend = backend
        cfg = model_runner.model_config
        self.buffers = DecodeInputBuffers.create(
            max_bs=self.max_bs,
            tokens_per_req=captured_req_width,
            vocab_size=cfg.hf_config.vocab_size,
            hidden_size=cfg.hf_config.hidden_size,
            dtype=cfg.dtype,
            device=model_runner.device,
            aux_hidden_states_width=model_runner.get_aux_hidden_states_width(),
            aux_projection_width=0 if streamed_aux is None else streamed_aux.width,
            pp_size=model_runner.pp_size,
            aux_rows=aux_rows,
        )
        model_runner.attn_backend.init_cuda_graph_state(self.max_bs, self.max_num_token)
        self.graphs: dict[int, object] = {}
        # per size, the epilogue's sampling step (empty without one); replayed after graphs[bs]
        self.sampling_graphs: dict[int, object] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}
        self.forward_batches: dict[int, ForwardBatch] = {}
        self.capture_stats: dict[str, object] = {}

    def capture_prepare(self, bs: int) -> ForwardBatch:
        """A ForwardBatch of row-prefix views of the buffers for `bs` requests."""
        b, n = self.buffers, bs * self.captured_req_width
        projection = None
        if self.streamed_aux is not None:
            projection = self.streamed_aux.new(n, self.model_runner.model_config.dtype,
                                               b.aux_projection_acc[:n])
        return ForwardBatch(
            forward_mode=self.forward_mode,
            batch_size=bs,
            input_ids=b.input_ids[:n],
            req_pool_indices=b.req_pool_indices[:bs],
            seq_lens=b.seq_lens[:bs],
            seq_lens_cpu=b.seq_lens_cpu[:bs],
            out_cache_loc=b.out_cache_loc[:n],
            positions=b.positions[:n],
            req_to_token_pool=self.model_runner.req_to_token_pool,
            token_to_kv_pool=self.model_runner.token_to_kv_pool,
            attn_backend=self.model_runner.attn_backend,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            next_token_logits_buffer=b.next_token_logits_buffer[:n],
            aux_hidden_states_buffer=None if b.aux_hidden_states is None
            else b.aux_hidden_states[:n],
            aux_projection=projection,
            pp_proxy_tensors=None if b.pp_proxy_tensors is None
            else {k: v[:n] for k, v in b.pp_proxy_tensors.items()},
            is_capturing=True,
        )

    def capture(self) -> None:
        """Capture every size, largest first, two eager warm-ups before each; the epilogue,
        if any, is part of every graph, and its sampling step gets a tail graph per size."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        model = self.model_runner.model
        for bs in reversed(self.capture_bs):
            fb = self.capture_prepare(bs)
            self.model_runner.attn_backend.init_forward_metadata_capture_cuda_graph(fb)

            def run(fb: ForwardBatch = fb) -> LogitsProcessorOutput:
                if self.step_prologue is not None:
                    self.step_prologue(fb, self.buffers.step_rows)
                return run_model(model, fb, self.epilogue)

            self.graphs[bs], self.outputs[bs] = self.backend.warm_and_capture(run)
            self.forward_batches[bs] = fb
        seconds = time.perf_counter() - start
        self.capture_stats = {
            "forward_mode": self.forward_mode.name,
            "capture_bs": list(self.capture_bs),
            "seconds": round(seconds, 3),
            **probe.delta(),
            "aux_buffer_bytes": self.buffers.aux_nbytes(),
            "aux_shared": self.buffers.aux_hidden_states is not None,
            "aux_path": self.buffers.aux_path,
        }
        if self.epilogue is not None and self.epilogue.sampling_fn is not None:
            self.capture_stats["sampling_tail"] = self._capture_sampling_tails(
                self.epilogue.sampling_fn)
        logger.info(
            "Captured %s graphs for bs %s in %.2f s; free memory dropped %.1f MiB; "
            "retained aux (%s) %.1f MiB", self.forward_mode.name, self.capture_bs, seconds,
            self.capture_stats["free_memory_drop_bytes"] / 2**20, self.buffers.aux_path,
            self.buffers.aux_nbytes() / 2**20,
        )

    def _capture_sampling_tails(self, sampling_fn: EpilogueFn) -> dict[str, object]:
        """One tail graph per size, after every main graph (so its memory is measured on its
        own): the sampling step over that size's static inputs and outputs."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        for bs in reversed(self.capture_bs):
            fb, out = self.forward_batches[bs], self.outputs[bs]

            def tail(fb: ForwardBatch = fb, out: LogitsProcessorOutput = out
                     ) -> LogitsProcessorOutput:
                sampling_fn(fb, out)
                return out

            self.sampling_graphs[bs], _ = self.backend.warm_and_capture(tail)
        stats = {"seconds": round(time.perf_counter() - start, 3), **probe.delta()}
        logger.info("Captured %s sampling tails in %.2f s; free memory dropped %.1f MiB",
                    self.forward_mode.name, stats["seconds"],
                    stats["free_memory_drop_bytes"] / 2**20)
        return stats

    def can_run_graph(self, batch: ForwardBatch) -> bool:
        if self.step_prologue is not None and batch.prepared_graph_bs is None:
            return False
        return (
            batch.forward_mode == self.forward_mode
            and 0 < batch.batch_size <= self.max_bs
            and batch.num_tokens == batch.batch_size * self.captured_req_width
            and batch.capture_hidden_mode == CaptureHiddenMode.NULL
            and bool(self.graphs)
        )

    def padded_bs(self, raw_bs: int) -> int:
        return self.capture_bs[bisect.bisect_left(self.capture_bs, raw_bs)]

    def fits_step(self, bs: int) -> bool:
        """Whether `prepare_step` takes a step of `bs` requests."""
        return self.step_prologue is not None and bool(self.graphs) and 0 < bs <= self.max_bs

    def prepare_step(self, rows: list[int], kv_len_bounds: list[int]) -> ForwardBatch:
        """Queue a step's request rows into the static rows buffer of the smallest size
        that fits (one pinned copy, padding included) and return its batch: row-prefix views
        of that size's static inputs, which the replay's prologue fills. `kv_len_bounds`
        bound the rows' device kv_lens (host-side lengths only)."""
        bs = len(rows)
        padded = self.padded_bs(bs)
        self.buffers.load_step([*rows, *[PADDING_REQ_ROW] * (padded - bs)], kv_len_bounds)
        static, n = self.forward_batches[padded], bs * self.captured_req_width
        return dataclasses.replace(
            static, batch_size=bs, input_ids=static.input_ids[:n],
            req_pool_indices=static.req_pool_indices[:bs], seq_lens=static.seq_lens[:bs],
            seq_lens_cpu=static.seq_lens_cpu[:bs], out_cache_loc=static.out_cache_loc[:n],
            positions=static.positions[:n], next_token_logits_buffer=None,
            aux_hidden_states_buffer=None, aux_projection=None, is_capturing=False,
            prepared_graph_bs=padded)

    def load_batch(self, batch: ForwardBatch) -> int:
        """Copy `batch` into the static buffers of the smallest captured size that fits."""
        bs = self.padded_bs(batch.batch_size)
        self.buffers.load(batch, bs)
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
            self.forward_batches[bs]
        )
        return bs

    def execute(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay for `batch`, then its sampling tail when a request samples. The outputs
        are views `[:num_tokens]` of static storage, valid until the next replay of this
        runner: copy what must outlive it."""
        if batch.prepared_graph_bs is None:
            bs = self.load_batch(batch)
        else:
            bs = batch.prepared_graph_bs
            self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(
                self.forward_batches[bs])
        self.backend.replay(self.graphs[bs])
        if batch.has_sampling and self.sampling_graphs:
            self.backend.replay(self.sampling_graphs[bs])
        out, n = self.outputs[bs], batch.num_tokens
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:n],
            hidden_states=None,
            aux_hidden_states=None if out.aux_hidden_states is None
            else out.aux_hidden_states[:n],
        )


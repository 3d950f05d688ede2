"""Captures one EXTEND graph per token count and replays the smallest that fits a prefill.

A small model's prefill is host-bound: hundreds of launches for ~2 ms of GPU work (SmolLM2,
900 tokens: 24-30 ms eager on the H200). A graph of `num_tokens` tokens and up to `max_bs`
requests replays any prefill that fits, padded as `PrefillInputBuffers` describes. Larger
prefills, more requests, hidden-state capture and staged MXFP8 projections run eagerly.
"""

from __future__ import annotations

import bisect
import logging
import time
from typing import TYPE_CHECKING

from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue, run_model
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.model_executor.runner_utils.prefill_buffers import PrefillInputBuffers

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.runner.model_runner_view import ModelRunnerView

logger = logging.getLogger(__name__)



class PrefillCudaGraphRunner:
    def __init__(self, model_runner: ModelRunnerView, *, capture_tokens: list[int], max_bs: int,
                 backend: GraphBackend, buffers: PrefillInputBuffers,
                 epilogue: Epilogue | None = None, streamed_aux: StreamedAux | None = None):
        for name, part in (("epilogue", epilogue), ("streamed projection", streamed_aux)):
            if part is not None and part.mode != ForwardMode.EXTEND:
                raise ValueError(f"a {part.mode.name} {name} on EXTEND graphs")
        if buffers.max_bs != max_bs or buffers.max_tokens < max(capture_tokens):
            raise ValueError(f"buffers for {buffers.max_bs} requests / {buffers.max_tokens} "
                             f"tokens do not fit graphs of {max_bs} / {max(capture_tokens)}")
        self.model_runner = model_runner
        self.capture_tokens = sorted(capture_tokens)
        self.max_bs = max_bs
        self.backend = backend
        self.buffers = buffers
        self.epilogue = epilogue
        self.streamed_aux = streamed_aux
        self.graphs: dict[int, object] = {}
        self.outputs: dict[int, LogitsProcessorOutput] = {}
        self.forward_batches: dict[int, ForwardBatch] = {}
        self.capture_stats: dict[str, object] = {}

    def capture_prepare(self, num_tokens: int) -> ForwardBatch:
        """The static batch of a `num_tokens` graph. Its host lists say one request holds
        every token: that sizes the attention grid for any batch the graph replays."""
        b, bs, runner = self.buffers, self.max_bs, self.model_runner
        projection = None
        if self.streamed_aux is not None:
            projection = self.streamed_aux.new(num_tokens, runner.model_config.dtype,
                                               b.aux_projection_acc[:num_tokens])
        return ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            batch_size=bs,
            input_ids=b.input_ids[:num_tokens],
            req_pool_indices=b.req_pool_indices,
            seq_lens=b.seq_lens,
            seq_lens_cpu=b.seq_lens_cpu,
            out_cache_loc=b.out_cache_loc[:num_tokens],
            positions=b.positions[:num_tokens],
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool=runner.token_to_kv_pool,
            attn_backend=runner.attn_backend,
            extend_prefix_lens_cpu=[0] * bs,
            extend_seq_lens_cpu=[num_tokens] + [0] * (bs - 1),
            extend_prefix_lens=b.extend_prefix_lens,
            extend_seq_lens=b.extend_seq_lens,
            extend_start_loc=b.extend_start_loc,
            next_token_logits_buffer=b.next_token_logits_buffer,
            aux_hidden_states_buffer=None if b.aux_hidden_states is None
            else b.aux_hidden_states[:num_tokens],
            aux_projection=projection,
            is_capturing=True,
        )

    def capture(self) -> None:
        """Capture every token count, largest first (later graphs reuse its pool blocks)."""
        probe = MemoryProbe(self.model_runner.device)
        start = time.perf_counter()
        model, attn = self.model_runner.model, self.model_runner.attn_backend
        for n in reversed(self.capture_tokens):
            fb = self.capture_prepare(n)
            attn.init_forward_metadata_capture_cuda_graph(fb)

            def run(fb: ForwardBatch = fb) -> LogitsProcessorOutput:
                return run_model(model, fb, self.epilogue)

            self.graphs[n], self.outputs[n] = self.backend.warm_and_capture(run)
            self.forward_batches[n] = fb
        seconds = time.perf_counter() - start
        self.capture_stats = {"forward_mode": "EXTEND", "capture_tokens": self.capture_tokens,
                              "max_bs": self.max_bs, "seconds": round(seconds, 3),
                              **probe.delta()}
        logger.info("Captured EXTEND graphs for %s tokens (<= %d requests) in %.2f s; free "
                    "memory dropped %.1f MiB", self.capture_tokens, self.max_bs, seconds,
                    self.capture_stats["free_memory_drop_bytes"] / 2**20)

    def can_run_graph(self, batch: ForwardBatch) -> bool:
        return (batch.forward_mode == ForwardMode.EXTEND
                and 0 < batch.batch_size <= self.max_bs
                and 0 < batch.num_tokens <= self.capture_tokens[-1]
                and batch.capture_hidden_mode == CaptureHiddenMode.NULL
                and batch.aux_projection is None  # a staged MXFP8 input runs eagerly
                and batch.extend_start_loc is not None
                and bool(self.graphs))

    def padded_tokens(self, num_tokens: int) -> int:
        return self.capture_tokens[bisect.bisect_left(self.capture_tokens, num_tokens)]

    def execute(self, batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replay for `batch`. The outputs are views of static storage (logits `[bs, vocab]`,
        aux rows `[num_tokens, K * H]`), valid until the next replay of any graph sharing
        that storage: the epilogue, captured with the graph, is their consumer."""
        n = self.padded_tokens(batch.num_tokens)
        self.buffers.load(batch, n)
        static, bs = self.forward_batches[n], batch.batch_size
        # Host lists for host-side backends (the CPU's eager replay re-runs them).
        static.extend_prefix_lens_cpu = [*batch.extend_prefix_lens_cpu, *[0] * (self.max_bs - bs)]
        static.extend_seq_lens_cpu = [*batch.extend_seq_lens_cpu, *[0] * (self.max_bs - bs)]
        self.model_runner.attn_backend.init_forward_metadata_replay_cuda_graph(static)
        self.backend.replay(self.graphs[n])
        out = self.outputs[n]
        return LogitsProcessorOutput(
            next_token_logits=out.next_token_logits[:bs],
            hidden_states=None,
            aux_hidden_states=None if out.aux_hidden_states is None
            else out.aux_hidden_states[: batch.num_tokens],
        )

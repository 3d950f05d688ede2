"""CUDA graphs: one capture stream, a process-wide memory pool (`pool.py`)."""

from __future__ import annotations

import gc
from contextlib import AbstractContextManager

import torch

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.runner_backend.base import (
    NUM_WARMUPS,
    CapturedFn,
    GraphBackend,
)
from sglang_aux.srt.model_executor.runner_utils.frozen_gc import frozen_gc, in_frozen_gc
from sglang_aux.srt.model_executor.runner_utils.pool import get_global_graph_memory_pool


class CudaGraphBackend(GraphBackend):
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(device=self.device)

    def capture(self, fn: CapturedFn) -> tuple[torch.cuda.CUDAGraph, LogitsProcessorOutput]:
        graph = torch.cuda.CUDAGraph()
        # A collection during capture may free garbage that holds CUDA state (a pinned
        # readback buffer records an event on the default stream as it goes back to its
        # allocator), which invalidates the capture: collect first, none while capturing
        # (inside `capture_session`, which `GraphRunner.capture` holds, that one is done).
        if not in_frozen_gc():
            gc.collect()
        torch.cuda.synchronize(self.device)
        pool = get_global_graph_memory_pool(holder=self)
        enabled = gc.isenabled()
        gc.disable()
        try:
            with torch.cuda.graph(graph, pool=pool, stream=self.stream):
                out = fn()
        finally:
            if enabled:
                gc.enable()
        torch.cuda.synchronize(self.device)
        return graph, out

    def warm_and_capture(self, fn: CapturedFn) -> tuple[torch.cuda.CUDAGraph,
                                                        LogitsProcessorOutput]:
        """The warm-ups run on the capture stream (PyTorch's rule for graphs that capture
        NCCL collectives: under tensor parallelism each forward all-reduces and gathers)."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for _ in range(NUM_WARMUPS):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.synchronize()
        return self.capture(fn)

    def capture_session(self) -> AbstractContextManager[None]:
        """The heap frozen (`frozen_gc`): one full collection for the run, not one a graph."""
        return frozen_gc()

    def replay(self, handle: torch.cuda.CUDAGraph) -> None:
        handle.replay()

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

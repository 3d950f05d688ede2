"""CPU stand-in for CUDA graphs: replay re-runs the captured closure over the same buffers.

Outputs keep graph semantics: tensors the closure writes into runner storage (logits, the
shared aux buffer) are already static; any other output tensor is copied into the tensor
returned at capture, as a graph's private output would be overwritten in place.
"""

from __future__ import annotations

import dataclasses

from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.model_executor.runner_backend.base import CapturedFn, GraphBackend

_Handle = tuple[CapturedFn, LogitsProcessorOutput]


class EagerReplayBackend(GraphBackend):
    def capture(self, fn: CapturedFn) -> tuple[_Handle, LogitsProcessorOutput]:
        static = fn()
        return (fn, static), static

    def replay(self, handle: _Handle) -> None:
        fn, static = handle
        fresh = fn()
        for f in dataclasses.fields(static):
            dst, src = getattr(static, f.name), getattr(fresh, f.name)
            if (dst is None) != (src is None):
                raise RuntimeError(f"replayed output {f.name!r} changed presence")
            if dst is not None and src.data_ptr() != dst.data_ptr():
                dst.copy_(src)

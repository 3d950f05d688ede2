"""What a launch issues on the device outside graph replays: a TorchDispatchMode as a harness."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.model_runner import ModelRunner

_ALLOCATIONS = {"empty", "empty_strided"}  # no kernel runs


class _Recorder(TorchDispatchMode):
    def __init__(self, device: torch.device, ops: list[str]):
        super().__init__()
        self.device, self.ops, self.paused = device, ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if (not self.paused and not func.is_view and name not in _ALLOCATIONS
                and any(isinstance(t, torch.Tensor) and t.device.type == self.device.type
                        for t in tree_leaves((args, kwargs)))):
            self.ops.append(name)
        return func(*args, **kwargs)


@contextmanager
def launch_ops(runner: ModelRunner) -> Iterator[list[str]]:
    """Yield the list of ops (by name) that touch a tensor on the runner's device while
    active, views and allocations aside (on the CPU every op does), but none of those inside
    a replay of the runner's graphs."""
    ops: list[str] = []
    recorder = _Recorder(runner.device, ops)
    graphs = runner.graph_runners.values()
    backends = list({id(g.backend): g.backend for g in graphs}.values())

    def paused(replay):
        def run(handle) -> None:
            recorder.paused += 1
            try:
                replay(handle)
            finally:
                recorder.paused -= 1
        return run

    for backend in backends:
        backend.replay = paused(backend.replay)
    try:
        with recorder:
            yield ops
    finally:
        for backend in backends:
            del backend.replay  # the class's method again

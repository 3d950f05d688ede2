"""What the scheduler process builds and drives: the in-process engine of
`entrypoints/engine.py`, described here so that this layer never imports the one above it.
The entry point hands its `Engine` class down as the `EngineFactory`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.scheduler.scheduler import Scheduler
from sglang_aux.srt.managers.scheduler.tp_step_broadcast import StepBroadcast
from sglang_aux.srt.managers.scheduler.worker import Worker
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs


class ServingEngine(Protocol):
    server_args: ServerArgs  # resolved (dtype, graph sizes) by the engine
    model_config: ModelConfig
    tokenizer: Tokenizer
    worker: Worker  # managers.model_worker.ModelWorker or speculative's DFlashWorker
    scheduler: Scheduler
    # the scheduler's commands and steps, sent to the other tensor-parallel ranks
    step_broadcast: StepBroadcast


# called in the scheduler process with the args alone (under tensor parallelism, and in each
# follower, with `tp_rank=` too): a module-level callable (pickled by reference)
EngineFactory = Callable[..., ServingEngine]

"""What the scheduler process builds and drives: the in-process engine of
`entrypoints/engine.py`, described here so that this layer never imports the one above it.
The entry point hands its `Engine` class down as the `EngineFactory`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.managers.scheduler import Scheduler
from sglang_aux.srt.managers.tp_worker import TpModelWorker
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker


class ServingEngine(Protocol):
    server_args: ServerArgs  # resolved (dtype, graph sizes) by the engine
    model_config: ModelConfig
    tokenizer: Tokenizer
    worker: TpModelWorker | DFlashWorker
    scheduler: Scheduler


# called in the scheduler process: a module-level callable (pickled by reference)
EngineFactory = Callable[[ServerArgs], ServingEngine]

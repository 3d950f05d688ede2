"""The target's engine, a samples file's samples and their training features, kept between
the trainings of one process (a recipe search's variants): extracting the features takes
longer than a short variant trains (about 150 s for the mix recipe's 17.5 million tokens on an
H100), and every variant that reads the same samples through the same target layers reads the
same features. One entry: training with other layers, samples or engine settings frees it
before it extracts its own."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.tools.dflash_training.data import Sample
from sglang_aux.tools.dflash_training.sequence_set import SequenceSet


@dataclass
class Features:
    key: tuple  # what they depend on (`train_dflash._feature_key`)
    engine: Engine
    samples: list[Sample]  # the samples file's (`--extra-samples-file`'s are read again)
    data: SequenceSet  # of those and the extra files' samples
    seconds: float  # what extracting them took


class FeatureCache:
    def __init__(self) -> None:
        self.entry: Features | None = None

    def get(self, key: tuple) -> Features | None:
        return self.entry if self.entry is not None and self.entry.key == key else None

    def put(self, entry: Features) -> None:
        self.entry = entry

    def clear(self) -> None:
        """Free the entry (its engine's KV pool and the features on the device) before other
        features or an evaluation engine take the memory."""
        if self.entry is None:
            return
        self.entry = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

"""A training run's checkpoint, so a draft trains over several runs (`train_dflash --resume`):
the trainer's whole state (`Trainer.state_dict`) beside the run's fingerprint, what makes two
runs the same training (the recipe, the draft's config, the training config, the data). A run
continues only a checkpoint of the same fingerprint; then k steps in one run and the rest in
the next give the weights of one uninterrupted run."""

from __future__ import annotations

import hashlib
import os
import pickle
import zipfile
from array import array
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from sglang_aux.tools.dflash_training.config_diff import first_difference
from sglang_aux.tools.dflash_training.data import BadInputError, Sample
from sglang_aux.tools.dflash_training.trainer import TrainConfig, Trainer

CHECKPOINT_SUFFIX = ".checkpoint.pt"  # beside the draft folder: `<out>.checkpoint.pt`


def default_checkpoint(out: str | Path) -> Path:
    """Where a `--resume` run into the draft folder `out` keeps its checkpoint by default."""
    return Path(f"{out}{CHECKPOINT_SUFFIX}")
# TrainConfig fields a later run may change: they shape its log or its pace, not what it trains
# (the rows' stream changes no bit; a compiled or packed step computes the same objective,
# rounded apart, as fused AdamW does with the same state; which validation's draft is
# written is chosen at the end)
RUN_ONLY_FIELDS = ("log_every", "profile_steps", "batch_stream", "compile", "pack_context",
                   "val_every", "keep_best", "fused_adam")


def data_digest(samples: list[Sample]) -> str:
    """sha256 of the samples' token ids, in order (which sequences training draws from)."""
    h = hashlib.sha256()
    for s in samples:
        h.update(array("q", [len(s.prompt_ids), len(s.output_ids), *s.prompt_ids,
                             *s.output_ids]).tobytes())
    return h.hexdigest()


def run_fingerprint(*, recipe: str | None, algorithm: str, target: str, draft_config: dict,
                    cfg: TrainConfig, samples: list[Sample], init: str | None = None) -> dict:
    """`init`: the sha256 of the weights training started from (`--init-from`), if any."""
    train = {k: v for k, v in asdict(cfg).items() if k not in RUN_ONLY_FIELDS}
    return dict(recipe=recipe, algorithm=algorithm, target=target, draft=draft_config,
                train=train, num_samples=len(samples), data=data_digest(samples), init=init)


@dataclass(frozen=True)
class TrainingCheckpoint:
    path: Path
    fingerprint: dict

    def save(self, trainer: Trainer) -> None:
        """Write the trainer's state whole or not at all: a run cut while writing leaves the
        previous checkpoint."""
        tmp = self.path.with_name(f".tmp.{self.path.name}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"fingerprint": self.fingerprint, "trainer": trainer.state_dict()}, tmp)
        os.replace(tmp, self.path)

    def load(self, trainer: Trainer) -> bool:
        """Continue from the checkpoint when there is one (True); `BadInputError` naming the
        file when it is not a checkpoint or is one of another run (the first field that
        differs)."""
        if not self.path.is_file():
            return False
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
            fingerprint, state = saved["fingerprint"], saved["trainer"]
        except (OSError, EOFError, RuntimeError, pickle.UnpicklingError, zipfile.BadZipFile,
                KeyError, TypeError) as e:
            first = str(e).splitlines()[0] if str(e) else ""
            raise BadInputError(f"{self.path}: not a training checkpoint "
                                f"({type(e).__name__}: {first})") from e
        if (diff := first_difference(fingerprint, self.fingerprint)) is not None:
            key, then, now = diff
            raise BadInputError(f"{self.path}: a checkpoint of another run ({key}: {then!r} in "
                                f"the checkpoint, {now!r} now); give another --checkpoint, or "
                                "train without --resume")
        trainer.load_state_dict(state)
        return True

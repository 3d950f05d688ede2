"""A training that starts from a written draft's weights (`train_dflash --init-from DIR`), so a
draft trains on over device sessions whose machines do not outlive them: a session brings the
draft folder back, the next one carries it in and goes on from it. Unlike `--resume`, which
continues one run's checkpoint exactly (optimizer moments, schedule, data order), this keeps
only the weights: the optimizer and the learning-rate schedule start anew."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError

from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.srt.models.weight_utils import safetensors_weights_iterator
from sglang_aux.tools.dflash_training.config_diff import first_difference
from sglang_aux.tools.dflash_training.data import BadInputError


@dataclass(frozen=True)
class WarmStart:
    digest: str  # sha256 of the weights started from
    training: str | None  # their card's training lines, carried into the new card

    def card_line(self, folder: str | Path) -> str:
        """The new card's line on where its training started."""
        earlier = (f" Their training: {self.training}" if self.training
                   else " Their card was not in the folder.")
        return (f"  Started from the weights of `{folder}` (sha256 {self.digest[:16]}); the "
                f"optimizer and schedule started anew.{earlier}\n")


def _card_training(folder: Path) -> str | None:
    """The '- Training:' entry of a draft card (with the lines that continue it, a 'Started
    from' line of its own included), joined into one line."""
    card = folder / "README.md"
    if not card.is_file():
        return None
    m = re.search(r"^- Training: (.*?)(?=^- )", card.read_text(), flags=re.M | re.S)
    return " ".join(m.group(1).split()) if m else None


def weights_digest(folder: Path) -> str:
    """sha256 over the folder's safetensors files, in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def init_from(draft: DFlashDraftModel, config: dict, folder: str | Path) -> WarmStart:
    """Load a draft folder's weights into `draft` (the config this training builds); their
    sha256 and their card's training. `BadInputError` naming the file when the folder is not
    a draft, its config differs from this training's (the first key that differs, both
    values), or its weights do not fit."""
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise BadInputError(f"--init-from {folder}: no config.json (not a draft folder)")
    try:
        theirs = json.loads(path.read_text())
    except ValueError as e:
        raise BadInputError(f"--init-from {path}: not JSON ({e})") from None
    ours = json.loads(json.dumps(config))  # as written: tuples become lists
    if (diff := first_difference(theirs, ours)) is not None:
        key, a, b = diff
        raise BadInputError(f"--init-from {path}: {key} is {a!r}, this training's draft has "
                            f"{b!r}")
    try:
        draft.load_weights(safetensors_weights_iterator(folder))
    except (ValueError, FileNotFoundError, SafetensorError) as e:
        raise BadInputError(f"--init-from {folder}: {e}") from None
    return WarmStart(weights_digest(folder), _card_training(folder))

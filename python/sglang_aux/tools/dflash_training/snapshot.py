"""A running training's draft written every so often (`--snapshot-every-s`), so that a machine
taken back mid-run still leaves a draft to carry home and train on (`--init-from`).

Each snapshot is a whole draft folder, `<out>.snapshots/step-<N>`, written beside and renamed
into place; the newest `SNAPSHOTS_KEPT` stay, so a reader copying the newest never finds it
deleted under it before the next two have been written."""

from __future__ import annotations

import shutil
from pathlib import Path

from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.tools.dflash_training.export import write_draft

SNAPSHOTS_SUFFIX = ".snapshots"
SNAPSHOTS_KEPT = 2


def snapshots_dir(out: str | Path) -> Path:
    """Where the snapshots of a training whose draft goes to `out` are written."""
    out = Path(out)
    return out.with_name(out.name + SNAPSHOTS_SUFFIX)


def snapshot_name(step: int) -> str:
    return f"step-{step:08d}"


def write_snapshot(draft: DFlashDraftModel, config: dict, out: str | Path, *, step: int,
                   total_steps: int, train_seconds: float, command: str,
                   token_map: tuple[int, list[int]] | None = None) -> Path:
    """The draft's weights at `step` as a draft folder under `snapshots_dir(out)`; the older
    snapshots past the newest `SNAPSHOTS_KEPT` are deleted."""
    root = snapshots_dir(out)
    card = (f"# {Path(out).name}, step {step:,} of {total_steps:,}\n\n"
            f"A snapshot of a training still running ({train_seconds:,.0f} s of training so "
            "far), written so that a run cut short leaves a draft: its weights at that step, "
            "not the finished draft (no held-out evaluation, no kept best step). Train on "
            f"from it with `--init-from <this folder>`.\n\nCommand: `{command}`\n")
    path = write_draft(draft, config, root / snapshot_name(step), card, token_map=token_map)
    for old in sorted(root.glob("step-*"))[:-SNAPSHOTS_KEPT]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def clear_snapshots(out: str | Path) -> None:
    """An earlier training's snapshots, deleted as a new one starts (a later step number of
    theirs would otherwise read as the newest)."""
    shutil.rmtree(snapshots_dir(out), ignore_errors=True)


def latest_snapshot(out: str | Path) -> Path | None:
    """The newest snapshot of the training whose draft goes to `out`, if any."""
    found = sorted(snapshots_dir(out).glob("step-*"))
    return found[-1] if found else None

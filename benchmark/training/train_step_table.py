"""The table of a `scripts/device/train_step.sh` run: for each variant's log (OUT/NAME.log), the
profiled step (wall and device busy, and the most device memory its steps held above their
start: what `--device-reserve-gb` must leave them), the feature pass's seconds (what a
variant that moves work into it, `--target-logsumexp`, pays there) and the pace of its
unprofiled steps from the log lines' timestamps, over every window between two logged steps
from `--from-step` on and over them all. The variants are compared in one call, so on one
machine.

    python benchmark/training/train_step_table.py OUT [--from-step 40] [--base base]

With `--base`, each variant's pace also as that variant's over its own (> 1: faster).
"""

from __future__ import annotations

import argparse
import re
import sys
from datetime import datetime
from pathlib import Path

STEP = re.compile(r"^(\S+ \S+) \S+ step (\d+)/(\d+) ")
PROFILE = re.compile(r"profile of \d+ steps: ([0-9.]+) ms a step, the device busy ([0-9.]+) ms"
                     r"(?: of it, ([0-9.]+) (GiB|MiB) at most above)?")
FEATURES = re.compile(r" sequences, \d+ tokens; features ([0-9.]+) s")
STAMP = "%Y-%m-%d %H:%M:%S,%f"


def read_log(path: Path) -> dict:
    """{"steps": [(step, seconds since the epoch)], "profile": (wall ms, busy ms, the steps'
    peak GiB above their start, from the GiB or MiB the log wrote, or None: logs before it)
    or None, "features": the feature pass's seconds or None (logs before it)}."""
    steps, profile, features = [], None, None
    for line in path.read_text(errors="replace").splitlines():
        if m := STEP.match(line):
            steps.append((int(m.group(2)), datetime.strptime(m.group(1), STAMP).timestamp()))
        elif m := PROFILE.search(line):
            peak = None if m.group(3) is None else \
                float(m.group(3)) / (1024 if m.group(4) == "MiB" else 1)
            profile = (float(m.group(1)), float(m.group(2)), peak)
        elif m := FEATURES.search(line):
            features = float(m.group(1))
    return {"steps": steps, "profile": profile, "features": features}


def pace(steps: list[tuple[int, float]], from_step: int) -> tuple[list[float], float | None]:
    """ms a step in each window between logged steps at or after `from_step`, and over all."""
    kept = [(s, t) for s, t in steps if s >= from_step]
    windows = [1e3 * (t1 - t0) / (s1 - s0)
               for (s0, t0), (s1, t1) in zip(kept, kept[1:], strict=False)]
    whole = 1e3 * (kept[-1][1] - kept[0][1]) / (kept[-1][0] - kept[0][0]) if len(kept) > 1 \
        else None
    return windows, whole


def table(out: Path, from_step: int, base: str | None) -> str:
    logs = {p.stem: read_log(p) for p in sorted(out.glob("*.log"))}
    logs = {name: log for name, log in logs.items() if log["steps"]}
    if not logs:
        raise SystemExit(f"train_step_table: error: no training log with step lines in {out}")
    paces = {name: pace(log["steps"], from_step) for name, log in logs.items()}
    if base is not None and (base not in paces or paces[base][1] is None):
        raise SystemExit(f"train_step_table: error: --base {base}: no paced log of that name "
                         f"in {out} (have {', '.join(logs)})")
    lines = [f"| variant | profiled: wall / device busy (ms) | windows from step {from_step} "
             f"(ms a step) | ms a step | step peak (GiB) | features (s) |"
             + (f" vs {base} |" if base else ""),
             "|---|---:|---|---:|---:|---:|" + ("---:|" if base else "")]
    for name, log in logs.items():
        windows, whole = paces[name]
        prof = "{:.1f} / {:.1f}".format(*log["profile"][:2]) if log["profile"] else "-"
        peak = log["profile"][2] if log["profile"] else None
        cells = [name, prof, " ".join(f"{w:.1f}" for w in windows) or "-",
                 f"{whole:.1f}" if whole else "-", "-" if peak is None else f"{peak:.2f}",
                 "-" if log["features"] is None else f"{log['features']:.1f}"]
        if base:
            cells.append(f"{paces[base][1] / whole:.3f}x" if whole else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the folder train_step.sh wrote (NAME.log each)")
    p.add_argument("--from-step", type=int, default=40,
                   help="pace the steps from this one on (the first ones compile and warm up)")
    p.add_argument("--base", default=None, help="the variant the others are compared with")
    args = p.parse_args(argv)
    text = table(args.out, args.from_step, args.base)
    sys.stdout.write(text)
    return text


if __name__ == "__main__":
    main()

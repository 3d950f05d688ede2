"""A recipe search for a DFlash (or DSpark) draft, measured: variants of one recipe trained on
the same samples file for the same number of steps, then each draft's held-out accept length
on every kind of prompt, in one table (issue 40 item 3; docs/training.md).

    python -m sglang_aux.tools.dflash_recipe_search --recipe R --samples-file S.jsonl.xz \\
        --root drafts/search --steps 2000 --deadline-s 540 \\
        --variant base= --variant layers3="--num-layers 3" --variant gamma5="--gamma 5"
    # the same command again until every variant is measured: each call resumes

Each variant is `train_dflash --recipe R --phase train --resume` with its flags, into
ROOT/NAME (its checkpoint beside it), in one process whose variants share the engine and the
features of the samples (extracted once for each set of target layers the variants read),
then `train_dflash --eval-only`, whose acceptance
profile (`acceptance_profile.json`) gives the accept length per verify step of each kind. A
call stops before `--deadline-s` (a device call's limit), leaving ROOT/search.json, which the
next call continues from: a variant cut mid-training resumes its checkpoint, a trained one
is measured, a measured one is kept. The state alone carried to a fresh ROOT (a later device
session) keeps the measured variants and trains again those whose checkpoint or draft stayed
behind. The table: ROOT/search.md, and printed.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

import torch

from sglang_aux.srt.configs.acceptance_profile import DRAFT_PROFILE
from sglang_aux.tools import train_dflash
from sglang_aux.tools.dflash_training import train_args
from sglang_aux.tools.dflash_training.config_diff import first_difference
from sglang_aux.tools.dflash_training.evaluate import EVAL_TASKS
from sglang_aux.tools.dflash_training.export import TRAINING_RECORD
from sglang_aux.tools.dflash_training.feature_cache import FeatureCache
from sglang_aux.tools.dflash_training.recipes import RECIPES
from sglang_aux.tools.dflash_training.training_checkpoint import default_checkpoint

STATE = "search.json"
TABLE = "search.md"
NAME = re.compile(r"[A-Za-z0-9_.-]+")
MIN_TRAIN_S = 30.0  # a training run shorter than this is not worth starting
# Dynamo keeps a compiled step function's graphs per function (8 by default), and each
# variant of another draft shape compiles its own (one or two: the context bucket's dimension
# goes dynamic once): past the limit a later variant's steps would run eagerly, at half the
# pace (compiled is the default on CUDA), so the search allows this many per variant.
COMPILES_PER_VARIANT = 4


class SearchError(ValueError):
    """Bad input: one line naming the flag or file."""


def parse_variant(text: str) -> tuple[str, str]:
    """`NAME=FLAGS` -> (name, flags as given)."""
    name, sep, flags = text.partition("=")
    if not sep or not NAME.fullmatch(name):
        raise SearchError(f"--variant {text!r}: expected NAME=FLAGS with NAME of letters, "
                          "digits, '_', '.' or '-' (FLAGS may be empty: the recipe as it is)")
    try:
        shlex.split(flags)
    except ValueError as e:
        raise SearchError(f"--variant {text!r}: {e}") from None
    return name, flags


def accept_per_step(histogram: list[int]) -> float:
    """Tokens a verify step emits on average (accepted proposals + 1)."""
    steps = sum(histogram)
    return sum((a + 1) * n for a, n in enumerate(histogram)) / steps if steps else 0.0


class Search:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.root = Path(args.root)
        self.path = self.root / STATE
        self.variants = dict(parse_variant(v) for v in args.variant)
        if len(self.variants) != len(args.variant):
            raise SearchError(f"--variant names must differ, got {args.variant}")
        if not Path(args.samples_file).is_file():
            raise SearchError(f"--samples-file {args.samples_file}: no such file (write it "
                              "with train_dflash --phase data)")
        self.algorithms = self._check_distinct()  # each variant's, which its evaluation runs
        self.state = self._load()
        self.features = FeatureCache()

    def _check_distinct(self) -> dict[str, str]:
        """Each variant's flags parsed as its training run parses them, before any model
        loads: a bad flag stops here, and two variants that would train the same draft (a flag
        at its recipe's value) stop with one line naming both. Returns each one's
        algorithm."""
        seen: dict[tuple, str] = {}
        algorithms = {}
        for name, flags in self.variants.items():
            args = vars(train_args.parse_args(self._argv("VARIANT", *self._train_flags(
                flags))))
            algorithms[name] = args["algorithm"]
            key = tuple(sorted((k, repr(v)) for k, v in args.items()
                               if k not in ("out", "checkpoint", "command", "deadline_s")))
            if key in seen:
                raise SearchError(f"--variant {name}={flags!r} trains what --variant "
                                  f"{seen[key]}={self.variants[seen[key]]!r} trains")
            seen[key] = name
        return algorithms

    def _train_flags(self, flags: str) -> list[str]:
        a = self.args
        return ["--phase", "train", "--samples-file", str(a.samples_file), "--resume",
                "--steps", str(a.steps), *shlex.split(flags)]

    def _load(self) -> dict:
        """The search so far; a file from another search (recipe, samples, steps or a
        variant's flags differ, or the recipe's defaults changed since: its `base=` would
        not be the draft measured) stops with one line naming it."""
        defaults = json.loads(json.dumps(RECIPES.get(self.args.recipe)))
        want = {"recipe": self.args.recipe, "recipe_defaults": defaults,
                "samples_file": str(self.args.samples_file), "steps": self.args.steps,
                "common": self.args.common}
        if not self.path.is_file():
            return {**want, "variants": {}}
        try:
            state = json.loads(self.path.read_text())
            for key, value in want.items():
                found = state.get(key) if key == "recipe_defaults" else state[key]
                if found != value:
                    raise SearchError(self._another_search(key, found, value))
            for name, v in state["variants"].items():
                if name in self.variants and v["flags"] != self.variants[name]:
                    raise SearchError(f"{self.path}: variant {name} was {v['flags']!r}, not "
                                      f"{self.variants[name]!r}: name it anew")
        except (ValueError, KeyError, TypeError) as e:
            if isinstance(e, SearchError):
                raise
            raise SearchError(f"{self.path}: not a search state ({type(e).__name__}: {e})"
                              ) from None
        self._restart_lost(state)
        return state

    def _another_search(self, key: str, found, value) -> str:
        """The line a state of another search is refused with: the key that differs (the
        first recipe default that moved, for the defaults), its value there and here."""
        if key == "recipe_defaults":
            if found is None:
                return (f"{self.path}: a search from before the recipe's defaults were "
                        "recorded: use another --root")
            key, found, value = first_difference({key: found}, {key: value})
        return f"{self.path}: a search with {key} {found!r}, not {value!r}: use another --root"

    def _restart_lost(self, state: dict) -> None:
        """A state carried to another machine (a later device session) keeps what it measured;
        a variant whose checkpoint or trained draft stayed behind trains again from step 0."""
        for name, v in state["variants"].items():
            out = self.root / name
            lost = (v["status"] == "trained" and not out.is_dir()) or (
                v["status"] == "training" and v["runs"] > 0
                and not default_checkpoint(out).is_file())
            if lost:
                print(f"search: {name}: its {'draft' if v['status'] == 'trained' else 'checkpoint'}"
                      f" is not under {self.root}: trained again from step 0", flush=True)
                v.update(status="training", runs=0, train_seconds=0.0)

    def _save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.state, indent=1))

    def _argv(self, name: str, *flags: str) -> list[str]:
        a = self.args
        common = ["--recipe", a.recipe] if a.recipe else []
        return [*common, *shlex.split(a.common), "--out", str(self.root / name), *flags]

    def _train_dflash(self, name: str, *flags: str) -> Path | None:
        return train_dflash.main(self._argv(name, *flags), self.features)

    def run(self) -> bool:
        """Train, then measure, what fits before the deadline; True when every variant is
        measured. The variants train one after another on the features the first extracted
        (`FeatureCache`: those of the variants that read other target layers apart), which
        are freed before the evaluations' engines start."""
        limit = max(torch._dynamo.config.recompile_limit,
                    COMPILES_PER_VARIANT * len(self.variants))
        # patched for the search alone, the caller's limit back after it
        with torch._dynamo.config.patch(recompile_limit=limit):
            return self._run()

    def _run(self) -> bool:
        a, start = self.args, time.perf_counter()
        left = (lambda: a.deadline_s - (time.perf_counter() - start)) if a.deadline_s \
            else (lambda: float("inf"))
        variants = {name: self.state["variants"].setdefault(
            name, {"flags": flags, "status": "training", "runs": 0, "train_seconds": 0.0})
            for name, flags in self.variants.items()}
        for name, v in variants.items():
            if v["status"] != "training":
                continue
            # the evaluations of this variant and of those trained but not yet measured: a
            # detached search that ends at its deadline leaves none of them unmeasured
            waiting = sum(w["status"] == "trained" for w in variants.values())
            budget = left() - a.eval_reserve_s * (1 + waiting)
            if budget < MIN_TRAIN_S:
                break
            t0 = time.perf_counter()
            out = self._train_dflash(
                name, *(["--deadline-s", str(budget)] if a.deadline_s else []),
                *self._train_flags(v["flags"]))
            v["runs"] += 1
            v["train_seconds"] = round(v["train_seconds"] + time.perf_counter() - t0, 1)
            if out is not None:
                v["status"] = "trained"
                record = json.loads((out / TRAINING_RECORD).read_text())
                v["step_ms"] = round(1e3 * record["train_seconds"] / record["steps"], 1)
            self._save()
            if out is None:  # cut by the deadline: its checkpoint holds it
                break
        self.features.clear()
        for name, v in variants.items():
            if v["status"] != "trained" or left() < a.eval_reserve_s:
                continue
            # the variant's flags are training's: its folder holds what the engine reads, and
            # its algorithm (a DSpark variant of a DFlash recipe) which worker reads it
            self._train_dflash(name, "--eval-only", "--algorithm", self.algorithms[name],
                               "--eval-tasks", *a.eval_tasks,
                               "--eval-num-prompts", str(a.eval_num_prompts))
            profile = json.loads((self.root / name / DRAFT_PROFILE).read_text())
            v["accept_per_step"] = {task: round(accept_per_step(h), 4)
                                    for task, h in profile["per_task"].items()}
            v["accept_histogram"] = profile["per_task"]
            v["status"] = "measured"
            self._save()
        self._save()
        return all(v["status"] == "measured" for v in variants.values())

    def table(self) -> str:
        tasks = self.args.eval_tasks
        lines = [f"Recipe search: `{self.args.recipe}`, {self.args.steps} steps each on "
                 f"`{Path(self.args.samples_file).name}`; held-out accept length per verify "
                 "step (accepted proposals + 1), greedy.", "",
                 "| variant | flags | status | runs | train s | ms a step | "
                 + " | ".join(tasks) + " |",
                 "|---|---|---|---:|---:|---:|" + "---:|" * len(tasks)]
        for name in self.variants:
            v = self.state["variants"].get(name, {"flags": self.variants[name],
                                                  "status": "not started", "runs": 0,
                                                  "train_seconds": 0.0})
            accept = v.get("accept_per_step", {})
            cells = [f"{accept[t]:.3f}" if t in accept else "-" for t in tasks]
            step = f"{v['step_ms']:.1f}" if "step_ms" in v else "-"
            lines.append(f"| {name} | `{v['flags'] or '(recipe)'}` | {v['status']} | "
                         f"{v['runs']} | {v['train_seconds']:.0f} | {step} | "
                         + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=None, choices=sorted(RECIPES),
                   help="the recipe every variant starts from")
    p.add_argument("--samples-file", required=True,
                   help="the samples every variant trains on (train_dflash --phase data)")
    p.add_argument("--root", required=True, help="where the drafts and the search state go")
    p.add_argument("--variant", action="append", required=True,
                   help="NAME=FLAGS: train_dflash flags over the recipe's (repeat)")
    p.add_argument("--steps", type=int, required=True, help="training steps of each variant")
    p.add_argument("--common", default="",
                   help="train_dflash flags every variant gets (e.g. --smoke, --target)")
    p.add_argument("--deadline-s", type=float, default=None,
                   help="stop before this many seconds (a device call's limit)")
    p.add_argument("--eval-reserve-s", type=float, default=120.0,
                   help="seconds kept for each trained variant's evaluation (Qwen2.5-Coder's "
                        "three tasks took about 105 s on an H100)")
    p.add_argument("--eval-tasks", nargs="+", choices=EVAL_TASKS,
                   default=list(EVAL_TASKS))
    p.add_argument("--eval-num-prompts", type=int, default=100)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    return args


def main(argv: list[str] | None = None) -> bool:
    """Run the search as far as the deadline allows; True when it is complete."""
    args = parse_args(argv)
    try:
        search = Search(args)
        done = search.run()
    except SearchError as e:
        sys.exit(f"dflash_recipe_search: error: {e}")
    table = search.table()
    (search.root / TABLE).write_text(table)
    print(table)
    print("every variant measured" if done else
          "stopped before the deadline: run the same command again to continue")
    return done


if __name__ == "__main__":
    main()

"""Training text for a DFlash draft: prompts (GSM8K train questions in the harness's k-shot
format here; code tasks and chat requests from their own modules) continued by the target
itself (greedy; optionally sampled too, for more distinct text on the same prompts), so the
draft learns what the target will say. The samples file keeps them with each one's source
(jsonl, xz-compressed when its name ends in `.xz`), so a later run trains without generating."""

from __future__ import annotations

import json
import logging
import lzma
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Literal

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.few_shot_gsm8k import (
    STOP,
    build_prompt,
    few_shot_prefix,
    read_jsonl,
)

logger = logging.getLogger(__name__)

GENERATE_CHUNK = 1024  # prompts per Engine.generate call (a progress line each)
XZ_PRESET = 6  # xz's default: 43,608 Qwen continuations in 6.4 MB
# The kinds of training prompt: GSM8K train questions, code tasks from installed packages'
# functions (`code_tasks.py`), chat requests the target wrote (`chat_instructions.py`)
Source = Literal["gsm8k", "code", "chat"]
SOURCES: tuple[Source, ...] = ("gsm8k", "code", "chat")


class BadInputError(ValueError):
    """Input a run cannot use: a missing or corrupt samples file, training data holding an
    evaluation prompt, a checkpoint of another run. Its message is one line naming the file;
    `train_dflash` prints it and stops."""


@dataclass
class Sample:
    prompt_ids: list[int]
    output_ids: list[int]
    temperature: float = 0.0  # of the continuation (0: greedy)
    source: Source = "gsm8k"  # the kind of prompt

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


def gsm8k_questions(path: str | Path, shots_path: str | Path, num_shots: int,
                    num_prompts: int | None = None) -> list[str]:
    """The first `num_prompts` questions of `path` (None: all) that are not among the first
    `num_shots` questions of `shots_path` (the shots)."""
    shots = {s["question"] for s in read_jsonl(Path(shots_path))[:num_shots]}
    return [r["question"] for r in read_jsonl(Path(path)) if r["question"] not in shots
            ][:num_prompts]


def gsm8k_prompts(path: str | Path, shots_path: str | Path, num_shots: int,
                  num_prompts: int | None) -> list[str]:
    """k-shot prompts `...Question: q\\nAnswer:` (the harness's format: the first `num_shots`
    questions of `shots_path` as shots) for `gsm8k_questions(...)`."""
    prefix = few_shot_prefix(read_jsonl(Path(shots_path))[:num_shots])
    return [build_prompt(prefix, q)
            for q in gsm8k_questions(path, shots_path, num_shots, num_prompts)]


def generate_samples(engine: Engine, prompts: list[str], max_new_tokens: int,
                     temperature: float = 0.0, seed: int = 0, *, stop: list[str] = STOP,
                     source: Source = "gsm8k") -> list[Sample]:
    """The target's continuation of every prompt, stopped at `stop` (by default where the GSM8K
    harness stops): greedy, or sampled at `temperature` with prompt i's draws keyed by seed
    `seed + i` (reproducible)."""
    samples = []
    for start in range(0, len(prompts), GENERATE_CHUNK):
        ids = [engine.tokenizer.encode(p) for p in prompts[start:start + GENERATE_CHUNK]]
        params = [{"temperature": temperature, "max_new_tokens": max_new_tokens, "stop": stop,
                   "seed": seed + start + i if temperature > 0 else None}
                  for i in range(len(ids))]
        outs = engine.generate(input_ids=ids, sampling_params=params)
        samples += [Sample(i, o["output_ids"], temperature, source)
                    for i, o in zip(ids, outs, strict=True)]
        logger.info("generated %d/%d %s continuations (temperature %g)", len(samples),
                    len(prompts), source, temperature)
    return samples


def common_prefix_len(samples: list[Sample]) -> int:
    """Tokens every sample's prompt starts with (the k-shot prefix): their target states are
    the same in every sequence, so training keeps them once."""
    first = samples[0].prompt_ids
    n = min(len(s.prompt_ids) for s in samples)
    for s in samples[1:]:
        if s.prompt_ids[:n] != first[:n]:
            n = next(i for i, (a, b) in enumerate(zip(s.prompt_ids[:n], first[:n],
                                                       strict=True)) if a != b)
    return n


def _open(path: Path, mode: str):
    return lzma.open(path, mode, preset=XZ_PRESET if "w" in mode else None) \
        if path.suffix == ".xz" else open(path, mode)


def save_samples(samples: list[Sample], path: str | Path) -> None:
    """Write the samples as jsonl (xz when `path` ends in `.xz`), whole or not at all."""
    path = Path(path)
    tmp = path.with_name(f".tmp.{path.name}")  # same suffix: same compression
    with _open(tmp, "wt") as f:
        for s in samples:
            f.write(json.dumps({"prompt_ids": s.prompt_ids, "output_ids": s.output_ids,
                                "temperature": s.temperature, "source": s.source}) + "\n")
    tmp.replace(path)


def load_samples(path: str | Path) -> list[Sample]:
    """The samples of a file `save_samples` wrote; `BadInputError` naming the file when it is
    missing, not one (or cut short), or empty."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"{path}: no such samples file")
    try:
        with _open(path, "rt") as f:
            samples = [Sample(r["prompt_ids"], r["output_ids"], r.get("temperature", 0.0),
                              _source(r.get("source", "gsm8k")))
                       for r in map(json.loads, filter(str.strip, f))]
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError, ValueError, KeyError,
            TypeError) as e:
        raise BadInputError(f"{path}: not a samples file ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from e
    if not samples:
        raise BadInputError(f"{path}: holds no samples")
    return samples


def _source(name: str) -> Source:
    if name not in SOURCES:
        raise ValueError(f"source {name!r} is none of {', '.join(SOURCES)}")
    return name


def by_source(samples: list[Sample]) -> dict[Source, list[int]]:
    """Each source's sample indices, in file order (sources in order of first appearance)."""
    groups: dict[Source, list[int]] = {}
    for i, s in enumerate(samples):
        groups.setdefault(s.source, []).append(i)
    return groups


def prompt_groups(samples: list[Sample]) -> list[int]:
    """Each sample's prompt as a number, the same for samples of the same prompt (a greedy
    continuation and the sampled ones), numbered in order of first appearance."""
    seen: dict[tuple[int, ...], int] = {}
    return [seen.setdefault(tuple(s.prompt_ids), len(seen)) for s in samples]


def prompt_owners(samples: list[Sample]) -> list[int]:
    """Each sample's first sample of the same source and prompt, in file order (itself for
    the first): a prompt's target states are the same in all its continuations, so training
    keeps them once, in its owner's rows (`SequenceSet`)."""
    first: dict[tuple, int] = {}
    return [first.setdefault((s.source, tuple(s.prompt_ids)), i) for i, s in enumerate(samples)]


def keep_prompt_fraction(samples: list[Sample], fraction: float) -> list[Sample]:
    """The samples of `fraction` of the prompts, evenly spaced in order of first appearance
    (prompt g kept when floor((g + 1) f) > floor(g f)), each kept prompt with all its
    continuations, in file order: a file written source by source keeps each source's share,
    and no prompt is split between kept and left out."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    f = Fraction(fraction).limit_denominator(1 << 20)  # exact steps: no float rounding
    return [s for s, g in zip(samples, prompt_groups(samples), strict=True)
            if int((g + 1) * f) > int(g * f)]


def new_prompts_only(samples: list[Sample], more: list[Sample]) -> list[Sample]:
    """The samples of `more` whose prompt none of `samples` has, in file order: another
    file's continuations of the same prompts would repeat them (the greedy one word for
    word) and could continue a held-out prompt."""
    seen = {tuple(s.prompt_ids) for s in samples}
    return [s for s in more if tuple(s.prompt_ids) not in seen]


def describe_data(samples: list[Sample], num_shots: int) -> str:
    """What the samples are, for the card: each source's prompts, how they were continued
    (`N greedy, M sampled at T`) and the longest continuation, read from the samples
    themselves, not from the flags of the run that reads them (a samples file may come from
    another recipe)."""
    prompts = {"gsm8k": f"GSM8K train questions in the {num_shots}-shot `Question: ...\\nAnswer:` "
                        "format, stopped at \"Question\"",
               "code": "code tasks from documented functions of Python packages",
               "chat": "chat requests the target wrote from seed topics"}

    def described(index: list[int]) -> str:
        counts = Counter(samples[i].temperature for i in index)
        kinds = ", ".join(f"{n} greedy" if t == 0 else f"{n} sampled at temperature {t:g}"
                          for t, n in sorted(counts.items()))
        return f"{kinds} (the longest {max(len(samples[i].output_ids) for i in index)} tokens)"

    return "; ".join(f"{prompts[source]}: {described(index)}"
                     for source, index in by_source(samples).items())
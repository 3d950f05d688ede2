"""Training text for a DFlash draft: GSM8K train questions in the harness's k-shot format,
continued by the target itself (greedy; optionally sampled too, for more distinct text on the
same questions), so the draft learns what the target will say."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.few_shot_gsm8k import (
    STOP,
    build_prompt,
    few_shot_prefix,
    read_jsonl,
)

logger = logging.getLogger(__name__)

GENERATE_CHUNK = 1024  # prompts per Engine.generate call (a progress line each)


@dataclass
class Sample:
    prompt_ids: list[int]
    output_ids: list[int]
    temperature: float = 0.0  # of the continuation (0: greedy)

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


def gsm8k_prompts(path: str | Path, shots_path: str | Path, num_shots: int,
                  num_prompts: int | None) -> list[str]:
    """k-shot prompts `...Question: q\\nAnswer:` (the harness's format: the first `num_shots`
    questions of `shots_path` as shots) for the first `num_prompts` questions of `path` (None:
    all); the shots themselves are never among them."""
    shots = read_jsonl(Path(shots_path))[:num_shots]
    prefix = few_shot_prefix(shots)
    shot_questions = {s["question"] for s in shots}
    rows = [r for r in read_jsonl(Path(path)) if r["question"] not in shot_questions]
    return [build_prompt(prefix, r["question"]) for r in rows[:num_prompts]]


def generate_samples(engine: Engine, prompts: list[str], max_new_tokens: int,
                     temperature: float = 0.0, seed: int = 0) -> list[Sample]:
    """The target's continuation of every prompt, stopped where the harness stops: greedy, or
    sampled at `temperature` with prompt i's draws keyed by seed `seed + i` (reproducible)."""
    samples = []
    for start in range(0, len(prompts), GENERATE_CHUNK):
        ids = [engine.tokenizer.encode(p) for p in prompts[start:start + GENERATE_CHUNK]]
        params = [{"temperature": temperature, "max_new_tokens": max_new_tokens, "stop": STOP,
                   "seed": seed + start + i if temperature > 0 else None}
                  for i in range(len(ids))]
        outs = engine.generate(input_ids=ids, sampling_params=params)
        samples += [Sample(i, o["output_ids"], temperature)
                    for i, o in zip(ids, outs, strict=True)]
        logger.info("generated %d/%d continuations (temperature %g)", len(samples),
                    len(prompts), temperature)
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


def save_samples(samples: list[Sample], path: str | Path) -> None:
    with open(path, "w") as f:
        for s in samples:
            f.write(json.dumps({"prompt_ids": s.prompt_ids, "output_ids": s.output_ids,
                                "temperature": s.temperature}) + "\n")


def load_samples(path: str | Path) -> list[Sample]:
    return [Sample(r["prompt_ids"], r["output_ids"], r.get("temperature", 0.0))
            for r in read_jsonl(Path(path))]


def describe_continuations(samples: list[Sample]) -> str:
    """How the samples were continued, for the card: `N greedy, M sampled at T, ...`."""
    counts = Counter(s.temperature for s in samples)
    return ", ".join(f"{n} greedy" if t == 0 else f"{n} sampled at temperature {t:g}"
                     for t, n in sorted(counts.items()))

"""Held-out accept length of a draft on each kind of prompt (GSM8K, HumanEval, chat): greedy
DFlash (or DSpark) generation through the Engine's worker, and how many proposals each verify
step accepted (the draft's acceptance profile)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sglang_aux.srt.entrypoints.engine import Engine

EVAL_TASKS = ("gsm8k", "humaneval", "chat")  # the prompt kinds `--eval` measures accept on


@dataclass(frozen=True)
class EvalSet:
    """Prompts of one kind, where their answers stop, and how long they may run."""

    prompts: list[str]
    stop: list[str]
    max_new_tokens: int


def measure_accept_lengths(target: str, draft: str, sets: dict[str, EvalSet],
                           algorithm: str = "DFLASH", **engine_args) -> dict[str, dict]:
    """For each set, the mean accept length over its prompts (per request, as the GSM8K
    harness reports it) and per verify step (every step weighs the same), with one engine of
    `algorithm`'s worker (DFLASH or DSPARK; the verify mode is `engine_args`'
    `speculative_verify_mode`, by default `--speculative-verify-mode`'s:
    SGLANG_RAGGED_VERIFY_MODE when set, else static)."""
    engine = Engine(model_path=target, speculative_algorithm=algorithm,
                    speculative_draft_model_path=draft, **engine_args)
    device = engine.worker.model_runner.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    results = {}
    for name, eval_set in sets.items():
        params = {"temperature": 0, "max_new_tokens": eval_set.max_new_tokens,
                  "stop": eval_set.stop}
        start = time.perf_counter()
        outs = engine.generate(eval_set.prompts, params)
        seconds = time.perf_counter() - start
        metas = [o["meta_info"] for o in outs]
        steps = sum(m["spec_verify_ct"] for m in metas)
        width = max(len(m["spec_accept_histogram"]) for m in metas)
        histogram = [sum(m["spec_accept_histogram"][a] for m in metas
                         if a < len(m["spec_accept_histogram"])) for a in range(width)]
        accepted = sum(m["spec_accept_length"] * m["spec_verify_ct"] for m in metas)
        results[name] = {
            "num_prompts": len(eval_set.prompts),
            "accept_length": sum(m["spec_accept_length"] for m in metas) / len(metas),
            "accept_length_per_step": accepted / steps if steps else 0.0,
            "accept_histogram": histogram,  # verify steps that accepted a proposals
            "completion_tokens": sum(m["completion_tokens"] for m in metas),
            "max_new_tokens": eval_set.max_new_tokens,
            "seconds": seconds,
            "device": device_name,
        }
    engine.shutdown()
    return results

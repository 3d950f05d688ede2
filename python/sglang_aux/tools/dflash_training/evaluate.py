"""Held-out accept length of a draft: greedy DFlash (or DSpark) generation through the
Engine's worker."""

from __future__ import annotations

import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.few_shot_gsm8k import STOP


def measure_accept_length(target: str, draft: str, prompts: list[str], max_new_tokens: int,
                          algorithm: str = "DFLASH", **engine_args) -> dict:
    """Mean accept length over `prompts` (per request, as the GSM8K harness reports it) and
    per verify step (every step weighs the same), with `algorithm`'s worker (DFLASH or
    DSPARK; the verify mode is `engine_args`' `speculative_verify_mode`, by default
    `--speculative-verify-mode`'s: SGLANG_RAGGED_VERIFY_MODE when set, else static)."""
    engine = Engine(model_path=target, speculative_algorithm=algorithm,
                    speculative_draft_model_path=draft, **engine_args)
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "stop": STOP}
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    metas = [o["meta_info"] for o in outs]
    device = engine.worker.model_runner.device
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
    steps = sum(m["spec_verify_ct"] for m in metas)
    accepted = sum(m["spec_accept_length"] * m["spec_verify_ct"] for m in metas)
    engine.shutdown()
    return {
        "num_prompts": len(prompts),
        "accept_length": sum(m["spec_accept_length"] for m in metas) / len(metas),
        "accept_length_per_step": accepted / steps if steps else 0.0,
        "completion_tokens": sum(m["completion_tokens"] for m in metas),
        "seconds": seconds,
        "device": device_name,
    }

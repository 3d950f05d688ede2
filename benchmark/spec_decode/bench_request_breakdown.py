"""Where a request's wall time goes: prefill, decode steps, scheduler, engine, for real prompts.

    python benchmark/spec_decode/bench_request_breakdown.py --num-prompts 12 --out breakdown.json

GSM8K 5-shot test prompts through `Engine.generate` one at a time (bs 1, greedy, natural stop at
"Question"), target-only and DFlash. Every `worker.prefill` and `worker.decode` launch is timed
on the host (input preparation and launches; the step's tokens are read later); `scheduler` is
the rest of `Scheduler.step` (waiting for a step's readback, appending tokens, stop checks);
`engine` is the rest of `generate` (request validation, output decoding). With `--cprofile N`,
the DFlash run's N costliest functions. The prefix cache is on (the prompts share their 5-shot
prefix: `cached_tokens` counts the prompt tokens not prefilled) unless `--disable-radix-cache`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import resolve_model_path
from sglang_aux.test.gsm8k_data import data_paths
from sglang_aux.tools.dflash_training.data import gsm8k_prompts

STOP = "Question"


def timed(obj, name: str, sink: list[float]) -> None:
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sink.append(time.perf_counter() - t0)
        return out

    setattr(obj, name, wrapper)


def measure(engine: Engine, prompts: list[str], profile: int) -> dict:
    params = {"temperature": 0, "max_new_tokens": 512, "stop": [STOP]}
    engine.generate(prompts[0], params)  # warm-up
    prefill, decode, steps = [], [], []
    timed(engine.worker, "prefill", prefill)
    timed(engine.worker, "decode", decode)
    timed(engine.scheduler, "step", steps)
    prof = cProfile.Profile() if profile else None
    tokens, cached, start = 0, 0, time.perf_counter()
    if prof:
        prof.enable()
    for text in prompts:
        meta = engine.generate(text, params)["meta_info"]
        tokens += meta["completion_tokens"]
        cached += meta["cached_tokens"]
    if prof:
        prof.disable()
    wall = time.perf_counter() - start
    row = {"requests": len(prompts), "tokens": tokens, "cached_tokens": cached,
           "wall_s": wall, "tok_per_s": tokens / wall,
           "prefill_s": sum(prefill), "decode_s": sum(decode), "decode_steps": len(decode),
           "decode_ms_per_step": 1e3 * sum(decode) / max(len(decode), 1),
           "prefill_ms_per_request": 1e3 * sum(prefill) / max(len(prefill), 1),
           "scheduler_s": sum(steps) - sum(prefill) - sum(decode),
           "engine_s": wall - sum(steps)}
    if prof:
        row["cprofile"] = cprofile_text(prof, profile)
    return row


def cprofile_text(prof: cProfile.Profile, n: int) -> str:
    """The `n` functions with the most time of their own."""
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(n)
    return s.getvalue()


def report_rows(rows: list[dict], out: str, line: Callable[[dict], str]) -> None:
    """Print `line(row)` and the row's cProfile text (if any) per row, then write the rows as
    JSON to `out`."""
    for r in rows:
        print(line(r))
        if "cprofile" in r:
            print(r["cprofile"])
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default="smollm2-135m-instruct")
    p.add_argument("--draft", default="smollm2-135m-instruct-dflash-b8")
    p.add_argument("--data-path", type=Path, default=None)
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cprofile", type=int, default=0)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--out", default="benchmark/spec_decode/request_breakdown.json")
    a = p.parse_args()
    prompts = gsm8k_prompts(*data_paths(a.data_path), 5, a.num_prompts)
    folder = resolve_model_path(a.model_path)
    rows = []
    for name, extra in {"target": {}, "dflash": {"speculative_algorithm": "DFLASH",
                                                 "speculative_draft_model_path": a.draft}}.items():
        engine = Engine(model_path=folder, dtype=a.dtype, device=a.device, max_running_requests=1,
                        context_length=2048, disable_radix_cache=a.disable_radix_cache,
                        **extra)
        profile = a.cprofile if name == "dflash" else 0
        rows.append({"engine": name, **measure(engine, prompts, profile)})
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    report_rows(rows, a.out, lambda r: str({k: (round(v, 4) if isinstance(v, float) else v)
                                            for k, v in r.items() if k != "cprofile"}))


if __name__ == "__main__":
    main()

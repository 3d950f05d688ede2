"""The GSM8K harness's traffic without HTTP: requests keep `--concurrency` in flight through the
Engine's scheduler in this process, a new one admitted the step after one finishes.

    python benchmark/spec_decode/bench_continuous_arrivals.py --num-prompts 1319 \
        --concurrency 32 --cprofile 25 --out continuous.json

GSM8K 5-shot test prompts (tokenized up front, so no tokenizer work is timed), greedy, stop at
"Question", target-only and DFlash. Against the HTTP harness's figure this separates the
runtime (scheduler, prefills, steps) from the front end (HTTP, tokenization, detokenization in
the server's event loop thread). Reports tok/s, the scheduler's stats (prefill and decode
steps and their seconds) and, with `--cprofile N`, each engine's N costliest functions. With
`--trace`, CUDA events around each launch give every step's GPU span and the GPU's idle time
between steps, by kind of step (a span includes idle time inside an eager launch).
"""

from __future__ import annotations

import argparse
import cProfile
import time
from collections import deque
from pathlib import Path

import torch
from bench_request_breakdown import cprofile_text, report_rows

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import resolve_model_path
from sglang_aux.test.gsm8k_data import data_paths
from sglang_aux.tools.dflash_training.data import gsm8k_prompts

PARAMS = {"temperature": 0, "max_new_tokens": 512, "stop": ["Question", "</s>", "<|im_end|>"]}


class StepTrace:
    """Wraps the worker's `prefill`, `decode` and `mixed`: host launch time, and CUDA events
    recorded before and after each launch on the current stream."""

    def __init__(self, worker) -> None:
        self.records: list[tuple[str, int, float, torch.cuda.Event, torch.cuda.Event]] = []
        self._originals = {k: getattr(worker, k) for k in ("prefill", "decode", "mixed")}
        for kind, fn in self._originals.items():
            setattr(worker, kind, self._wrap(kind, fn))
        self.worker = worker

    def _wrap(self, kind, fn):
        def launch(*reqs):  # a mixed step: the running batch, then the arrivals
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            t = time.perf_counter()
            out = fn(*reqs)
            host = time.perf_counter() - t
            end.record()
            self.records.append((kind, sum(len(r) for r in reqs), host, start, end))
            return out
        return launch

    def summary(self) -> dict:
        torch.cuda.synchronize()
        for kind, fn in self._originals.items():
            setattr(self.worker, kind, fn)
        rows: dict[str, dict] = {}
        sizes: dict[int, dict] = {}
        idle, prev_end = 0.0, None
        for kind, n, host, start, end in self.records:
            r = rows.setdefault(kind, {"steps": 0, "requests": 0, "host_ms": 0.0, "gpu_ms": 0.0,
                                       "idle_before_ms": 0.0})
            r["steps"] += 1
            r["requests"] += n
            r["host_ms"] += host * 1e3
            r["gpu_ms"] += start.elapsed_time(end)
            if prev_end is not None:
                gap = max(prev_end.elapsed_time(start), 0.0)
                r["idle_before_ms"] += gap
                idle += gap
            prev_end = end
            if kind == "prefill":  # by requests per prefill: a graph's width, or eager
                q = sizes.setdefault(n, {"steps": 0, "host_ms": 0.0, "gpu_ms": 0.0})
                q["steps"] += 1
                q["host_ms"] += host * 1e3
                q["gpu_ms"] += start.elapsed_time(end)
        for r in (*rows.values(), *sizes.values()):
            for k in ("host_ms", "gpu_ms", "idle_before_ms"):
                if k in r:
                    r[f"{k}_per_step"] = round(r[k] / r["steps"], 4)
                    r[k] = round(r[k], 1)
        return {"by_kind": rows, "prefill_by_requests": dict(sorted(sizes.items())),
                "gpu_idle_ms": round(idle, 1)}


def run(engine: Engine, prompts: list[list[int]], concurrency: int, profile: int,
        trace: bool = False) -> dict:
    sched = engine.scheduler
    pending = deque(prompts)
    finished = []

    def submit() -> None:
        req = engine.make_request(input_ids=pending.popleft(), sampling_params=dict(PARAMS))
        sched.add_request(req)

    def on_update(req) -> None:
        if req.finished:
            finished.append(req)
            if pending:
                submit()

    for ids in prompts[:concurrency]:  # warm-up: the prefix enters the cache, kernels load
        engine.generate(input_ids=ids, sampling_params=dict(PARAMS))
    stats0 = dict(sched.stats)
    sched.on_update = on_update
    prof = cProfile.Profile() if profile else None
    tracer = StepTrace(engine.worker) if trace else None
    start = time.perf_counter()
    if prof:
        prof.enable()
    for _ in range(min(concurrency, len(pending))):
        submit()
    while sched.has_work():
        sched.step()
    if prof:
        prof.disable()
    wall = time.perf_counter() - start
    sched.on_update = None
    tokens = sum(len(r.output_ids) for r in finished)
    verify = sum(r.spec_verify_ct for r in finished)
    stats = {k: round(v - stats0[k], 4) for k, v in sched.stats.items()}
    row = {"requests": len(finished), "tokens": tokens, "wall_s": round(wall, 3),
           "tok_per_s": round(tokens / wall, 1),
           "accept_length": round(tokens / verify, 3) if verify else 0.0,
           "cached_tokens": sum(r.cached_tokens for r in finished), "stats": stats}
    if tracer:
        row["trace"] = tracer.summary()
    if prof:
        row["cprofile"] = cprofile_text(prof, profile)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default="smollm2-135m-instruct")
    p.add_argument("--draft", default="smollm2-135m-instruct-dflash-b8")
    p.add_argument("--data-path", type=Path, default=None)
    p.add_argument("--num-prompts", type=int, default=1319)
    p.add_argument("--num-shots", type=int, default=5)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cprofile", type=int, default=0)
    p.add_argument("--trace", action="store_true", help="GPU span and idle time per step")
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--engines", nargs="+", default=["target", "dflash"],
                   help="of: target dflash, then _delay (with the prefill delayer), _mixed "
                        "(--enable-mixed-chunk, on CUDA the default since 2026-12-05) or _apart "
                        "(--disable-mixed-chunk: arrivals prefilled in steps of their own)")
    p.add_argument("--out", default="benchmark/spec_decode/continuous_arrivals.json")
    a = p.parse_args()
    if a.trace and a.device != "cuda":
        p.error("--trace times CUDA events: it needs --device cuda")
    texts = gsm8k_prompts(*data_paths(a.data_path), a.num_shots,
                          a.num_prompts)
    folder = resolve_model_path(a.model_path)
    rows = []
    dflash = {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": a.draft}
    for name in a.engines:
        extra = dict(dflash) if name.startswith("dflash") else {}
        if name.endswith("_delay"):
            extra["enable_prefill_delayer"] = True
        if name.endswith(("_mixed", "_apart")):
            extra["enable_mixed_chunk"] = name.endswith("_mixed")
        engine = Engine(model_path=folder, dtype=a.dtype, device=a.device,
                        max_running_requests=64, context_length=2048,
                        disable_radix_cache=a.disable_radix_cache, **extra)
        prompts = [engine.tokenizer.encode(t) for t in texts]
        rows.append({"engine": name, "concurrency": a.concurrency,
                     **run(engine, prompts, a.concurrency, a.cprofile, a.trace)})
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = rows[0]["tok_per_s"]

    def line(r: dict) -> str:
        head = {k: v for k, v in r.items() if k not in ("cprofile", "trace")}
        trace = f"\n  trace: {r['trace']}" if "trace" in r else ""
        return f"{head} {r['tok_per_s'] / base:.2f}x{trace}"

    report_rows(rows, a.out, line)


if __name__ == "__main__":
    main()

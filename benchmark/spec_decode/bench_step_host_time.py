"""Host time per decode step, with the overlap scheduler on and off: step wall time against
the time its graphs replay on the GPU.

    python benchmark/spec_decode/bench_step_host_time.py --bs 1 32 --out step_host_time.json
    python benchmark/spec_decode/bench_step_host_time.py --model-path smollm2-135m-instruct \
        --draft smollm2-135m-instruct-dflash-b8 --load-format auto

For target-only and DFlash engines (graphs on, greedy, EOS ignored), each with
`--disable-overlap-schedule` and without, every scheduler step that launches a full-batch
decode is timed on the host, the worker's launch inside it (`launch ms`: input preparation and
the launches), and every graph replay with CUDA events (`replay ms`, the GPU time of the
step's graphs). `busy` is replay over step wall time and `host ms` the rest: without overlap,
launches, the readback wait and the host's bookkeeping of the step's tokens (stop checks,
appending, finishing), all while the GPU idles; with overlap, what of it the next step's GPU
work did not hide. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine

WARMUP_STEPS = 5


def instrument(engine: Engine) -> tuple[list, list]:
    """Wrap the scheduler step, the worker's decode launch and every graph replay; returns
    (steps, replays) lists they fill. A step row: (wall s, launch s, first replay, end replay,
    batch size), for steps that launched a decode."""
    steps, replays, launches = [], [], []
    worker = engine.worker
    draft = getattr(worker, "draft_runner", None)  # DFlash only
    for runner in [worker.model_runner, *([draft] if draft is not None else [])]:
        backend = runner.step_graphs.backend
        replay = backend.replay

        def timed(handle, replay=replay):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            replay(handle)
            end.record()
            replays.append((start, end))

        backend.replay = timed
    decode, step = worker.decode, engine.scheduler.step

    def timed_decode(reqs):
        t0 = time.perf_counter()
        out = decode(reqs)
        launches.append((time.perf_counter() - t0, len(reqs)))
        return out

    def timed_step():
        first, n = len(replays), len(launches)
        t0 = time.perf_counter()
        step()
        if len(launches) > n:
            steps.append((time.perf_counter() - t0, launches[-1][0], first, len(replays),
                          launches[-1][1]))

    worker.decode = timed_decode
    engine.scheduler.step = timed_step
    return steps, replays


def measure(engine: Engine, bs: int, prompt_len: int, max_new: int) -> dict:
    g = torch.Generator().manual_seed(bs)
    vocab = engine.model_config.hf_config.vocab_size
    prompts = torch.randint(0, vocab, (bs, prompt_len), generator=g).tolist()
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)  # warm-up
    steps, replays = instrument(engine)
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    full = [s for s in steps[WARMUP_STEPS:] if s[4] == bs]
    wall = [s[0] * 1e3 for s in full]
    launch = [s[1] * 1e3 for s in full]
    gpu = [sum(replays[i][0].elapsed_time(replays[i][1]) for i in range(a, b))
           for _, _, a, b, _ in full]
    tokens = sum(len(o["output_ids"]) for o in outs)
    step_ms, replay_ms = statistics.median(wall), statistics.median(gpu)
    return {"bs": bs, "steps": len(full), "step_ms": step_ms,
            "launch_ms": statistics.median(launch), "replay_ms": replay_ms,
            "busy": replay_ms / step_ms, "host_ms": max(step_ms - replay_ms, 0.0),
            "tok_per_s": tokens / seconds,
            "accept_length": sum(o["meta_info"]["spec_accept_length"] for o in outs) / bs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default="bench-llama")
    p.add_argument("--draft", default=None, help="DFlash draft (default: <model>-dflash)")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--out", default="benchmark/spec_decode/step_host_time.json")
    a = p.parse_args()
    configs = {"target": {}, "dflash": {"speculative_algorithm": "DFLASH",
                                        "speculative_draft_model_path":
                                        a.draft or f"{a.model_path}-dflash"}}
    rows = []
    for name, extra in configs.items():
        for overlap in (False, True):
            engine = Engine(model_path=a.model_path, load_format=a.load_format, dtype=a.dtype,
                            device="cuda", max_running_requests=max(a.bs),
                            context_length=a.prompt_len + a.max_new_tokens + 64,
                            disable_overlap_schedule=not overlap, **extra)
            for bs in a.bs:
                rows.append({"config": name, "overlap": overlap,
                             **measure(engine, bs, a.prompt_len, a.max_new_tokens)})
            del engine
    print(f"{'config':>7} {'overlap':>7} {'bs':>4} {'step ms':>8} {'launch ms':>9} "
          f"{'replay ms':>10} {'busy':>6} {'host ms':>8} {'tok/s':>9} {'accept':>7}")
    for r in rows:
        print(f"{r['config']:>7} {str(r['overlap']):>7} {r['bs']:>4} {r['step_ms']:>8.3f} "
              f"{r['launch_ms']:>9.3f} {r['replay_ms']:>10.3f} {r['busy']:>6.2f} "
              f"{r['host_ms']:>8.3f} {r['tok_per_s']:>9.1f} {r['accept_length']:>7.2f}")
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""What the GSM8K harness's prefills cost on the GPU: a cached prefix plus a few new tokens.

    python benchmark/spec_decode/bench_cached_prefill.py --out cached_prefill.json

Random-weight SmolLM2-shaped target (and its DFlash draft), bf16. A `--prefix`-token prompt is
generated once, so the prefix cache holds it; then `--widths` requests of that prefix plus
`--new` fresh tokens each are admitted and prefilled together, as the scheduler does for
arrivals (one prefill graph replays; its epilogue commits the draft context under DFlash).
Per width: GPU ms of the target runner's forward (median of CUDA-event timings over `--iters`),
against the replay of the bs-32 decode (or verify) graph, and with `--kernels` the costliest
kernels of one width-1 prefill (torch profiler; graph-replayed kernels included). "seq" and
"side" time the prefill and that step graph back to back, and with the prefill on a second
stream beside the step (what overlapping arrivals' prefills with the running batch's step
would give: timing only, since both graphs share one memory pool and must not really overlap).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import extend_inputs


def gpu_ms(fn, iters: int) -> float:
    """Median ms of `fn` over `iters` calls: CUDA events, or the host clock without CUDA (the
    benches' CPU smoke runs)."""
    for _ in range(5):
        fn()
    if not torch.cuda.is_available():
        return statistics.median(_host_ms(fn) for _ in range(iters))
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _host_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def kernel_table(fn, top: int) -> list[dict]:
    if not torch.cuda.is_available():
        return []
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:90], "calls": e.count, "total_us": round(e.device_time_total, 1)}
            for e in prof.key_averages()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]


def print_kernel_table(rows: list[dict], indent: str) -> None:
    for k in rows:
        print(f"{indent}{k['total_us']:>9.1f} us {k['calls']:>4} x {k['kernel']}")


def measure(engine: Engine, name: str, a: argparse.Namespace) -> list[dict]:
    sched, runner = engine.scheduler, engine.worker.model_runner
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, a.vocab, (a.prefix,), generator=g).tolist()
    engine.generate(input_ids=prefix + [7], sampling_params={"max_new_tokens": 1})
    rows = []
    for width in a.widths:
        reqs = [engine.make_request(
            input_ids=prefix + torch.randint(3, a.vocab, (a.new,), generator=g).tolist(),
            sampling_params={"max_new_tokens": 8}) for _ in range(width)]
        for r in reqs:
            if not sched.kv.take(r):
                raise RuntimeError("the KV pool is too small for the benchmark")
        fb = runner.prepare(extend_inputs(runner, reqs))
        if fb.extend_prefix_lens_cpu != [a.prefix] * width:
            raise RuntimeError(f"prefix not cached: {fb.extend_prefix_lens_cpu}")
        graph = fb.prepared_graph is not None
        row = {"engine": name, "width": width, "new_tokens": fb.num_tokens, "graph": graph,
               "prefill_ms": round(gpu_ms(lambda fb=fb: runner.forward(fb), a.iters), 4)}
        row["fb"] = fb
        if a.kernels and width == 1:
            row["kernels"] = kernel_table(lambda fb=fb: runner.forward(fb), a.kernels)
        rows.append(row)
    gr = runner.step_graphs
    bs = gr.layouts[-1].step_bs
    step = round(gpu_ms(lambda: gr.backend.replay(gr.graphs[-1]), a.iters), 4)
    side = torch.cuda.Stream()

    def beside(fb) -> None:
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        with torch.cuda.stream(side):
            runner.forward(fb)
        gr.backend.replay(gr.graphs[-1])
        main.wait_stream(side)

    for r in rows:
        fb = r.pop("fb")
        r.update({"step_graph": gr.mode.name, "step_bs": bs, "step_ms": step,
                  "seq_ms": round(gpu_ms(lambda fb=fb: (runner.forward(fb),
                                                        gr.backend.replay(gr.graphs[-1])),
                                         a.iters), 4),
                  "side_ms": round(gpu_ms(lambda fb=fb: beside(fb), a.iters), 4)})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefix", type=int, default=700)
    p.add_argument("--new", type=int, default=80)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--kernels", type=int, default=15)
    p.add_argument("--vocab", type=int, default=40000, help="prompt ids are drawn below it")
    p.add_argument("--out", default="benchmark/spec_decode/cached_prefill.json")
    a = p.parse_args()
    rows = []
    for name, extra in (("target", {}), ("dflash", {
            "speculative_algorithm": "DFLASH",
            "speculative_draft_model_path": "smollm2-shaped-dflash"})):
        engine = Engine(model_path="smollm2-shaped", load_format="dummy", dtype="bfloat16",
                        device="cuda", max_running_requests=32, context_length=2048,
                        cuda_graph_bs_decode=[1, 32], **extra)
        rows += measure(engine, name, a)
        del engine
        torch.cuda.empty_cache()
    print(f"{'engine':>7} {'width':>5} {'tokens':>6} {'graph':>5} {'prefill ms':>10} "
          f"{'step graph':>14} {'step ms':>8} {'seq ms':>7} {'side ms':>7}")
    for r in rows:
        print(f"{r['engine']:>7} {r['width']:>5} {r['new_tokens']:>6} {str(r['graph']):>5} "
              f"{r['prefill_ms']:>10.3f} {r['step_graph']:>14} {r['step_ms']:>8.3f} "
              f"{r['seq_ms']:>7.3f} {r['side_ms']:>7.3f}")
    for r in rows:
        print_kernel_table(r.get("kernels", []), f"  {r['engine']} ")
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""GPU time of a mixed step's graph against the step graph and the prefill it replaces.

    python benchmark/spec_decode/bench_mixed_step.py --out mixed_step.json
    python benchmark/spec_decode/bench_mixed_step.py --device cpu --target tiny-llama \
        --draft tiny-llama-dflash --bs 4 --prefix 40 --new 8 --vocab 200 --kernels 0  # smoke

Random-weight SmolLM2-shaped target (and draft; `--target`, `--draft`: other presets, e.g.
`qwen2.5-1.5b-shaped` and its `-dflash`, with `--verify-width` the static schedule's width),
bf16, `--enable-mixed-chunk`: `--bs` running requests and `width` arrivals, each a cached
`--prefix`-token prompt plus `--new` tokens (the harness's traffic). CUDA-event ms (median of
`--iters`) of: the step graph alone (DECODE or TARGET_VERIFY at `--bs`), the arrivals' prefill
graph, the two back to back, and the mixed graph that does both in one forward (replay only,
and `ModelRunner.prepare` + the replay through `ModelRunner.forward`: a launch's one input copy
added); with a kernel table of the mixed replay.
"""

from __future__ import annotations

import argparse
import json

import torch
from bench_cached_prefill import gpu_ms, kernel_table, print_kernel_table  # script folder

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.schedule_batch import extend_inputs, mixed_inputs
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardLayout


def measure(engine: Engine, name: str, a: argparse.Namespace) -> list[dict]:
    sched, worker, runner = engine.scheduler, engine.worker, engine.worker.model_runner
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, a.vocab, (a.prefix,), generator=g).tolist()
    engine.generate(input_ids=prefix + [7], sampling_params={"max_new_tokens": 1})

    def admitted(n: int):
        reqs = [engine.make_request(
            input_ids=prefix + torch.randint(3, a.vocab, (a.new,), generator=g).tolist(),
            sampling_params={"max_new_tokens": 64}) for _ in range(n)]
        for r in reqs:
            if not sched.kv.take(r):
                raise RuntimeError("the KV pool is too small for the benchmark")
            worker.admit(r)
        return reqs

    # the running batch as a server steps it, so the step graph's static inputs hold a real
    # batch (a bare replay of a freshly captured graph may index past its tables)
    params = {"max_new_tokens": 512, "ignore_eos": True, "temperature": 0.0}
    for _ in range(a.bs):
        sched.add_request(engine.make_request(
            input_ids=prefix + torch.randint(3, a.vocab, (a.new,), generator=g).tolist(),
            sampling_params=params))
    while sched.waiting or len(sched.running) < a.bs:
        sched.step()
    for _ in range(3):
        sched.step()
    running = list(sched.running)
    draft_len = getattr(worker, "draft_len", None)
    width = 1 if draft_len is None else draft_len.width(a.bs)  # the step's verify width
    gr, mg = runner.step_graphs, runner.graph_runners.get(ForwardMode.MIXED)
    step_i = next(i for i, x in enumerate(gr.layouts)
                  if x.step_bs == a.bs and x.tokens_per_req == width)
    step = lambda: gr.backend.replay(gr.graphs[step_i])  # noqa: E731
    step_ms = gpu_ms(step, a.iters)
    rows = []
    for n in a.widths:
        arrivals = admitted(n)
        kv = [r.kv_len for r in arrivals]
        prefill_fb = runner.prepare(extend_inputs(runner, arrivals))
        for r, k in zip(arrivals, kv, strict=True):
            r.kv_len = k
        inputs = mixed_inputs(runner, running, arrivals, width)  # what a mixed step sends
        key = mg.fit(ForwardLayout.of(inputs, width))
        if key is None:
            raise RuntimeError("no mixed graph fits the benchmark's batch")
        launch = lambda inputs=inputs: runner.forward(runner.prepare(inputs))  # noqa: E731
        launch()  # the static inputs hold the batch: a bare replay reruns it
        replay = lambda key=key: mg.backend.replay(mg.graphs[key])  # noqa: E731
        layout = mg.layouts[key]
        row = {"engine": name, "step_graph": gr.mode.name, "bs": a.bs, "width": width,
               "arrivals": n,
               "arrival_tokens": prefill_fb.num_tokens,
               "mixed_graph": [layout.step_bs, layout.tokens_per_req, layout.arrival_tokens],
               "step_ms": round(step_ms, 4),
               "prefill_ms": round(gpu_ms(lambda fb=prefill_fb: runner.forward(fb), a.iters), 4),
               "step_then_prefill_ms": round(gpu_ms(
                   lambda fb=prefill_fb: (step(), runner.forward(fb)), a.iters), 4),
               "mixed_replay_ms": round(gpu_ms(replay, a.iters), 4),
               "mixed_forward_ms": round(gpu_ms(launch, a.iters), 4)}
        if a.kernels:
            row["kernels"] = kernel_table(replay, a.kernels)
            row["step_kernels"] = kernel_table(step, a.kernels)
        rows.append(row)
        for r in arrivals:
            sched.kv.release(r)
    for r in running:
        sched.abort(r)
    sched.step()
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, default=32)
    p.add_argument("--prefix", type=int, default=700)
    p.add_argument("--new", type=int, default=80)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--kernels", type=int, default=16)
    p.add_argument("--vocab", type=int, default=40000, help="prompt ids are drawn below it")
    p.add_argument("--target", default="smollm2-shaped", help="a preset (random weights)")
    p.add_argument("--draft", default="smollm2-shaped-dflash", help="the target's DFlash preset")
    p.add_argument("--verify-width", type=int, default=None,
                   help="DFlash verifies this many tokens a request at every batch size (a "
                        "static server's schedule at --bs, e.g. 8 at 32 for the Qwen2.5-1.5B "
                        "shapes; default: the draft's block)")
    p.add_argument("--mixed-tokens", type=int, nargs="+", default=None,
                   help="the mixed graphs' arrival token counts (--cuda-graph-tokens-mixed; "
                        "default: the server's, 2x apart)")
    p.add_argument("--device", default="cuda", help="cpu: a smoke run (host-clock ms)")
    p.add_argument("--out", default="benchmark/spec_decode/mixed_step.json")
    a = p.parse_args(argv)
    rows = []
    dflash = {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": a.draft}
    if a.verify_width is not None:  # its narrower step and mixed graphs captured beside
        dflash |= {"speculative_verify_mode": "static",
                   "speculative_draft_len_schedule": f"1:{a.verify_width}"}
    for name, extra in (("target", {}), ("dflash", dflash)):
        engine = Engine(model_path=a.target, load_format="dummy", device=a.device,
                        dtype="bfloat16" if a.device == "cuda" else "float32",
                        max_running_requests=a.bs + 4, context_length=2048,
                        cuda_graph_bs_decode=[1, a.bs], enable_mixed_chunk=True,
                        cuda_graph_tokens_mixed=a.mixed_tokens,
                        disable_overlap_schedule=True, **extra)
        rows += measure(engine, name, a)
        del engine
        torch.cuda.empty_cache()
    keys = ("step_ms", "prefill_ms", "step_then_prefill_ms", "mixed_replay_ms",
            "mixed_forward_ms")
    print(f"{'engine':>7} {'arr':>3} {'tokens':>6} " + " ".join(f"{k:>20}" for k in keys))
    for r in rows:
        print(f"{r['engine']:>7} {r['arrivals']:>3} {r['arrival_tokens']:>6} "
              + " ".join(f"{r[k]:>20.3f}" for k in keys))
    for r in rows:
        if r["arrivals"] == a.widths[0]:
            print_kernel_table(r.get("kernels", []), f"  {r['engine']} mixed ")
            print_kernel_table(r.get("step_kernels", []), f"  {r['engine']} step  ")
    report = {"args": vars(a), "rows": rows}
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()

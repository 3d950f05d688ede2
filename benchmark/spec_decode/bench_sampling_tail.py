"""What in-graph DFlash sampling costs: tail replay time and capture memory per graph.

    python benchmark/spec_decode/bench_sampling_tail.py --preset smollm2-shaped \
        --bs 1 8 32 --out sampling_tail.json

A DFLASH engine over `<preset>` and `<preset>-dflash` (random weights, `--load-format dummy`)
captures its DRAFT_BLOCK and TARGET_VERIFY graphs at `--bs`; each size also gets a sampling
tail graph (draws + distributions, rejection sampling), replayed after the main graph only for
batches with a sampled request. Per graph and size: main replay ms and tail replay ms (median
of CUDA-event timings over `--iters`), so greedy steps cost the first column and sampled steps
both. Memory: the free-memory drop of capturing all main graphs and then all tails (graph
pool), and the worker's draft-distribution buffer `[rows, B-1, vocab]` fp32. Check first: a
mixed greedy/sampled generate replays the tails and returns in-vocabulary tokens.

Old sorted path vs new, side by side in one run: the tails are captured again with the
sorted `sampling_probs` the sort-free one replaced (`sorted_sampling_probs`; the new tails stay
alive meanwhile, so that capture's free-memory drop is its own) and replayed at each size.
Then `sampling_probs` alone on the draft tail's `bs * (B - 1)` and the verify tail's `bs * B`
rows (bf16 logits, T 0.8, top-p 0.9, every fourth row also top-k 50), each path in its own
graph and memory pool: sorted, the Triton kernel (the engine's path on CUDA) and the torch
twin (`SGLANG_AUX_FUSED_KERNELS=off`).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from bench_graph_replay import replay_ms  # this script's folder is on sys.path

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.triton_ops.dispatch import ENV_VAR
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.sampling.sampler import SamplingTensors, sampling_probs
from sglang_aux.srt.speculative import dflash_worker
from sglang_aux.test.top_k_top_p_reference import sorted_sampling_probs

PATHS = {"sorted": None, "kernel": "auto", "twin": "off"}  # the fused-kernels setting of each


def _check(engine: Engine, vocab: int) -> None:
    params = [{"temperature": 0 if i % 2 else 0.8, "top_p": 0.9, "max_new_tokens": 16,
               "ignore_eos": True, "seed": i} for i in range(4)]
    outs = engine.generate(input_ids=[[1, 2, 3, 4 + i] for i in range(4)],
                           sampling_params=params)
    assert all(len(o["output_ids"]) == 16 and max(o["output_ids"]) < vocab for o in outs)


def _probs_alone(backend, rows: int, vocab: int, iters: int) -> dict[str, float]:
    """Replay ms and graph-pool bytes of `sampling_probs` on `rows` rows, per path."""
    g = torch.Generator("cuda").manual_seed(rows)
    logits = (torch.randn(rows, vocab, generator=g, device="cuda") * 3).to(torch.bfloat16)
    every = torch.arange(rows, device="cuda")
    params = SamplingTensors(temperature=torch.full((rows,), 0.8, device="cuda"),
                             top_k=torch.where(every % 4 == 0, 50, vocab),
                             top_p=torch.full((rows,), 0.9, device="cuda"), seed=every,
                             is_greedy=torch.zeros(rows, dtype=torch.bool, device="cuda"))
    out = torch.empty(rows, vocab, device="cuda")
    result, mode = {"rows": rows}, os.environ.get(ENV_VAR)
    for path, setting in PATHS.items():
        probs = sorted_sampling_probs if setting is None else sampling_probs
        os.environ[ENV_VAR] = setting or "auto"
        for _ in range(2):
            probs(logits, params, out=out)
        probe = MemoryProbe("cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # its own pool: this capture's memory alone
            probs(logits, params, out=out)
        result[f"{path}_pool_bytes"] = probe.delta()["reserved_delta_bytes"]
        result[f"{path}_ms"] = replay_ms(backend, graph, iters, True)
        result[f"{path}_kept_mean"] = float((out > 0).sum(-1).float().mean())
    if mode is None:
        del os.environ[ENV_VAR]
    else:
        os.environ[ENV_VAR] = mode
    return result


def _sorted_tails(worker, iters: int, cuda: bool) -> dict[str, object]:
    """Tail replay ms per (graph, bs) and the capture's free-memory drop, with the tails
    captured again around the sorted `sampling_probs`; the engine's tails are put back."""
    result = {}
    dflash_worker.sampling_probs = sorted_sampling_probs
    try:
        for runner in (worker.draft_runner, worker.target_runner):
            gr = runner.step_graphs
            new_tails = list(gr.sampling_graphs)  # alive: the sorted capture's memory is its own
            stats = gr._capture_sampling_tails(gr.parts.epilogue.sampling_fn)
            result[gr.mode.name] = {
                "tail_free_memory_drop_bytes": stats["free_memory_drop_bytes"],
                "tail_ms": {x.step_bs: replay_ms(gr.backend, tail, iters, cuda)
                            for x, tail in zip(gr.layouts, gr.sampling_graphs, strict=True)}}
            gr.sampling_graphs = new_tails
    finally:
        dflash_worker.sampling_probs = sampling_probs
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="smollm2-shaped")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="benchmark/spec_decode/sampling_tail.json")
    args = p.parse_args()
    engine = Engine(model_path=args.preset, load_format="dummy", device=args.device,
                    speculative_algorithm="DFLASH",
                    speculative_draft_model_path=f"{args.preset}-dflash",
                    max_running_requests=max(args.bs), cuda_graph_bs_decode=sorted(args.bs))
    worker, cuda = engine.worker, args.device == "cuda"
    vocab = engine.model_config.hf_config.vocab_size
    _check(engine, vocab)
    probs = worker.proposals.probs
    rows, memory = [], {"draft_probs_bytes": probs.numel() * probs.element_size()}
    for runner in (worker.draft_runner, worker.target_runner):
        gr = runner.step_graphs
        stats = gr.capture_stats
        mode = gr.mode.name
        memory[mode] = {"main_free_memory_drop_bytes": stats["free_memory_drop_bytes"],
                        "tail_free_memory_drop_bytes":
                            stats["sampling_tail"]["free_memory_drop_bytes"],
                        "tail_capture_s": stats["sampling_tail"]["seconds"]}
        for x, graph, tail in zip(gr.layouts, gr.graphs, gr.sampling_graphs, strict=True):
            rows.append({"graph": mode, "bs": x.step_bs, "tokens": x.num_tokens,
                         "main_ms": replay_ms(gr.backend, graph, args.iters, cuda),
                         "tail_ms": replay_ms(gr.backend, tail, args.iters, cuda)})
    old = _sorted_tails(worker, args.iters, cuda)
    for r in rows:
        r["sorted_tail_ms"] = old[r["graph"]]["tail_ms"][r["bs"]]
    alone = [_probs_alone(worker.target_runner.step_graphs.backend, bs * width, vocab,
                          args.iters) for bs in args.bs
             for width in (worker.verify_width - 1, worker.verify_width)] if cuda else []
    mib = 2.0**-20
    print(f"draft distributions buffer: {memory['draft_probs_bytes'] * mib:.1f} MiB")
    for mode in ("DRAFT_BLOCK", "TARGET_VERIFY"):
        m = memory[mode]
        print(f"{mode}: capture free-memory drop main {m['main_free_memory_drop_bytes'] * mib:.1f}"
              f" MiB, tails new {m['tail_free_memory_drop_bytes'] * mib:.1f} MiB, sorted "
              f"{old[mode]['tail_free_memory_drop_bytes'] * mib:.1f} MiB")
    if alone:
        print(f"sampling_probs alone: {'rows':>5} {'sorted ms':>9} {'kernel ms':>9} "
              f"{'twin ms':>8} {'sorted MiB':>10} {'kernel MiB':>10} {'twin MiB':>8} "
              f"{'kept':>6}")
    for r in alone:
        print(f"{'':21} {r['rows']:>5} {r['sorted_ms']:>9.3f} {r['kernel_ms']:>9.3f} "
              f"{r['twin_ms']:>8.3f} {r['sorted_pool_bytes'] * mib:>10.1f} "
              f"{r['kernel_pool_bytes'] * mib:>10.1f} {r['twin_pool_bytes'] * mib:>8.1f} "
              f"{r['kernel_kept_mean']:>6.0f}")
    print(f"{'graph':>13} {'bs':>4} {'tokens':>6} {'main ms':>8} {'tail ms':>8} "
          f"{'sorted tail ms':>14} {'new/sorted':>10}")
    for r in rows:
        print(f"{r['graph']:>13} {r['bs']:>4} {r['tokens']:>6} {r['main_ms']:>8.3f} "
              f"{r['tail_ms']:>8.3f} {r['sorted_tail_ms']:>14.3f} "
              f"{r['tail_ms'] / r['sorted_tail_ms']:>10.2f}")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "memory": memory, "sorted_tails": old, "rows": rows,
                   "sampling_probs_alone": alone}, f, indent=1)


if __name__ == "__main__":
    main()

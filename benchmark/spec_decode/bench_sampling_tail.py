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
"""

from __future__ import annotations

import argparse
import json

from bench_graph_replay import replay_ms  # this script's folder is on sys.path

from sglang_aux.srt.entrypoints.engine import Engine


def _check(engine: Engine, vocab: int) -> None:
    params = [{"temperature": 0 if i % 2 else 0.8, "top_p": 0.9, "max_new_tokens": 16,
               "ignore_eos": True, "seed": i} for i in range(4)]
    outs = engine.generate(input_ids=[[1, 2, 3, 4 + i] for i in range(4)],
                           sampling_params=params)
    assert all(len(o["output_ids"]) == 16 and max(o["output_ids"]) < vocab for o in outs)


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
    probs = worker._draft_probs
    rows, memory = [], {"draft_probs_bytes": probs.numel() * probs.element_size()}
    for runner in (worker.draft_runner, worker.target_runner):
        gr = runner.graph_runner
        stats = gr.capture_stats
        mode = gr.forward_mode.name
        memory[mode] = {"main_free_memory_drop_bytes": stats["free_memory_drop_bytes"],
                        "tail_free_memory_drop_bytes":
                            stats["sampling_tail"]["free_memory_drop_bytes"],
                        "tail_capture_s": stats["sampling_tail"]["seconds"]}
        for bs in gr.capture_bs:
            rows.append({"graph": mode, "bs": bs, "tokens": bs * gr.captured_req_width,
                         "main_ms": replay_ms(gr.backend, gr.graphs[bs], args.iters, cuda),
                         "tail_ms": replay_ms(gr.backend, gr.sampling_graphs[bs], args.iters,
                                              cuda)})
    mib = 2.0**-20
    print(f"draft distributions buffer: {memory['draft_probs_bytes'] * mib:.1f} MiB")
    for mode in ("DRAFT_BLOCK", "TARGET_VERIFY"):
        m = memory[mode]
        print(f"{mode}: capture free-memory drop main {m['main_free_memory_drop_bytes'] * mib:.1f}"
              f" MiB, tails {m['tail_free_memory_drop_bytes'] * mib:.1f} MiB")
    print(f"{'graph':>13} {'bs':>4} {'tokens':>6} {'main ms':>8} {'tail ms':>8} {'tail/main':>9}")
    for r in rows:
        print(f"{r['graph']:>13} {r['bs']:>4} {r['tokens']:>6} {r['main_ms']:>8.3f} "
              f"{r['tail_ms']:>8.3f} {r['tail_ms'] / r['main_ms']:>9.2f}")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "memory": memory, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

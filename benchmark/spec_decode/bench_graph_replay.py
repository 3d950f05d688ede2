"""Replay time and kernels per layer of the captured decode, target-verify and draft graphs.

    python benchmark/spec_decode/bench_graph_replay.py --presets smollm2-shaped bench-llama \
        --decode-bs 1 8 32 --verify-bs 1 32 --draft-bs 1 32 --context 900 \
        --out graph_replay.json

For each preset (random weights, `--load-format dummy`), a target-only engine's DECODE graphs,
and a DFLASH engine's TARGET_VERIFY graphs and its draft's DRAFT_BLOCK graphs (the block of the
`<preset>-dflash` draft; `--draft-algorithms dflash dspark` adds a DSPARK engine's, with the
`<preset>-dspark` draft, whose block graph holds the Markov loop; `--draft-vocabs 0 32768`
adds engines whose drafts propose from the first 32,768 ids, `--speculative-token-map`),
are replayed over live-looking inputs: every request row maps `--context` tokens to distinct
KV slots (the draft's: its own context K/V), so attention reads a real context. Replay ms is
the median of CUDA-event timings over `--iters` replays after warm-up. Kernels per layer: GPU
kernels launched by one eager forward of the same captured batch (the graph holds the same kernels),
divided by the layer count. Bandwidth (`step_bandwidth.py`): the bytes a step reads (weights,
K/V of the context), their rate at the replay time, and its fraction of the device-to-device
copy bandwidth measured in the same run; with `--kernel-table N` (default 12 on CUDA) each
replay's N costliest kernels. `--triton-attention-decode-merge in_kernel` measures the
one-launch decode attention. `--pdl on|off` launches our kernels (row GEMVs, RMSNorm, RoPE + KV
store, SiLU-mul) dependent or not (programmatic dependent launch: it sets `SGLANG_AUX_PDL` for
this process, `triton_ops/grid_dependency.py`; `auto`, the default, is the server's: one-token
launches where the device has it); `--paired-gemv` sets its switch likewise. Run the settings
compared beside each other in the same call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
from bench_cached_prefill import kernel_table, print_kernel_table  # script folder on sys.path
from step_bandwidth import copy_bandwidth, kv_bytes, weight_bytes

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.triton_ops.dispatch import (
    GEMV_BACKENDS,
    PAIRED_GEMV_ENV_VAR,
    PDL_ENV_VAR,
)
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.server_args import TRITON_DECODE_MERGES

# the graph each size list times: a target-only engine's; a DFLASH engine's target and draft
RUNNERS = {"decode": "model_runner", "verify": "target_runner", "draft": "draft_runner"}


def _runner_and_graphs(engine: Engine, graph: str):
    runner = getattr(engine.worker, RUNNERS[graph])
    return runner, runner.step_graphs


def _load_live_inputs(runner, graph_runner, i: int, context: int) -> None:
    """Point graph `i` (a step of `bs` requests) at `bs` request rows of `context` cached
    tokens: their rows in its input buffer, their device kv_len and last token set, so its
    prologue derives a step at the end of a real context."""
    layout = graph_runner.layouts[i]
    bs, w = layout.step_bs, layout.tokens_per_req
    rows = torch.arange(1, bs + 1, device=runner.device)
    pool = runner.req_to_token_pool
    slots = 1 + torch.arange(bs * (context + w), device=runner.device).view(bs, context + w)
    if slots.max() > runner.token_to_kv_pool_allocator.size:
        raise ValueError(f"{bs} x {context + w} slots exceed the KV pool")
    pool.req_to_token[rows, : context + w] = slots.to(pool.req_to_token.dtype)
    vocab = runner.model_config.hf_config.vocab_size
    pool.set_rows(rows, torch.full((bs,), context, device=runner.device),
                  torch.randint(0, vocab, (bs,), device=runner.device))
    graph_runner.prepare(i, ForwardInputs(layout.mode, step_rows=rows.tolist(),
                                          step_kv_bounds=[context] * bs))


def replay_ms(backend, handle, iters: int, cuda: bool) -> float:
    """Median ms of one replay of captured `handle` (CUDA events; wall time off the GPU)."""
    for _ in range(10):
        backend.replay(handle)
    if not cuda:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            backend.replay(handle)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        backend.replay(handle)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _kernels(runner, graph_runner, i: int) -> int | None:
    """GPU kernels of one eager forward of graph `i`'s static batch (as its last replay left
    it)."""
    if runner.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    fb = graph_runner.static[i]
    runner.attn_backend.init_forward_metadata_replay_cuda_graph(fb)
    runner.model.forward(fb.input_ids, fb.positions, fb)  # warm (Triton compiles)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.model.forward(fb.input_ids, fb.positions, fb)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure(preset: str, graphs: dict[str, list[int]], args, algorithm: str = "none",
            draft_vocab: int = 0) -> list[dict]:
    """One engine (target-only for "decode", `algorithm` with the `<preset>-<algorithm>`
    draft for "verify" and "draft", its draft vocabulary the first `draft_vocab` ids when
    not 0), each graph kind's sizes replayed."""
    extra = {}
    if "decode" not in graphs:
        extra = {"speculative_algorithm": algorithm.upper(),
                 "speculative_draft_model_path": f"{preset}-{algorithm}"}
    if draft_vocab:
        # dummy weights: which ids does not change the cost, only how many
        path = os.path.join(tempfile.mkdtemp(), "token_map.pt")
        torch.save(torch.arange(draft_vocab), path)
        extra["speculative_token_map"] = path
    sizes = sorted({bs for s in graphs.values() for bs in s})
    engine = Engine(model_path=preset, load_format="dummy", device=args.device,
                    max_running_requests=max(sizes), cuda_graph_bs_decode=sizes,
                    context_length=args.context + 64,
                    triton_attention_decode_merge=args.triton_attention_decode_merge,
                    decode_gemv_backend=args.decode_gemv_backend, **extra)
    rows = []
    for graph, graph_sizes in graphs.items():
        rows += [{"algorithm": algorithm, "draft_vocab": draft_vocab, **r}
                 for r in _replay_rows(engine, preset, graph, graph_sizes, args)]
    del engine
    return rows


def _replay_rows(engine: Engine, preset: str, graph: str, sizes: list[int], args) -> list[dict]:
    runner, gr = _runner_and_graphs(engine, graph)
    layers = runner.model_config.num_layers
    rows = []
    for bs in sizes:
        i = next(i for i, x in enumerate(gr.layouts) if x.step_bs == bs)
        _load_live_inputs(runner, gr, i, args.context)
        ms = replay_ms(gr.backend, gr.graphs[i], args.iters, runner.device.type == "cuda")
        kernels = _kernels(runner, gr, i)
        w = gr.layouts[i].tokens_per_req
        weights = weight_bytes(runner.model, runner.model_config.hf_config, bs * w)
        kv = kv_bytes(runner.token_to_kv_pool, bs, args.context, w)
        tb_s = (weights + kv) / (ms / 1e3) / 1e12
        row = {"preset": preset, "graph": gr.mode.name, "bs": bs,
               "decode_gemv_backend": args.decode_gemv_backend, "pdl": args.pdl,
               "tokens_per_req": w, "context": args.context,
               "replay_ms": ms, "kernels": kernels, "layers": layers,
               "kernels_per_layer": None if kernels is None else kernels / layers,
               "weight_bytes": weights, "kv_bytes": kv, "achieved_tb_s": tb_s,
               "copy_tb_s": args.copy_tb_s, "fraction_of_copy": tb_s / args.copy_tb_s,
               "floor_ms": (weights + kv) / (args.copy_tb_s * 1e12) * 1e3}
        if args.kernel_table and runner.device.type == "cuda":
            row["kernel_table"] = kernel_table(lambda i=i: gr.backend.replay(gr.graphs[i]),
                                               args.kernel_table)
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", nargs="+", default=["smollm2-shaped", "bench-llama"])
    p.add_argument("--decode-bs", type=int, nargs="*", default=[1, 8, 32])
    p.add_argument("--verify-bs", type=int, nargs="*", default=[1, 32])
    p.add_argument("--draft-bs", type=int, nargs="*", default=[],
                   help="the DFLASH engine's draft block graphs at these batch sizes")
    p.add_argument("--draft-algorithms", nargs="+", default=["dflash"],
                   choices=["dflash", "dspark"],
                   help="the speculative engines whose verify and draft graphs are replayed, "
                        "each with the `<preset>-<algorithm>` draft preset")
    p.add_argument("--draft-vocabs", type=int, nargs="+", default=[0],
                   help="speculative engines with a draft vocabulary of this many ids "
                        "(--speculative-token-map; 0: the target's whole vocabulary)")
    p.add_argument("--context", type=int, default=900)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--device", default="auto")
    p.add_argument("--triton-attention-decode-merge", default="launch",
                   choices=TRITON_DECODE_MERGES, help="the server flag of that name")
    p.add_argument("--kernel-table", type=int, default=None,
                   help="print the N costliest kernels of each replay (torch profiler; "
                        "default 12 on CUDA, 0 turns it off)")
    p.add_argument("--decode-gemv-backend", default="triton", choices=GEMV_BACKENDS,
                   help="the engines' --decode-gemv-backend (docs/kernels.md; triton, the "
                        "server's default)")
    p.add_argument("--pdl", default="auto", choices=["auto", "on", "off"],
                   help="launch our kernels dependent (SGLANG_AUX_PDL; auto, the server's "
                        "default: where the device has it, sm_90+)")
    p.add_argument("--paired-gemv", default="on", choices=["on", "off"],
                   help="with the triton backend, qkv + RoPE + K/V store and gate_up + SiLU-mul "
                        "as one kernel each (SGLANG_AUX_PAIRED_GEMV; on, the server's default)")
    p.add_argument("--out", default="benchmark/spec_decode/graph_replay.json")
    args = p.parse_args()
    on_off = {"on": "1", "off": "0", "auto": "auto"}
    for var, value in ((PDL_ENV_VAR, args.pdl), (PAIRED_GEMV_ENV_VAR, args.paired_gemv)):
        os.environ[var] = on_off[value]
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    if args.kernel_table is None:
        args.kernel_table = 12 if device.type == "cuda" else 0
    args.copy_tb_s = copy_bandwidth(device) / 1e12
    print(f"device-to-device copy: {args.copy_tb_s:.2f} TB/s (read + written)")
    rows = []
    if min(args.draft_vocabs) < 0:
        p.error(f"--draft-vocabs must be >= 0, got {args.draft_vocabs}")
    engines = [("none", 0, {"decode": args.decode_bs})] + [
        (algorithm, vocab, {"verify": args.verify_bs, "draft": args.draft_bs})
        for algorithm in args.draft_algorithms for vocab in args.draft_vocabs]
    for preset in args.presets:
        for algorithm, vocab, graphs in engines:
            graphs = {graph: sizes for graph, sizes in graphs.items() if sizes}
            if graphs:
                rows += measure(preset, graphs, args, algorithm, vocab)
    decode_bs1 = {r["preset"]: r["replay_ms"] for r in rows
                  if r["graph"] == "DECODE" and r["bs"] == 1}
    print(f"{'preset':>15} {'engine':>12} {'graph':>13} {'bs':>4} {'replay ms':>10} "
          f"{'kern/layer':>10} {'vs decode bs1':>13} {'MB read':>9} {'floor ms':>9} "
          f"{'TB/s':>6} {'of copy':>8}")
    for r in rows:
        kpl = "-" if r["kernels_per_layer"] is None else f"{r['kernels_per_layer']:.1f}"
        ref = decode_bs1.get(r["preset"])
        ratio = f"{r['replay_ms'] / ref:.2f}x" if ref else "-"
        read = (r["weight_bytes"] + r["kv_bytes"]) / 1e6
        engine = r["algorithm"] + (f"/{r['draft_vocab']}" if r["draft_vocab"] else "")
        print(f"{r['preset']:>15} {engine:>12} {r['graph']:>13} {r['bs']:>4} "
              f"{r['replay_ms']:>10.3f} {kpl:>10} {ratio:>13} {read:>9.1f} {r['floor_ms']:>9.3f} "
              f"{r['achieved_tb_s']:>6.2f} {r['fraction_of_copy']:>7.0%}")
        print_kernel_table(r.get("kernel_table", []), "    ")
    with open(args.out, "w") as f:
        json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

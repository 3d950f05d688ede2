"""Target-verify graph memory: per-graph aux outputs, the shared aux buffer, streamed projection.

    python benchmark/aux_memory/bench_graph_memory.py --max-bs 48 64 72 --out graph_memory.json
    python benchmark/aux_memory/bench_graph_memory.py --preset smollm2-shaped --max-bs 32 64 \
        --out graph_memory_smollm2.json
    python benchmark/aux_memory/bench_graph_memory.py --tp-size 2 --max-bs 64 \
        --out graph_memory_tp2.json    # one row per rank: each holds its own buffer and graphs

Every (max bs, path) configuration runs in its own process, so each starts from a fresh
allocator; within one, the same model, sizes and capture order. Paths:
- per-graph: every graph keeps its own packed `[T, K*H]` aux output (the baseline);
- shared: one `[max_num_token, K*H]` buffer, row-sliced per size (seed 1);
- streamed: no packed aux at all (`--speculative-dflash-aux-projection streamed`); each graph's
  target projects every tapped aux state into the draft fc's fp32 accumulator, one
  `[max_num_token, H_draft]` buffer the runner owns for all sizes (theory: 4 * H_draft /
  (2 * K * H) of the shared bytes, 1/3 at K3 dims).
Each path captures the DFlash worker's own TARGET_VERIFY graphs (prologue, model, draft-context
commit and greedy acceptance; the worker is built with graphs off, outside the measured window,
then its target runner allocates its aux storage and captures inside it).
Reported: the drop in free device memory across runner set-up + capture, the allocator's
reserved and allocated deltas, retained aux bytes measured and theoretical.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import socket
import subprocess
import sys

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.distributed.parallel_state import init_distributed_environment
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import get_capture_bs
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker

PATHS = ("per-graph", "shared", "streamed")


def model_configs(a: argparse.Namespace) -> tuple[ModelConfig, ModelConfig]:
    """The target and its DFlash draft (random weights for presets)."""
    if a.model_path:
        return ModelConfig.from_pretrained(a.model_path), ModelConfig.from_pretrained(a.draft_path)
    target = ModelConfig.from_dict(dict(PRESETS[a.preset]), a.preset, context_length=1024)
    # The preset's own DFlash draft picks the layers (k3-shaped: 0..5; smollm2-shaped: 5 of 30).
    draft = copy.deepcopy(PRESETS[f"{a.preset}-dflash"])
    if a.num_aux is not None:
        draft["dflash_config"]["target_layer_ids"] = list(range(a.num_aux))
    return target, ModelConfig.from_dict(draft, f"{a.preset}-dflash", context_length=1024)


def run_one(a: argparse.Namespace, max_bs: int, path: str) -> dict:
    cfg, draft_cfg = model_configs(a)
    args = ServerArgs(
        model_path=a.model_path or a.preset, device=a.device, load_format="dummy",
        speculative_algorithm="DFLASH", speculative_verify_width=a.block,
        max_running_requests=max_bs, cuda_graph_max_bs_decode=max_bs, max_total_tokens=8192,
        disable_shared_aux_buffer=path != "shared", disable_decode_cuda_graph=True,
        disable_prefill_cuda_graph=True,  # the verify graphs alone, captured below
        speculative_dflash_aux_projection="streamed" if path == "streamed" else "packed",
        tp_size=a.tp_size,
    )
    if a.tp_size > 1:  # this process is rank `a.tp_rank`: its shard, its buffer, its graphs
        init_distributed_environment(world_size=a.tp_size, rank=a.tp_rank,
                                     local_rank=a.tp_rank, dist_init_addr=a.dist_init_addr,
                                     device=a.device)
        args = dataclasses.replace(args, device=f"cuda:{a.tp_rank}") \
            if a.device == "cuda" else args
    worker = DFlashWorker(cfg, draft_cfg, args)
    runner = worker.target_runner
    h, k = cfg.hf_config.hidden_size, len(runner.model.model.layers_to_capture)
    h_draft = worker.draft_runner.model.fc.out_features
    # The runner's aux storage and verify graphs are set up again, inside the window: its
    # forwards registered anew, now with graphs on.
    runner.aux_storage, runner.forwards = None, {}
    gc.collect()
    probe = MemoryProbe(a.device)
    runner.server_args.disable_decode_cuda_graph = False
    runner.init_forwards(worker.verify_parts)
    gr, storage = runner.step_graphs, runner.aux_storage
    total = probe.delta()
    sizes = [x.step_bs for x in gr.layouts]
    assert sizes == get_capture_bs(max_bs=max_bs, speculative=True, override=None)
    outs = [o.aux_hidden_states for o in gr.outputs if o.aux_hidden_states is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in outs}
    owned = [] if storage is None else [storage.buffer]  # the shared buffer or the accumulator
    retained = {**storages, **{t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                               for t in owned}}
    elt = torch.empty((), dtype=cfg.dtype).element_size()
    if path == "streamed":
        theory = max(sizes) * a.block * h_draft * 4
    elif path == "shared":
        theory = max(sizes) * a.block * k * h * elt
    else:
        theory = sum(sizes) * a.block * k * h * elt
    aux_path = "per-graph" if storage is None else storage.path
    assert aux_path == path, (aux_path, path)
    return {
        "model": a.model_path or a.preset, "max_bs": max_bs, "path": path, "block": a.block,
        "tp_size": a.tp_size, "tp_rank": a.tp_rank,
        "num_aux": k, "hidden": h, "hidden_draft": h_draft, "num_sizes": len(sizes),
        "capture_bs": sizes, "setup_and_capture": total, "capture_only": gr.capture_stats,
        "aux_retained_measured_bytes": sum(retained.values()),
        "aux_retained_theoretical_bytes": theory, "aux_output_storages": len(storages),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="k3-shaped")
    p.add_argument("--num-aux", type=int, default=None,
                   help="K aux layers 0..K-1 (default: the layers of the preset's -dflash draft)")
    p.add_argument("--model-path", help="a checkpoint instead of a preset (e.g. SmolLM2)")
    p.add_argument("--draft-path", help="its DFlash draft (gives the aux layers)")
    p.add_argument("--max-bs", type=int, nargs="+", default=[48, 64, 72])
    p.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS))
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--out", default="benchmark/aux_memory/graph_memory.json")
    p.add_argument("--device", default="cuda", help="cpu runs a smoke check (no memory figures)")
    p.add_argument("--tp-size", type=int, default=1,
                   help="tensor-parallel ranks, one process and GPU each (a row per rank)")
    p.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    p.add_argument("--tp-rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--dist-init-addr", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.model_path and not a.draft_path:
        p.error("--model-path needs --draft-path")
    if a.child:
        print("RESULT " + json.dumps(run_one(a, a.max_bs[0], a.child)))
        return
    rows = []
    for max_bs in a.max_bs:
        for path in a.paths:
            cmd = [sys.executable, __file__, "--child", path, "--max-bs", str(max_bs),
                   "--block", str(a.block), "--device", a.device, "--preset", a.preset]
            if a.num_aux is not None:
                cmd += ["--num-aux", str(a.num_aux)]
            if a.model_path:
                cmd += ["--model-path", a.model_path, "--draft-path", a.draft_path]
            rows += run_ranks(cmd, a.tp_size)
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    mib = 2**20
    print(f"{'max_bs':>6} {'path':>9} {'rank':>4} {'free drop':>10} {'reserved':>10} "
          f"{'allocated':>10} {'aux meas':>9} {'aux theory':>10}  (MiB, set-up + capture)")
    for r in rows:
        t = r["setup_and_capture"]
        print(f"{r['max_bs']:>6} {r['path']:>9} {r['tp_rank']:>4} "
              f"{t['free_memory_drop_bytes'] / mib:>10.1f} "
              f"{t['reserved_delta_bytes'] / mib:>10.1f} "
              f"{t['allocated_delta_bytes'] / mib:>10.1f} "
              f"{r['aux_retained_measured_bytes'] / mib:>9.1f} "
              f"{r['aux_retained_theoretical_bytes'] / mib:>10.1f}")


def run_ranks(cmd: list[str], tp_size: int) -> list[dict]:
    """Run a configuration's child, one process per rank (meeting at a free loopback port);
    each rank's row."""
    if tp_size == 1:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            addr = f"127.0.0.1:{s.getsockname()[1]}"
        procs = [subprocess.Popen([*cmd, "--tp-size", str(tp_size), "--tp-rank", str(r),
                                   "--dist-init-addr", addr], stdout=subprocess.PIPE, text=True)
                 for r in range(tp_size)]
    rows = []
    for proc in procs:
        out = proc.communicate()[0]
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, out)
        rows.append(json.loads(next(ln[7:] for ln in out.splitlines()
                                    if ln.startswith("RESULT "))))
    return rows


if __name__ == "__main__":
    main()

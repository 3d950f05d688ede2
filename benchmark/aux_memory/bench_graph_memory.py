"""Target-verify graph memory with the shared aux buffer on and off, on a K3-shaped target.

    python benchmark/aux_memory/bench_graph_memory.py --max-bs 48 64 --out graph_memory.json

Every (max bs, shared) configuration runs in its own process, so each starts from a fresh
allocator; within one, the same model, sizes and capture order. Reported per configuration:
the drop in free device memory across runner set-up + capture (what the device loses), the
allocator's reserved and allocated deltas, the retained aux bytes measured (distinct aux output
storage that outlives capture) and theoretical (per-graph: sum over sizes of bs*B*K*H*2;
shared: max_bs*B*K*H*2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.model_executor.forward_batch_info import ForwardMode
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner_utils.memory_probe import MemoryProbe
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.tools.presets import PRESETS

AUX_LAYERS = [0, 1, 2, 3, 4, 5]  # K = 6, as K3 DFlash drafts use


def run_one(preset: str, max_bs: int, shared: bool, block: int, device: str) -> dict:
    cfg = ModelConfig.from_dict(dict(PRESETS[preset]), preset, context_length=1024)
    args = ServerArgs(
        model_path=preset, device=device, load_format="dummy", speculative_algorithm="DFLASH",
        speculative_num_draft_tokens=block, max_running_requests=max_bs,
        cuda_graph_max_bs_decode=max_bs, max_total_tokens=8192,
        disable_shared_aux_buffer=not shared,
    )
    runner = ModelRunner(cfg, args, aux_layer_ids=AUX_LAYERS)
    probe = MemoryProbe(device)
    runner.init_decode_graphs(ForwardMode.TARGET_VERIFY, block)
    total = probe.delta()
    gr = runner.graph_runner
    storages = {o.aux_hidden_states.untyped_storage().data_ptr(): o.aux_hidden_states
                for o in gr.outputs.values()}
    measured = (gr.buffers.aux_nbytes() if shared else
                sum(t.untyped_storage().nbytes() for t in storages.values()))
    h, k = cfg.hf_config.hidden_size, len(AUX_LAYERS)
    per_token = k * h * torch.empty((), dtype=cfg.dtype).element_size()
    sizes = gr.capture_bs
    theory = (max(sizes) if shared else sum(sizes)) * block * per_token
    return {
        "preset": preset, "max_bs": max_bs, "shared": shared, "block": block,
        "num_sizes": len(sizes), "capture_bs": sizes,
        "setup_and_capture": total, "capture_only": gr.capture_stats,
        "aux_retained_measured_bytes": measured, "aux_retained_theoretical_bytes": theory,
        "aux_output_storages": len(storages),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="k3-shaped")
    p.add_argument("--max-bs", type=int, nargs="+", default=[48, 64])
    p.add_argument("--block", type=int, default=8)
    p.add_argument("--out", default="benchmark/aux_memory/graph_memory.json")
    p.add_argument("--device", default="cuda", help="cpu runs a smoke check (no memory figures)")
    p.add_argument("--child", choices=["shared", "per-graph"], help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(run_one(a.preset, a.max_bs[0], a.child == "shared", a.block,
                                              a.device)))
        return
    rows = []
    for max_bs in a.max_bs:
        for mode in ("per-graph", "shared"):
            cmd = [sys.executable, __file__, "--child", mode, "--preset", a.preset,
                   "--max-bs", str(max_bs), "--block", str(a.block), "--device", a.device]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(next(ln[7:] for ln in out.splitlines()
                                        if ln.startswith("RESULT "))))
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)
    mib = 2**20
    print(f"{'max_bs':>6} {'path':>9} {'free drop':>10} {'reserved':>10} {'allocated':>10} "
          f"{'aux meas':>9} {'aux theory':>10}  (MiB, set-up + capture)")
    for r in rows:
        t = r["setup_and_capture"]
        print(f"{r['max_bs']:>6} {'shared' if r['shared'] else 'per-graph':>9} "
              f"{t['free_memory_drop_bytes'] / mib:>10.1f} "
              f"{t['reserved_delta_bytes'] / mib:>10.1f} "
              f"{t['allocated_delta_bytes'] / mib:>10.1f} "
              f"{r['aux_retained_measured_bytes'] / mib:>9.1f} "
              f"{r['aux_retained_theoretical_bytes'] / mib:>10.1f}")


if __name__ == "__main__":
    main()

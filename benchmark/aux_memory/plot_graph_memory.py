"""Plot bench_graph_memory.py's JSON: memory taken by target-verify graphs, shared vs per-graph.

    python benchmark/aux_memory/plot_graph_memory.py docs/data/graph_memory_h200.json \
        docs/figures/graph_memory_h200.png
"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

METRICS = [("free_memory_drop_bytes", "free-memory drop"), ("reserved_delta_bytes", "reserved"),
           ("allocated_delta_bytes", "allocated")]


def main(src: str, dst: str) -> None:
    rows = json.load(open(src))
    sizes = sorted({r["max_bs"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), sharey=True)
    for ax, max_bs in zip(axes if len(sizes) > 1 else [axes], sizes, strict=True):
        by = {r["shared"]: r for r in rows if r["max_bs"] == max_bs}
        x = range(len(METRICS) + 1)
        for offset, shared in ((-0.2, False), (0.2, True)):
            r = by[shared]
            vals = [r["setup_and_capture"][k] / 2**20 for k, _ in METRICS]
            vals.append(r["aux_retained_measured_bytes"] / 2**20)
            ax.bar([i + offset for i in x], vals, width=0.4,
                   label="shared aux buffer" if shared else "per-graph aux outputs")
        ax.set_xticks(list(x), [name for _, name in METRICS] + ["retained aux"])
        ax.set_title(f"max bs {max_bs} ({by[True]['num_sizes']} graphs, block {by[True]['block']})")
        ax.set_ylabel("MiB")
        ax.legend()
    fig.suptitle("K3-shaped target (H=7168, K=6): target-verify graph set-up + capture")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])

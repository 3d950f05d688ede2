"""Plot bench_graph_memory.py's JSON: memory taken by target-verify graphs, one bar per aux path.

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


LABELS = {"per-graph": "per-graph aux outputs", "shared": "shared aux buffer",
          "streamed": "streamed fc projection"}


def path_of(row: dict) -> str:
    # JSON written before the streamed path had a boolean "shared" instead of "path".
    return row.get("path") or ("shared" if row["shared"] else "per-graph")


def main(src: str, dst: str) -> None:
    rows = json.load(open(src))
    sizes = sorted({r["max_bs"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), sharey=True)
    for ax, max_bs in zip(axes if len(sizes) > 1 else [axes], sizes, strict=True):
        by = {path_of(r): r for r in rows if r["max_bs"] == max_bs}
        paths = [p for p in LABELS if p in by]
        width = 0.8 / len(paths)
        x = range(len(METRICS) + 1)
        for j, path in enumerate(paths):
            r = by[path]
            vals = [r["setup_and_capture"][k] / 2**20 for k, _ in METRICS]
            vals.append(r["aux_retained_measured_bytes"] / 2**20)
            ax.bar([i + (j - (len(paths) - 1) / 2) * width for i in x], vals, width=width,
                   label=LABELS[path])
        any_row = by[paths[0]]
        ax.set_xticks(list(x), [name for _, name in METRICS] + ["retained aux"])
        ax.set_title(f"max bs {max_bs} ({any_row['num_sizes']} graphs, block {any_row['block']})")
        ax.set_ylabel("MiB")
        ax.legend()
    fig.suptitle("Target-verify graph set-up + capture, by aux path")
    fig.tight_layout()
    fig.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])

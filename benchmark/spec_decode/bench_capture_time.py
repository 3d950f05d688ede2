"""Start-up of a DFlash engine: its graph captures, with the heap frozen around them against
the per-graph full collection they paid before (`runner_utils/frozen_gc.py`).

    python benchmark/spec_decode/bench_capture_time.py --order new old new --out capture.json

Each run is a fresh process (so each starts from the same heap; Triton's on-disk cache is
warm after the first): it imports the HTTP server's modules (a server's heap), then builds an
`Engine` over the shaped pair with dummy weights and the acceptance profile, as the served
DFlash start-up does (full-width graphs, the step-cost probe, then the derived draft
length schedule's narrower widths). `old` restores the per-graph collection: no frozen heap,
and `CudaGraphBackend.capture` collecting before each graph. Reported per run: the engine's
start seconds, every "Captured ..." line's graph count and seconds, the heap's objects and
what one full collection of it takes. Compare the ways by the engine's start: a capture run's
logged seconds hold the old way's per-graph collections but not the new way's one collection
before the run.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path

PROFILE = Path(__file__).parent / "profiles" / "qwen2.5-coder-1.5b-dflash-b16_gsm8k.json"
CAPTURED = re.compile(r"Captured (\d+ )?(\w+) (graphs|sampling tails) in ([\d.]+) s")


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def one(a: argparse.Namespace) -> dict:
    import sglang_aux.srt.entrypoints.http_server  # noqa: F401  (a server's heap)
    from sglang_aux.srt.entrypoints.engine import Engine
    from sglang_aux.srt.model_executor.runner_backend import cuda_graph_backend

    if a.one == "old":
        cuda_graph_backend.CudaGraphBackend.capture_session = lambda self: contextlib.nullcontext()
        cuda_graph_backend.in_frozen_gc = lambda: False
    lines = _Lines()
    logging.getLogger("sglang_aux").addHandler(lines)
    logging.getLogger("sglang_aux").setLevel(logging.INFO)
    start = time.perf_counter()
    engine = Engine(model_path=a.preset, load_format="dummy", speculative_algorithm="DFLASH",
                    speculative_draft_model_path=f"{a.preset}-dflash",
                    speculative_acceptance_profile=a.profile,
                    max_running_requests=a.max_running_requests, context_length=2048)
    seconds = time.perf_counter() - start
    t = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - t
    captures = []
    for line in lines.lines:
        m = CAPTURED.search(line)
        if m:
            captures.append({"mode": m.group(2), "what": m.group(3),
                             "graphs": int(m.group(1) or 0), "seconds": float(m.group(4))})
    engine.shutdown()
    return {"variant": a.one, "engine_start_s": round(seconds, 2),
            "capture_s": round(sum(c["seconds"] for c in captures), 2),
            "captures": captures, "heap_objects": len(gc.get_objects()),
            "full_collection_s": round(collect_s, 4)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="qwen2.5-1.5b-shaped")
    p.add_argument("--profile", default=str(PROFILE),
                   help="the acceptance profile the server derives its schedule from, or none")
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--order", nargs="+", choices=["new", "old"], default=["new", "old", "new"])
    p.add_argument("--one", choices=["new", "old"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    if a.one:
        print("RESULT " + json.dumps(one(a)), flush=True)
        return
    runs = []
    for variant in a.order:
        cmd = [sys.executable, __file__, "--one", variant, "--preset", a.preset,
               "--profile", a.profile, "--max-running-requests",
               str(a.max_running_requests)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        result = next((json.loads(x[7:]) for x in out.stdout.splitlines()
                       if x.startswith("RESULT ")), None)
        if result is None:
            sys.exit(f"{variant} run failed:\n{out.stderr[-3000:]}")
        runs.append(result)
        print(f"{variant}: engine start {result['engine_start_s']} s, captures "
              f"{result['capture_s']} s over {sum(c['graphs'] for c in result['captures'])} "
              f"graphs; heap {result['heap_objects']} objects, a full collection "
              f"{result['full_collection_s']} s", flush=True)
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                     "runs": runs}, indent=1))


if __name__ == "__main__":
    main()

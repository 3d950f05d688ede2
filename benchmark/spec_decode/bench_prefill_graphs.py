"""Prefill wall time with and without prefill (EXTEND) graphs, target-only and DFlash.

    python benchmark/spec_decode/bench_prefill_graphs.py --out prefill_graphs.json

Random-weight SmolLM2-shaped target (and its DFlash draft), bf16, prompts of ~900 tokens (the
GSM8K 5-shot length): each row is `generate` with one new token, i.e. one prefill plus the
sampling and its readback, timed on the host after a device sync. The first prompt of each
engine includes lazy set-up; the table reports the median of the rest. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine

LENGTHS = [900, 901, 933, 870, 1000, 900, 950]


def measure(spec: bool, graphs: bool) -> list[float]:
    extra = dict(speculative_algorithm="DFLASH",
                 speculative_draft_model_path="smollm2-shaped-dflash") if spec else {}
    engine = Engine(model_path="smollm2-shaped", load_format="dummy", dtype="bfloat16",
                    device="cuda", max_running_requests=4, context_length=2048,
                    disable_prefill_cuda_graph=not graphs, **extra)
    g = torch.Generator().manual_seed(0)
    times = []
    for n in LENGTHS:
        ids = torch.randint(0, 40000, (n,), generator=g).tolist()
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1})
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    del engine
    torch.cuda.empty_cache()
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmark/spec_decode/prefill_graphs.json")
    a = p.parse_args()
    rows = []
    for spec in (False, True):
        for graphs in (False, True):
            ms = measure(spec, graphs)
            rows.append({"engine": "dflash" if spec else "target", "prefill_graphs": graphs,
                         "ms": ms, "median_ms": statistics.median(ms[1:])})
    print(f"{'engine':>7} {'graphs':>7} {'median ms':>10}  per prompt")
    for r in rows:
        print(f"{r['engine']:>7} {str(r['prefill_graphs']):>7} {r['median_ms']:>10.2f}  "
              + " ".join(f"{t:.1f}" for t in r["ms"]))
    with open(a.out, "w") as f:
        json.dump({"lengths": LENGTHS, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""How much of what the target writes a draft restricted to its H most frequent output tokens
could still propose (FR-Spec's draft vocabulary; SGLang's `--speculative-token-map`, built by
`python -m sglang_aux.tools.build_token_map`): the question to answer before a draft LM head
is cut to H rows. On Qwen2.5-1.5B-shaped graphs (H100, docs/benchmarks.md section 9k) the
DFlash draft block spends 159-291 us of its 0.34-0.62 ms on the full 151,936-row LM head and
its argmax, and DSpark's Markov loop reads the 77.8 MB `markov_w2` once a proposal.

    python benchmark/spec_decode/hot_vocab_coverage.py            # the shipped mix samples
    python benchmark/spec_decode/hot_vocab_coverage.py --samples A.jsonl.xz B.jsonl.xz \
        --sizes 16384 32768 --out coverage.json

The hot set: the H token ids written most often in the training share of the samples (the
target's continuations, `train_dflash`'s samples files; ties to the smaller id). On the
held-out share, per prompt kind: the share of written tokens in the set, the share of
`--window` windows (a block's proposals after its anchor) wholly in it, and the mean run of
in-set tokens a window starts with, which bounds what a restricted draft can have accepted
(a token outside the set ends a run of accepted proposals there).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from sglang_aux.tools.build_token_map import coverage as token_coverage
from sglang_aux.tools.build_token_map import hot_ids
from sglang_aux.tools.dflash_training.data import Sample, load_samples
from sglang_aux.tools.dflash_training.recipes import MIX, shipped_samples

DEFAULT_SAMPLES = shipped_samples(MIX)


def coverage(samples: list[Sample], hot: set[int], window: int) -> dict:
    """Token share in `hot` (`build_token_map.coverage`), whole windows' share, and the mean
    in-set run a window starts with, over windows of `window` tokens at every `window`-th
    position of each continuation."""
    share, tokens = token_coverage(samples, hot)
    windows = whole = run_sum = 0
    for s in samples:
        out = s.output_ids
        for i in range(0, len(out) - window + 1, window):
            run = next((j for j, t in enumerate(out[i:i + window]) if t not in hot), window)
            windows += 1
            whole += run == window
            run_sum += run
    return {"tokens": tokens, "token_coverage": share, "windows": windows,
            "whole_windows": whole / max(windows, 1), "mean_run": run_sum / max(windows, 1)}


def run(args: argparse.Namespace) -> dict:
    samples = [s for path in args.samples for s in load_samples(path)]
    random.Random(args.seed).shuffle(samples)
    cut = len(samples) - max(1, int(len(samples) * args.holdout))
    train, held = samples[:cut], samples[cut:]
    ranked = hot_ids(train, max(args.sizes))
    rows = []
    for size in args.sizes:
        hot = set(ranked[:size])
        for source in sorted({s.source for s in held}):
            rows.append({"size": size, "source": source,
                         **coverage([s for s in held if s.source == source], hot, args.window)})
    return {"samples": [str(p) for p in args.samples], "train": len(train), "held_out": len(held),
            "distinct_train_ids": len(ranked) if len(ranked) < max(args.sizes) else None,
            "window": args.window, "rows": rows}


def _table(report: dict) -> str:
    lines = [f"{report['train']} samples ranked, {report['held_out']} held out; windows of "
             f"{report['window']}",
             f"{'H':>7} {'source':>7} {'tokens':>9} {'in set':>8} {'whole windows':>13} "
             f"{'mean run':>8}"]
    for r in report["rows"]:
        lines.append(f"{r['size']:>7} {r['source']:>7} {r['tokens']:>9} "
                     f"{r['token_coverage']:>8.4f} {r['whole_windows']:>13.4f} "
                     f"{r['mean_run']:>8.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", nargs="+", type=Path, default=[DEFAULT_SAMPLES])
    p.add_argument("--sizes", type=int, nargs="+", default=[8192, 16384, 32768, 65536])
    p.add_argument("--holdout", type=float, default=0.1, help="share of samples held out")
    p.add_argument("--window", type=int, default=15, help="proposals a block makes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmark/spec_decode/hot_vocab_coverage.json")
    args = p.parse_args(argv)
    if not 0 < args.holdout < 1 or min(args.sizes) < 1 or args.window < 1:
        p.error(f"--holdout in (0, 1), --sizes and --window >= 1: got {args.holdout}, "
                f"{args.sizes}, {args.window}")
    report = run(args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(_table(report))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

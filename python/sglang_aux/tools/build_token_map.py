"""A draft vocabulary for `--speculative-token-map`: the H token ids the target writes most
often in a samples file's continuations (FR-Spec's frequency ranking), saved as SGLang reads
it (a 1-D int64 tensor, `torch.save`).

    python -m sglang_aux.tools.build_token_map --out hot32k.pt       # the shipped mix samples
    python -m sglang_aux.tools.build_token_map --samples A.jsonl.xz B.jsonl.xz --size 32768 \\
        --keep 151643 151645 --out hot32k.pt

The samples are the target's own continuations (`train_dflash`'s samples files); `--keep`
adds ids the ranking may miss but a draft must be able to propose (end-of-turn and stop
tokens). What a size keeps of held-out text: `benchmark/spec_decode/hot_vocab_coverage.py`
(32,768 of Qwen2.5's 151,936 ids cover 99.5-99.9% of written tokens).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from sglang_aux.tools.dflash_training.data import Sample, load_samples
from sglang_aux.tools.dflash_training.export import DEFAULT_TOKEN_MAP_SIZE
from sglang_aux.tools.dflash_training.recipes import MIX, shipped_samples


def hot_ids(samples: list[Sample], size: int) -> list[int]:
    """The `size` ids written most often in the samples' continuations, ties to the smaller."""
    counts = Counter(t for s in samples for t in s.output_ids)
    return sorted(counts, key=lambda t: (-counts[t], t))[:size]


def token_map(samples: list[Sample], size: int, keep: list[int]) -> list[int]:
    """`keep` first, then the most written ids not among them, `size` in all (fewer when the
    samples write fewer distinct ids)."""
    if len(set(keep)) != len(keep) or len(keep) > size:
        raise ValueError(f"--keep needs at most --size {size} distinct ids, got {keep}")
    kept = set(keep)
    return keep + [t for t in hot_ids(samples, size + len(keep)) if t not in kept][
        : size - len(keep)]


def coverage(samples: list[Sample], ids: Iterable[int]) -> tuple[float, int]:
    """The share of the tokens the samples' continuations write that are among `ids`, and
    how many they write."""
    inside = set(ids)
    written = sum(len(s.output_ids) for s in samples)
    share = sum(t in inside for s in samples for t in s.output_ids) / max(written, 1)
    return share, written


def main(argv: list[str] | None = None) -> list[int]:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", nargs="+", type=Path, default=[shipped_samples(MIX)])
    p.add_argument("--size", type=int, default=DEFAULT_TOKEN_MAP_SIZE, help="ids in the map")
    p.add_argument("--keep", type=int, nargs="*", default=[],
                   help="ids always in the map (end-of-turn, stop tokens)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.size < 1 or any(t < 0 for t in args.keep):
        p.error(f"--size must be >= 1 and --keep ids >= 0, got {args.size}, {args.keep}")
    samples = [s for path in args.samples for s in load_samples(path)]
    try:
        ids = token_map(samples, args.size, args.keep)
    except ValueError as e:
        p.error(str(e))
    torch.save(torch.tensor(ids, dtype=torch.int64), args.out)
    share, written = coverage(samples, ids)
    print(f"{args.out}: {len(ids)} ids, {share:.2%} of the {written} tokens the samples' "
          f"continuations write")
    return ids


if __name__ == "__main__":
    main(sys.argv[1:])

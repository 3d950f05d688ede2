"""What assembling a training batch costs on the device: `SequenceSet.batch` (one cat into the
padded layout) against the pad_sequence assembly it replaced (a cat per sequence, then a
padded copy of each), timed in the same call over the same random sequences, shaped as the
Qwen2.5-Coder mix's (K * H = 5 x 1,536 bf16 columns, a shared 5-shot prefix for half of them,
lengths 120 to 1,100 rows, 32 a batch, the 256-row context bucket). The two are checked equal
bit for bit first.

    python benchmark/training/bench_batch_gather.py --out OUT.json   # CUDA; ~20 s
    python benchmark/training/bench_batch_gather.py --smoke          # the CPU check
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from sglang_aux.srt.model_executor.runner_utils.host_transfer import tensor_to_device
from sglang_aux.tools.dflash_training.data import Sample
from sglang_aux.tools.dflash_training.sequence_set import Batch, SequenceSet

SMOKE = dict(sequences=12, batch=4, width=24, prefix=16, min_len=20, max_len=70, iters=3,
             bucket=16, host_every=3)


def reference_batch(data: SequenceSet, index: list[int], bucket: int) -> Batch:
    """The batch as `SequenceSet` assembled it until 2026-12-07: each sequence's prefix and
    own rows cat, then pad_sequence's padded copy (aux and ids)."""
    dev = data.prefixes[0].device
    aux = [torch.cat([data.prefixes[data.prefix_of[i]], tensor_to_device(data.aux[i], dev)])
           for i in index]
    ids = [data.ids[i] for i in index]
    longest = max(len(x) for x in ids)
    width = longest + (-longest % bucket if bucket else 0)
    if width > longest:
        aux[0] = F.pad(aux[0], (0, 0, 0, width - len(aux[0])))
        ids[0] = F.pad(ids[0], (0, width - len(ids[0])))
    lens = data.lens[index]
    rows = torch.cat([torch.arange(n) + i * width for i, n in enumerate(lens.tolist())])
    return Batch(pad_sequence(aux, batch_first=True), pad_sequence(ids, batch_first=True),
                 tensor_to_device(data.prompt_lens[index], dev), tensor_to_device(lens, dev),
                 tensor_to_device(rows, dev))


def sequences(args: argparse.Namespace, device: torch.device) -> SequenceSet:
    """Random rows: even sequences after a shared prefix of `args.prefix` rows (source 0),
    odd ones with none (source 1); every `host_every`-th sequence's rows in pinned host
    memory (0: none), as rows past the device's reserve are."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prefixes = [torch.randn(args.prefix, args.width, generator=g).to(device, dtype),
                torch.zeros((0, args.width), dtype=dtype, device=device)]
    samples, own, of = [], [], []
    for i in range(args.sequences):
        n = int(torch.randint(args.min_len, args.max_len + 1, (), generator=g))
        p = args.prefix if i % 2 == 0 else 0
        prompt = p + 8
        ids = torch.randint(0, 1000, (prompt + n,), generator=g).tolist()
        samples.append(Sample(ids[:prompt], ids[prompt:]))
        rows = torch.randn(prompt + n - p, args.width, generator=g).to(dtype)
        on_host = args.host_every and i % args.host_every == 0
        own.append(rows.pin_memory() if on_host and device.type == "cuda" else
                   rows if on_host else rows.to(device))
        of.append(i % 2)
    # every row stays where it was put: a reserve past any device's memory
    return SequenceSet(samples, own, device, prefixes, reserve_bytes=1 << 60, prefix_of=of)


def timed_ms(fn, iters: int, device: torch.device) -> float:
    fn()  # warm the allocator
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return 1e3 * (time.perf_counter() - start) / iters


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    data = sequences(args, device)
    g = torch.Generator().manual_seed(1)
    draws = [torch.randint(len(data), (args.batch,), generator=g).tolist()
             for _ in range(args.iters)]
    for index in draws[:4]:
        new, old = data.batch(index, args.bucket), reference_batch(data, index, args.bucket)
        for name in ("aux", "ids", "prompt_lens", "lens", "rows"):
            if not torch.equal(getattr(new, name), getattr(old, name)):
                raise SystemExit(f"bench_batch_gather: {name} differs from the reference")
    it = iter(range(10**9))
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "config": {k: getattr(args, k) for k in SMOKE},
              "one_cat_ms": timed_ms(lambda: data.batch(draws[next(it) % len(draws)],
                                                        args.bucket), args.iters, device),
              "reference_ms": timed_ms(lambda: reference_batch(
                  data, draws[next(it) % len(draws)], args.bucket), args.iters, device)}
    report["speedup"] = round(report["reference_ms"] / report["one_cat_ms"], 3)
    return report


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sequences", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=5 * 1536, help="K * H columns")
    p.add_argument("--prefix", type=int, default=800, help="the shared prefix's rows")
    p.add_argument("--min-len", type=int, default=120)
    p.add_argument("--max-len", type=int, default=1100)
    p.add_argument("--bucket", type=int, default=256)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--host-every", type=int, default=0,
                   help="every Nth sequence's rows in pinned host memory (0: none)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    p.add_argument("--out", help="the report as JSON")
    args = p.parse_args(argv)
    if args.smoke:
        for k, v in SMOKE.items():
            setattr(args, k, v)
        args.device = "cpu"
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

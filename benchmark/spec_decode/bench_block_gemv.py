"""Block GEMV candidate vs cuBLAS at the few-row projections of a verify step (Qwen2.5-1.5B).

    python benchmark/spec_decode/bench_block_gemv.py --rows 16 8 32 \
        --configs 16:256:1:4:1:1 16:128:2:4:3:0 32:256:4:4:1:1 64:128:1:4:3:1 --out bg.json
    python benchmark/spec_decode/bench_block_gemv.py --smoke   # CPU interpreter, shrunk shapes

A bs-1 verify (16 tokens) and the draft's block forward run every projection at 16 rows: qkv
1536 -> 2048 with bias, o 1536 -> 1536, gate_up 1536 -> 17920, down 8960 -> 1536, the LM head
1536 -> 151936, and the draft's fc 5 x 1536 -> 1536. For each shape and row count (16; 8 and 32
for reference), us per call of:
- `cublas`: `F.linear` (with the bias where the layer has one); `torch_path`: the unfused
  add + RMSNorm kernel, then `F.linear` (the projections that follow a norm);
- `block`: the candidate at its table's tiles, plain; `block_fused`: with the norm (+ residual
  add) and bias fused where the layer has them;
- with `--configs`, the candidate at each of those tiles, `BLOCK_N:BLOCK_K:SPLIT_K:warps:
  stages:prefetch` (`block...` and `block_fused...`);
- `ceiling_us`: the bytes the call reads and writes at the device-to-device copy bandwidth
  measured in the same run (`step_bandwidth.copy_bandwidth`).
Timing, weight copies beyond the L2 and the fp32 checks are `bench_gemv.py`'s (`time_us`,
`Case`): each call inside a CUDA graph of calls over distinct weight copies, every variant's
output checked against an fp32 reference before it is timed. `--smoke` runs Triton's
interpreter on the CPU over shapes shrunk 32x at 2 and 16 rows (wall-clock: a smoke test).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

SMOKE_SHRINK = 32  # N and K divided by this under --smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=None,
                   help="projections to time (default: all of them)")
    p.add_argument("--rows", type=int, nargs="+", default=[16, 8, 32])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--configs", nargs="*", default=[],
                   help="also time the candidate at these tiles, each "
                        "BLOCK_N:BLOCK_K:SPLIT_K:warps:stages:prefetch (e.g. 32:256:4:4:1:1)")
    p.add_argument("--smoke", action="store_true",
                   help=f"Triton's interpreter on the CPU: fp32 (its bf16 is broken), shapes "
                        f"shrunk {SMOKE_SHRINK}x, 2 and 16 rows, one iteration")
    p.add_argument("--out", default="benchmark/spec_decode/block_gemv.json")
    args = p.parse_args()
    args.device, args.dtype, args.shrink = (("cpu", "float32", SMOKE_SHRINK) if args.smoke
                                            else ("cuda", "bfloat16", 1))
    if args.smoke:
        args.iters, args.rows = 1, [2, 16]
    return args


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.smoke:
    os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit definition

import bench_gemv  # noqa: E402 (script folder on sys.path)
import torch  # noqa: E402
from bench_gemv import EPS, Case, time_us  # noqa: E402
from step_bandwidth import copy_bandwidth  # noqa: E402

from sglang_aux.srt.layers.triton_ops.block_gemv import (  # noqa: E402
    BlockGemvConfig,
    block_gemv,
    block_gemv_config,
)

DRAFT_FC_INPUTS = 5  # target layers whose hidden states the draft's fc projects
# bench_gemv's projections and the draft's fc; `Case` reads its shapes from bench_gemv.SHAPES.
SHAPES = bench_gemv.SHAPES | {"draft_fc": (1536, DRAFT_FC_INPUTS * 1536, False, None)}
bench_gemv.SHAPES = SHAPES


def parse_config(spec: str) -> BlockGemvConfig:
    """`BLOCK_N:BLOCK_K:SPLIT_K:warps:stages:prefetch` -> its config."""
    bn, bk, split, warps, stages, prefetch = map(int, spec.split(":"))
    return BlockGemvConfig(bn, bk, split, warps, stages, bool(prefetch))


class BlockCase(Case):
    """A projection at m rows, with the candidate beside `Case`'s cuBLAS and torch paths."""

    def block(self, i: int, cfg: BlockGemvConfig | None = None) -> torch.Tensor:
        return block_gemv(self.x, self.weights[i], self.bias, config=cfg)

    def block_fused(self, i: int, cfg: BlockGemvConfig | None = None) -> torch.Tensor:
        return block_gemv(self.x, self.weights[i], self.bias, norm_weight=self.norm.weight,
                          eps=EPS, residual=self.residual, config=cfg)[0]


def _variants(case: BlockCase, specs: list[str]) -> dict:
    """label -> (fn(i), fused) of every timed call at this case."""
    timed = {"cublas": (case.cublas, False), "block": (case.block, False)}
    if case.fused:
        timed |= {"torch_path": (case.torch_path, True), "block_fused": (case.block_fused, True)}
    for spec in specs:
        cfg = parse_config(spec)
        timed[f"block{spec}"] = (lambda i, c=case, g=cfg: c.block(i, g), False)
        if case.fused:
            timed[f"block_fused{spec}"] = (lambda i, c=case, g=cfg: c.block_fused(i, g), True)
    return timed


@torch.inference_mode()
def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    copy_b_s = copy_bandwidth(device, **({} if device.type == "cuda" else
                                         {"nbytes": 64 << 20, "iters": 3}))
    rows = []
    for seed, name in enumerate(args.shapes or list(SHAPES)):
        for m in args.rows:
            torch.manual_seed(seed)
            case = BlockCase(name, m, dtype, device, args.shrink)
            row = {"shape": name, "m": m, "n": case.n, "k": case.k, "copies": case.copies,
                   "config": dataclasses.asdict(block_gemv_config(case.n, case.k)),
                   "ceiling_us": case.bytes_read(False) / copy_b_s * 1e6}
            if case.fused:
                row["ceiling_fused_us"] = case.bytes_read(True) / copy_b_s * 1e6
            for label, (fn, fused) in _variants(case, args.configs).items():
                if label != "cublas" and label != "torch_path":
                    row[f"max_err_{label}"] = case.max_err(fused, fn)
                us = time_us(fn, case.copies, args.iters, device)
                tb_s = case.bytes_read(fused) / us / 1e6
                row[label] = {"us": us, "tb_s": tb_s, "frac_copy": tb_s * 1e12 / copy_b_s}
            rows.append(row)
            del case
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "copy_tb_s": copy_b_s / 1e12, "args": vars(args), "rows": rows}


COLUMNS = ("cublas", "block", "torch_path", "block_fused")


def print_table(result: dict) -> None:
    print(f"{result['device']}: copy {result['copy_tb_s']:.3f} TB/s; us per call (fraction "
          "of the copy bandwidth); the fastest candidate variant last")
    print(" ".join([f"{'shape':8}", f"{'M':>3}", f"{'ceiling':>8}",
                    *(f"{c:>15}" for c in COLUMNS)]))
    for r in result["rows"]:
        cells = [f"{r[c]['us']:8.2f} ({r[c]['frac_copy']:4.2f})" if c in r else "" for c in COLUMNS]
        label, us = min(((k, v["us"]) for k, v in r.items()
                         if k.startswith("block") and isinstance(v, dict)), key=lambda kv: kv[1])
        print(" ".join([f"{r['shape']:8}", f"{r['m']:>3}", f"{r['ceiling_us']:8.2f}",
                        *(f"{c:>15}" for c in cells), f"{label} {us:.2f}"]))


def main(args: argparse.Namespace) -> None:
    unknown = set(args.shapes or ()) - set(SHAPES)
    if unknown:
        raise SystemExit(f"unknown shapes {sorted(unknown)}; choose from {list(SHAPES)}")
    result = run(args)
    print_table(result)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(ARGS)

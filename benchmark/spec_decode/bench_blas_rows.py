"""cuBLAS against cuBLASLt (and optionally Inductor's autotuned GEMMs) at the verify step's
row counts, Qwen2.5-Coder-1.5B's projection shapes (issue 38 item 4: a 16-token verify).

    python benchmark/spec_decode/bench_blas_rows.py --rows 1 16 64 224 --out blas_rows.json
    python benchmark/spec_decode/bench_blas_rows.py --device cpu --iters 2     # smoke

A verify step's kernel table (docs/benchmarks.md section 9m) shows cuBLASLt's kernels at 16
rows reading the MLP at 2.0-2.4 TB/s and the small projections (qkv, o) at about 1 TB/s on an
H100 that copies at 2.95. torch picks the library per process
(`torch.backends.cuda.preferred_blas_library`), and the choice is read when a GEMM launches,
so a CUDA graph keeps the kernels of the library set while it was captured. For each shape
and row count, us per `F.linear` (with the bias where the layer has one) under each library,
timed as `bench_gemv.time_us` times (a CUDA graph over weight copies that spill the L2, so
every call reads HBM), with the achieved TB/s against the copy rate measured in the same
run; `--autotune` adds `torch.compile(mode="max-autotune-no-cudagraphs")`'s choice.
Every variant's output is checked against the first's before it is timed. Off CUDA the
libraries do not apply: one `default` row each, wall-clock (a smoke test, not a
measurement).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_gemv import SHAPES, time_us  # the script folder is on sys.path
from step_bandwidth import copy_bandwidth
from torch.nn import functional as F

LIBRARIES = ("cublas", "cublaslt")
L2_FLUSH_BYTES = 256 << 20


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16, 32, 64, 128, 224])
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--autotune", action="store_true",
                   help="also Inductor's max-autotune choice (compiles: minutes)")
    p.add_argument("--out", default="benchmark/spec_decode/blas_rows.json")
    args = p.parse_args(argv)
    if min(args.rows) < 1 or args.iters < 1:
        p.error(f"--rows and --iters must be >= 1, got {args.rows}, {args.iters}")
    return args


def _variants(device: torch.device, autotune: bool) -> list[str]:
    if device.type != "cuda":
        return ["default"]
    return [*LIBRARIES, *(["autotune"] if autotune else [])]


def _linear(variant: str):
    if variant == "autotune":
        return torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    return F.linear


def measure(name: str, m: int, variants: list[str], iters: int,
            device: torch.device) -> dict:
    """us and TB/s of each variant at one shape and row count."""
    n, k, bias, _ = SHAPES[name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        n, k = max(16, n // 32), max(16, k // 32)
    w_bytes = n * k * torch.tensor([], dtype=dtype).element_size()
    copies = -(-L2_FLUSH_BYTES // w_bytes) if device.type == "cuda" else 1
    gen = torch.Generator(device="cpu").manual_seed(0)
    weights = [(torch.randn(n, k, generator=gen) * k ** -0.5).to(device, dtype)
               for _ in range(copies)]
    b = torch.randn(n, generator=gen).to(device, dtype) if bias else None
    x = torch.randn(m, k, generator=gen).to(device, dtype)
    nbytes = w_bytes + x.numel() * x.element_size() + m * n * x.element_size() + (
        b.numel() * b.element_size() if b is not None else 0)
    row = {"shape": name, "rows": m, "n": n, "k": k, "bytes": nbytes}
    want = None
    previous = torch.backends.cuda.preferred_blas_library() if device.type == "cuda" else None
    try:
        for variant in variants:
            if variant in LIBRARIES:
                torch.backends.cuda.preferred_blas_library(variant)
            linear = _linear(variant)
            got = linear(x, weights[0], b).float()
            if want is None:
                want = got
            else:
                err = (got - want).abs().max().item()
                scale = want.abs().max().item() + 1e-6
                if err > 2e-2 * scale:
                    raise AssertionError(f"{name} rows {m}: {variant} differs from "
                                         f"{variants[0]} by {err} (scale {scale})")
            us = time_us(lambda i, f=linear: f(x, weights[i], b), copies, iters, device)
            row[variant] = {"us": us, "tb_s": nbytes / us / 1e6}
    finally:
        if previous is not None:
            torch.backends.cuda.preferred_blas_library(previous)
    return row


def main(argv: list[str] | None = None) -> dict:
    args = _args(argv)
    device = torch.device(args.device)
    variants = _variants(device, args.autotune)
    copy = copy_bandwidth(device, **({} if device.type == "cuda" else {"nbytes": 1 << 20}))
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "copy_tb_s": copy / 1e12, "variants": variants, "rows": []}
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s; us (TB/s) per call")
    print(f"{'shape':>8} {'rows':>5} " + " ".join(f"{v:>18}" for v in variants))
    for name in args.shapes:
        for m in args.rows:
            row = measure(name, m, variants, args.iters, device)
            report["rows"].append(row)
            print(f"{name:>8} {m:>5} " + " ".join(
                f"{row[v]['us']:>9.1f} ({row[v]['tb_s']:4.2f})" for v in variants), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where the chunked-cuBLAS MXFP8 GEMM's time goes, on the H200, in interleaved rounds.

    python benchmark/aux_memory/bench_chunked_gemm_floor.py --out chunked_gemm_floor.json

Shape M x N x K (default the K3 prefill fc: 4096 x 7168 x 43008, six H = 7168 slices). Each
round times every row once (CUDA events over `--iters` calls) and the table gives the median
over `--rounds` rounds with the spread, so clock drift falls on all rows alike:
- one cuBLAS BF16 GEMM over all of K, bf16 and fp32 out (the speed to reach);
- the K-chunk chain alone: K/H cuBLAS calls on BF16 operands, fp32 accumulator carried through
  memory (`addmm(..., out_dtype=float32)`, beta 1), the GEMM work of `cublas_kc<H>`;
- the same calls column block by column block of the output (N-outer: a 1,792-column
  block's fp32 accumulator, 29 MB at M 4096, fits the 50 MB L2), to keep it on chip;
- the MXFP8 dequantization alone (activation and weight, K/H chunks);
- `chunked_gemm_accumulate` with C = H (the production choice), bf16 and fp32 out.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from sglang_aux.srt.layers.quantization.chunked_cublas_gemm import (
    ChunkConfig,
    chunked_gemm_accumulate,
)
from sglang_aux.srt.layers.quantization.dequant_gemm import dequantize_rows
from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import MXFP8_BLOCK


def chain(x, w, acc, hidden: int, n_block: int = 0) -> None:
    """acc[M, N] = sum over H-wide K chunks of x_c @ w_c^T, fp32 through memory, in K order
    for every output element; `n_block`: output columns per call (0: all)."""
    n = w.shape[0]
    nb = n_block or n
    for n0 in range(0, n, nb):
        dst, rows = acc[:, n0:n0 + nb], slice(n0, n0 + nb)
        for k0 in range(0, x.shape[1], hidden):
            cols = slice(k0, k0 + hidden)
            if k0 == 0:
                torch.mm(x[:, cols], w[rows, cols].T, out_dtype=torch.float32, out=dst)
            else:
                torch.addmm(dst, x[:, cols], w[rows, cols].T, out_dtype=torch.float32, out=dst)


def dequantize_chunks(xq, xs, wq, ws, a, b, hidden: int) -> None:
    for k0 in range(0, xq.shape[1], hidden):
        cols = slice(k0, k0 + hidden)
        groups = slice(k0 // MXFP8_BLOCK, (k0 + hidden) // MXFP8_BLOCK)
        dequantize_rows(xq[:, cols], xs[:, groups], a)
        dequantize_rows(wq[:, cols], ws[:, groups], b)


def rows(m: int, n: int, k: int, hidden: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    (xq, xs), (wq, ws) = quantize_mxfp8(x), quantize_mxfp8(w)
    acc = torch.empty(m, n, device="cuda")
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    a = torch.empty(m, hidden, device="cuda", dtype=torch.bfloat16)
    b = torch.empty(n, hidden, device="cuda", dtype=torch.bfloat16)
    config = ChunkConfig(hidden)
    return {
        "cuBLAS BF16, all K, bf16 out": lambda: torch.mm(x, w.T, out=out),
        "cuBLAS BF16, all K, fp32 out": lambda: torch.mm(x, w.T, out_dtype=torch.float32,
                                                         out=acc),
        f"K-chunk chain alone ({k // hidden} calls)": lambda: chain(x, w, acc, hidden),
        "K-chunk chain, N-outer 3584": lambda: chain(x, w, acc, hidden, 3584),
        "K-chunk chain, N-outer 1792": lambda: chain(x, w, acc, hidden, 1792),
        "MXFP8 dequantization alone": lambda: dequantize_chunks(xq, xs, wq, ws, a, b, hidden),
        f"{config.name}, bf16 out": lambda: chunked_gemm_accumulate(xq, xs, (wq, ws), out,
                                                                    None, config),
        f"{config.name}, fp32 out": lambda: chunked_gemm_accumulate(xq, xs, (wq, ws), acc,
                                                                    None, config),
    }


def time_once(fn, iters: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--hidden", type=int, default=7168, help="aux slice width H = chunk C")
    p.add_argument("--num-slices", type=int, default=6)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default="benchmark/aux_memory/chunked_gemm_floor.json")
    args = p.parse_args()
    k = args.hidden * args.num_slices
    fns = rows(args.m, args.n, k, args.hidden)
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            times[name].append(time_once(fn, args.iters))
    flops = 2 * args.m * args.n * k
    report = {"args": vars(args), "rows": {
        name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
               "tflops": flops / statistics.median(t) / 1e9, "rounds_ms": t}
        for name, t in times.items()}}
    base = report["rows"]["cuBLAS BF16, all K, bf16 out"]["median_ms"]
    print(f"{'row':40s} {'ms':>7s} {'spread':>13s} {'TFLOP/s':>8s} {'vs BF16':>8s}")
    for name, r in report["rows"].items():
        spread = f"{r['min_ms']:.3f}-{r['max_ms']:.3f}"
        print(f"{name:40s} {r['median_ms']:7.3f} {spread:>13s} {r['tflops']:8.0f} "
              f"{r['median_ms'] / base:8.2f}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

"""Draft-fc GEMM on the H200: cuBLAS BF16 / FP8 per-tensor against our MXFP8 and BF16 kernels.

    python benchmark/aux_memory/bench_mxfp8_gemm.py --out mxfp8_gemm.json     # ~1-2 min

Shape M x N x K (default the K3 prefill fc: 4096 x 7168 x 43008, i.e. six 7168-wide slices).
Rows: cuBLAS BF16 (`torch.mm`), cuBLAS FP8 per-tensor (`torch._scaled_mm`, the FP8 ceiling),
ours MXFP8 "bf16_dequant" (the seed's kernel: tiles dequantized to BF16), ours MXFP8 FP8-dot
(per-group scaled FP8 tensor-core dots) for every candidate tile config, ours dense BF16 for
every candidate, and the streamed form of both (one call per slice, fp32 accumulator through
memory). Inputs are fresh random every run; each output is poisoned (NaN) before it is timed
and then checked against a float64 reference of the exact dequantized operands on a row sample.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from triton.testing import do_bench

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag
from sglang_aux.srt.layers.quantization.mxfp8 import dequantize_mxfp8, mxfp8_gemm, quantize_mxfp8

BF16_DENSE_FLOPS = 790e12  # H200 dense BF16; FP8 is twice that
E4M3_MAX = 448.0
CHECK_ROWS = 256
# Relative to sum |a||b|: Hopper's FP8 MMA keeps ~14 bits while summing a k32 group.
FP8_MMA_SLACK = 2.0**-9


def check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor,
          group_slack: float) -> dict:
    """|out - a@b^T| against fp32-accumulation (+ per-group MMA) error plus bf16 rounding, on
    `rows` of `out`; `a`, `b` the exact operands in float64."""
    ref = a[rows] @ b.T
    mag = a[rows].abs() @ b.abs().T
    bound = (2 * a.shape[1] * 2.0**-24 + group_slack) * mag + 2.0**-8 * ref.abs()
    err = (out[rows].double() - ref).abs()
    return {"ok": bool((err <= bound).all()), "worst_err_over_bound": (err / bound).max().item(),
            "max_rel_err": (err.max() / ref.abs().max()).item()}


def timed(fn, out: torch.Tensor) -> float:
    out.fill_(float("nan"))
    fn()  # compile / warm up, then time; the checked output is the last timed run's
    out.fill_(float("nan"))
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def bench(m: int, n: int, num_slices: int, hidden: int, seed: int) -> list[dict]:
    k = num_slices * hidden
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
    rows = torch.randperm(m, device="cuda", generator=gen)[:CHECK_ROWS]
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    acc = torch.empty(m, n, device="cuda", dtype=torch.float32)
    flops = 2 * m * n * k
    results = []

    def record(name: str, fn, result: torch.Tensor, a, b, slack: float, **info) -> None:
        try:
            ms = timed(fn, result)
            row = {"kernel": name, "ms": ms, "tflops": flops / ms / 1e9,
                   "check": check(result, a, b, rows, slack), **info}
        except Exception as e:  # a candidate config may not compile or fit: report it
            row = {"kernel": name, "error": f"{type(e).__name__}: {e}"[:300], **info}
        results.append(row)

    xd, wd = x.double(), w.double()
    record("cublas_bf16", lambda: torch.mm(x, w.T, out=out), out, xd, wd, 0.0)
    for name, cfg in ag.DENSE_CANDIDATES.items():
        record(f"ours_bf16[{name}]", lambda c=cfg: ag.dense_gemm_accumulate(x, w, acc, config=c),
               acc, xd, wd, 0.0)

    def dense_streamed() -> None:
        for i in range(num_slices):
            cols = slice(i * hidden, (i + 1) * hidden)
            ag.dense_gemm_accumulate(x[:, cols], w[:, cols], acc, None if i == 0 else acc)

    record("ours_bf16_streamed[default]", dense_streamed, acc, xd, wd, 0.0)
    del xd, wd

    # cuBLAS FP8 per-tensor: one scale per operand, the layout _scaled_mm wants (b column-major).
    sx, sw = x.abs().amax().float() / E4M3_MAX, w.abs().amax().float() / E4M3_MAX
    x8, w8 = (x / sx).to(torch.float8_e4m3fn), (w / sw).to(torch.float8_e4m3fn)
    a8, b8 = x8.double() * sx.double(), w8.double() * sw.double()
    def scaled_mm(fast: bool, **kw) -> torch.Tensor:
        return torch._scaled_mm(x8, w8.T, scale_a=sx, scale_b=sw, out_dtype=torch.bfloat16,
                                use_fast_accum=fast, **kw)

    for fast in (False, True):
        try:
            scaled_mm(fast, out=out)
            fn = lambda f=fast: scaled_mm(f, out=out)  # noqa: E731
        except (TypeError, RuntimeError):  # no out= overload: one extra bf16 copy
            fn = lambda f=fast: out.copy_(scaled_mm(f))  # noqa: E731
        record(f"cublas_fp8_per_tensor[fast_accum={fast}]", fn, out, a8, b8, FP8_MMA_SLACK)
    del a8, b8

    xq, xs = quantize_mxfp8(x)
    wq, ws = quantize_mxfp8(w)
    a, b = dequantize_mxfp8(xq, xs).double(), dequantize_mxfp8(wq, ws).double()
    record("ours_mxfp8_bf16_dequant[autotuned]",
           lambda: mxfp8_gemm(xq, xs, wq, ws, out, kernel="bf16_dequant"), out, a, b, 0.0)
    for name, cfg in ag.MXFP8_CANDIDATES.items():
        record(f"ours_mxfp8_fp8_dot[{name}]",
               lambda c=cfg: ag.mxfp8_gemm_accumulate(xq, xs, wq, ws, out, config=c),
               out, a, b, FP8_MMA_SLACK, default=cfg == ag.default_config(m, mxfp8=True))
    parts = [quantize_mxfp8(x[:, i * hidden:(i + 1) * hidden]) for i in range(num_slices)]
    g = hidden // 32

    def mxfp8_streamed() -> None:
        for i, (pq, ps) in enumerate(parts):
            ag.mxfp8_gemm_accumulate(pq, ps, wq[:, i * hidden:(i + 1) * hidden],
                                     ws[:, i * g:(i + 1) * g], acc, None if i == 0 else acc)

    record("ours_mxfp8_fp8_dot_streamed[default]", mxfp8_streamed, acc, a, b, FP8_MMA_SLACK)
    ref_ms = next(r["ms"] for r in results if r["kernel"] == "cublas_bf16")
    for r in results:
        if "ms" in r:
            r["over_cublas_bf16"] = r["ms"] / ref_ms
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[4096])
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--hidden", type=int, default=7168, help="aux slice width H")
    p.add_argument("--num-slices", type=int, default=6, help="K slices; GEMM K = K * H")
    p.add_argument("--out", default="benchmark/aux_memory/mxfp8_gemm.json")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs CUDA")
    seed = random.SystemRandom().randrange(2**31)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "seed": seed,
              "shapes": []}
    for m in a.m:
        k = a.num_slices * a.hidden
        report["shapes"].append({
            "m": m, "n": a.n, "k": k, "roofline_bf16_ms": 2 * m * a.n * k / BF16_DENSE_FLOPS * 1e3,
            "roofline_fp8_ms": m * a.n * k / BF16_DENSE_FLOPS * 1e3,
            "results": bench(m, a.n, a.num_slices, a.hidden, seed)})
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {a.out} (seed {seed})")
    for s in report["shapes"]:
        print(f"M={s['m']} N={s['n']} K={s['k']}  roofline bf16 {s['roofline_bf16_ms']:.2f} ms, "
              f"fp8 {s['roofline_fp8_ms']:.2f} ms")
        print(f"{'kernel':<44} {'ms':>8} {'TFLOP/s':>8} {'/cuBLAS':>8} {'check':>6} {'err/bnd':>8}")
        for r in s["results"]:
            if "error" in r:
                print(f"{r['kernel']:<44} {r['error'][:60]}")
                continue
            c = r["check"]
            print(f"{r['kernel'] + (' *' if r.get('default') else ''):<44} {r['ms']:>8.3f} "
                  f"{r['tflops']:>8.1f} {r['over_cublas_bf16']:>8.2f} {str(c['ok']):>6} "
                  f"{c['worst_err_over_bound']:>8.3f}")
    print("* = the default config for this M")
    # cuBLAS fast-accum FP8 sums in the MMA's reduced precision over all of K, so it may exceed
    # the per-group bound; only our kernels must meet it.
    bad = [r["kernel"] for s in report["shapes"] for r in s["results"]
           if r["kernel"].startswith("ours") and not r.get("check", {"ok": False})["ok"]]
    if bad:
        raise SystemExit(f"outside the error bound or failed: {bad}")


if __name__ == "__main__":
    main()

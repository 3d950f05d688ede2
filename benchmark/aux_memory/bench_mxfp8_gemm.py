"""Draft-fc GEMM on the H200: cuBLAS BF16 / FP8 per-tensor against every MXFP8 GEMM candidate.

    python benchmark/aux_memory/bench_mxfp8_gemm.py --out mxfp8_gemm.json     # ~3-4 min
    python benchmark/aux_memory/bench_mxfp8_gemm.py --only cublas_ --out c.json   # ~1 min

Shape M x N x K (default the K3 prefill fc: 4096 x 7168 x 43008, i.e. six 7168-wide slices).
Rows: cuBLAS BF16 (`torch.mm`), cuBLAS FP8 per-tensor (`torch._scaled_mm`, the FP8 ceiling),
our dense BF16 kernel (the streamed bf16 path), then MXFP8 activations with each weight format
("mxfp8": MXFP8 fc weight, "bf16": the fc kept in BF16) for every candidate of
`mxfp8_gemm_choice.CANDIDATES` (the concat call, bf16 out). `--only PREFIX...` keeps the
candidates whose names start so, plus today's default, and adds any "cublas_kc<C>..." named
there; those rows (dequantize-then-cuBLAS in K chunks) also give their scratch bytes.
Inputs are fresh random every run; each output is poisoned (NaN) before it is timed and checked
against a float64 reference of the exact dequantized operands on a row sample. For the fastest
passing candidate of each format (and the fastest chunked-cuBLAS one), the staged call (slices
quantized into a retained input), the streamed chain (one call per slice, fp32 accumulator
through memory), the concat call and a second concat call must agree bit for bit; the chain is
timed too. The last lines name the best candidates per format and the one-line change that
makes one the production choice.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from triton.testing import do_bench

from sglang_aux.srt.layers.quantization import accumulating_gemm as ag
from sglang_aux.srt.layers.quantization import chunked_cublas_gemm as cc
from sglang_aux.srt.layers.quantization import mxfp8_gemm_choice as choice
from sglang_aux.srt.layers.quantization.mxfp8 import quantize_mxfp8
from sglang_aux.srt.layers.quantization.mxfp8_format import dequantize_mxfp8
from sglang_aux.srt.layers.quantization.staged_input import allocate_retained_input

BF16_DENSE_FLOPS = 790e12  # H200 dense BF16 as measured here; FP8 is twice that
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
    return do_bench(fn, warmup=25, rep=150, return_mode="median")


def extra_bytes(fn) -> int:
    """Peak bytes one call allocates above what was allocated before it (its scratch)."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


class Bench:
    def __init__(self, m: int, n: int, k: int, rows: torch.Tensor) -> None:
        self.flops, self.rows, self.results = 2 * m * n * k, rows, []

    def record(self, name: str, fn, result: torch.Tensor, a, b, slack: float, **info) -> None:
        try:
            ms = timed(fn, result)
            row = {"kernel": name, "ms": ms, "tflops": self.flops / ms / 1e9,
                   "check": check(result, a, b, self.rows, slack), **info}
        except Exception as e:  # a candidate may not compile or fit: report it, go on
            row = {"kernel": name, "error": f"{type(e).__name__}: {e}"[:300], **info}
        self.results.append(row)


def bitwise_paths(x: torch.Tensor, w, num_slices: int, hidden: int, name: str, acc, out32):
    """Staged, streamed and concat calls of candidate `name`; returns (equal, streamed_fn)."""
    m, h, g = x.shape[0], hidden, hidden // 32
    values, scales = allocate_retained_input(m, x.shape[1], x.device)  # the staged input
    parts = []
    for i in range(num_slices):
        part = x[:, i * h:(i + 1) * h]
        quantize_mxfp8(part, out=(values[:, i * h:(i + 1) * h], scales[:, i * g:(i + 1) * g]))
        parts.append(quantize_mxfp8(part))

    def w_slice(i: int):
        if isinstance(w, tuple):
            return w[0][:, i * h:(i + 1) * h], w[1][:, i * g:(i + 1) * g]
        return w[:, i * h:(i + 1) * h]

    def streamed() -> None:
        for i, (pq, ps) in enumerate(parts):
            choice.mxfp8_gemm_accumulate(pq, ps, w_slice(i), acc, None if i == 0 else acc, name)

    xq, xs = quantize_mxfp8(x)
    results = {}
    for label, (q, s) in (("concat", (xq, xs)), ("concat_again", (xq, xs)),
                          ("staged", (values, scales))):
        out32.fill_(float("nan"))
        choice.mxfp8_gemm_accumulate(q, s, w, out32, candidate=name)
        results[label] = out32.clone()
    acc.fill_(float("nan"))
    streamed()
    equal = {"staged==concat": torch.equal(results["staged"], results["concat"]),
             "concat==concat_again": torch.equal(results["concat_again"], results["concat"]),
             "streamed==concat": torch.equal(acc, results["concat"])}
    return equal, streamed


def bench(m: int, n: int, num_slices: int, hidden: int, seed: int, formats: list[str],
          only: list[str] | None) -> dict:
    k = num_slices * hidden
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
    b = Bench(m, n, k, torch.randperm(m, device="cuda", generator=gen)[:CHECK_ROWS])
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    acc = torch.empty(m, n, device="cuda", dtype=torch.float32)

    xd, wd = x.double(), w.double()
    b.record("cublas_bf16", lambda: torch.mm(x, w.T, out=out), out, xd, wd, 0.0)
    cfg = ag.default_dense_config(m)
    b.record("ours_dense_bf16[default]", lambda: ag.dense_gemm_accumulate(x, w, acc, config=cfg),
             acc, xd, wd, 0.0)
    del xd

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
        b.record(f"cublas_fp8_per_tensor[fast_accum={fast}]", fn, out, a8, b8, FP8_MMA_SLACK)
    del a8, b8

    xq, xs = quantize_mxfp8(x)
    a = dequantize_mxfp8(xq, xs).double()
    weights = {"mxfp8": quantize_mxfp8(w), "bf16": w}
    best = {}
    for fmt in formats:
        wf = weights[fmt]
        bd = dequantize_mxfp8(*wf).double() if fmt == "mxfp8" else wd
        default = choice.choose(m, fmt)
        extra = {o: choice.choose(m, fmt, o) for o in only or [] if cc.parse(o)}
        for name, cand in {**choice.CANDIDATES[fmt], **extra}.items():
            if only and cand != default and not name.startswith(tuple(only)):
                continue
            slack = FP8_MMA_SLACK if cand.kernel == "fp8_dot" else 0.0
            info = {}
            if cand.kernel == "cublas_chunked":
                info["scratch_bytes"] = cc.scratch_bytes(m, n, k, cand.config, fmt == "mxfp8",
                                                         out.dtype == torch.float32)

            def run(c=name, wc=wf) -> None:
                choice.mxfp8_gemm_accumulate(xq, xs, wc, out, candidate=c)

            b.record(f"{fmt}_weight:{name}", run, out, a, bd, slack, weight=fmt,
                     candidate=name, default=cand == default, **info)
            if info and "ms" in b.results[-1]:
                b.results[-1]["measured_extra_bytes"] = extra_bytes(run)
        ok = [r for r in b.results if r.get("weight") == fmt and "candidate" in r
              and r.get("check", {}).get("ok")]
        tops = {"best": min(ok, key=lambda r: r["ms"])} if ok else {}
        chunked = [r for r in ok if r["candidate"].startswith("cublas_")]
        if chunked:
            tops["best_chunked_cublas"] = min(chunked, key=lambda r: r["ms"])
        out32 = torch.empty(m, n, device="cuda", dtype=torch.float32)
        for label, top in tops.items():
            if label != "best" and top is tops["best"]:
                best[f"{fmt}:{label}"] = best[f"{fmt}:best"]
                continue
            name = top["candidate"]
            slack = FP8_MMA_SLACK if choice.choose(m, fmt, name).kernel == "fp8_dot" else 0.0
            equal, streamed = bitwise_paths(x, wf, num_slices, hidden, name, acc, out32)
            b.record(f"{fmt}_weight:{name}:streamed", streamed, acc, a, bd, slack,
                     weight=fmt, streamed_of=name)
            best[f"{fmt}:{label}"] = {"candidate": name, "ms": top["ms"], "bitwise": equal,
                                      **({"scratch_bytes": top["scratch_bytes"]}
                                         if "scratch_bytes" in top else {})}
        del bd, out32
    ref_ms = next(r["ms"] for r in b.results if r["kernel"] == "cublas_bf16")
    for r in b.results:
        if "ms" in r:
            r["over_cublas_bf16"] = r["ms"] / ref_ms
    return {"results": b.results, "best": best}


def print_table(report: dict) -> None:
    for s in report["shapes"]:
        print(f"M={s['m']} N={s['n']} K={s['k']}  roofline bf16 {s['roofline_bf16_ms']:.2f} ms, "
              f"fp8 {s['roofline_fp8_ms']:.2f} ms")
        print(f"{'kernel':<52} {'ms':>8} {'TFLOP/s':>8} {'/cuBLAS':>8} {'check':>6} {'err/bnd':>8}"
              f" {'scratch MiB':>11}")
        for r in s["results"]:
            if "error" in r:
                print(f"{r['kernel'] + (' *' if r.get('default') else ''):<52} {r['error'][:70]}")
                continue
            c = r["check"]
            print(f"{r['kernel'] + (' *' if r.get('default') else ''):<52} {r['ms']:>8.3f} "
                  f"{r['tflops']:>8.1f} {r['over_cublas_bf16']:>8.2f} {str(c['ok']):>6} "
                  f"{c['worst_err_over_bound']:>8.3f} "
                  + (f"{r['scratch_bytes'] / 2**20:>11.1f}" if "scratch_bytes" in r else ""))
        print("* = today's production choice for this M")
        for key, top in s["best"].items():
            fmt, label = key.split(":")
            scratch = (f", scratch {top['scratch_bytes'] / 2**20:.1f} MiB"
                       if "scratch_bytes" in top else "")
            print(f"{label} {fmt} weight: {top['candidate']} {top['ms']:.3f} ms{scratch}, "
                  f"bitwise {top['bitwise']}; to make it the default: mxfp8_gemm_choice."
                  f"LARGE_M_CHOICE[{fmt!r}] = {top['candidate']!r}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, nargs="+", default=[4096])
    p.add_argument("--n", type=int, default=7168)
    p.add_argument("--hidden", type=int, default=7168, help="aux slice width H")
    p.add_argument("--num-slices", type=int, default=6, help="K slices; GEMM K = K * H")
    p.add_argument("--weights", nargs="+", default=["mxfp8", "bf16"], choices=["mxfp8", "bf16"])
    p.add_argument("--only", nargs="+", metavar="PREFIX",
                   help="time only candidates whose names start so (and today's default)")
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
            **bench(m, a.n, a.num_slices, a.hidden, seed, a.weights, a.only)})
        with open(a.out, "w") as f:  # after every shape: a later failure keeps the numbers
            json.dump(report, f, indent=2)
    print(f"wrote {a.out} (seed {seed})")
    print_table(report)
    # cuBLAS fast-accum FP8 sums in the MMA's reduced precision over all of K, so it may exceed
    # the per-group bound; only our kernels must meet it, and the best must be bitwise.
    bad = [r["kernel"] for s in report["shapes"] for r in s["results"]
           if not r["kernel"].startswith("cublas") and "error" not in r and not r["check"]["ok"]]
    bad += [f"{key}: {t['bitwise']}" for s in report["shapes"] for key, t in s["best"].items()
            if not all(t["bitwise"].values())]
    if bad:
        raise SystemExit(f"outside the error bound or not bitwise: {bad}")


if __name__ == "__main__":
    main()

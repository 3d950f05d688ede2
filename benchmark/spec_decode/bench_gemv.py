"""Decode GEMV kernel vs cuBLAS at the Qwen2.5-Coder-1.5B projection shapes, one row.

    python benchmark/spec_decode/bench_gemv.py --iters 100 --row-configs 2:1024:4:1 \
        4:512:4:3 8:1024:8:1 --out gemv.json
    python benchmark/spec_decode/bench_gemv.py --device cpu --iters 2   # smoke (interpreter)

For each projection (qkv 1536 -> 2048 with bias, o 1536 -> 1536, gate_up 1536 -> 17920,
down 8960 -> 1536, LM head 1536 -> 151936) and row count, us per call of:
- `cublas`: `F.linear` (with the bias where the layer has one);
- `torch_path`: the unfused layers the fused kernel replaces (add + RMSNorm kernel, then
  F.linear); the plain projections have none;
- `ours`: the row GEMV at its table's tiles, plain; `ours_fused`: with the norm (+ residual
  add) and bias fused where the layer has them (the SiLU-mul stays its own launch);
- with `--row-configs`, the row GEMV at each of those tiles, plain (`row...`) and with the
  norm fused (`row_fused...`);
- candidates (docs/kernels.md, none a default): at qkv, `rope_default` (the fused norm + qkv,
  then RoPE + KV store: today's two launches) against `rope_paired` (one kernel,
  `paired_row_gemv.row_gemv_rope_store`); at gate_up, `silu_default` (fused norm + gate_up,
  then SiLU-mul) against `silu_paired` (`row_gemv_silu_mul`); `max_err_paired` is the largest
  difference between the two (0 where they agree exactly); with `--pdl` (CUDA), every row
  also as `<row>_pdl`, launched dependent (programmatic dependent launch).
Each is timed inside a CUDA graph that calls it once on each of several weight copies (more
bytes than the L2 holds, so every call reads HBM, as a decode step's layers do), replayed
`--iters` times between CUDA events, after warm-up. Achieved TB/s counts the weight, bias,
input and output bytes; the copy ceiling is `step_bandwidth.copy_bandwidth`, measured in the
same run. Every variant's output is checked against an fp32 reference before it is timed.
Off CUDA (`--device cpu`) Triton's interpreter runs the kernel on shapes shrunk by
`--shrink` (wall-clock timings: a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time

# the shapes with a paired-GEMV candidate: its rows' prefix
PAIRED = {"qkv": "rope", "gate_up": "silu"}
# the rows that take `pdl` (ours: cuBLAS and the torch layers do not)
PDL_ROWS = ("ours", "ours_fused", "rope_default", "rope_paired", "silu_default",
            "silu_paired")
SHAPES = {  # name: (N, K, bias, fused variant)
    "qkv": (2048, 1536, True, "norm"),
    "o_proj": (1536, 1536, False, None),
    "gate_up": (17920, 1536, False, "norm"),
    "down": (1536, 8960, False, None),
    "lm_head": (151936, 1536, False, None),
}
L2_FLUSH_BYTES = 256 << 20  # several times the H200's 50 MB L2
EPS = 1e-6
# Qwen2.5-1.5B's attention heads (q, kv) and head_dim; rope base, a decode position, the slot
QWEN_HEADS, QWEN_HEAD_DIM, ROPE_THETA, POSITION, SLOT = (12, 2), 128, 1e6, 900, 3


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default: bfloat16 on CUDA, float32 elsewhere (the interpreter's bf16 "
                        "is broken)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--splits", type=int, nargs="*", default=[],
                   help="also time the plain kernel at these forced split-K values")
    p.add_argument("--row-configs", nargs="*", default=[],
                   help="also time the row GEMV at these tiles, each "
                        "BLOCK_N:BLOCK_K:warps:stages (e.g. 8:512:4:1)")
    p.add_argument("--pdl", action="store_true",
                   help="also time every variant launched dependent (sm_90+)")
    p.add_argument("--shrink", type=int, default=None,
                   help="divide N and K by this (default: 1 on CUDA, 32 elsewhere)")
    p.add_argument("--out", default="benchmark/spec_decode/gemv.json")
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    if args.shrink is None:
        args.shrink = 1 if cuda else 32
    if args.dtype is None:
        args.dtype = "bfloat16" if cuda else "float32"
    return args


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None and not ARGS.device.startswith("cuda"):
    os.environ["TRITON_INTERPRET"] = "1"  # before any @triton.jit definition

import torch  # noqa: E402
from step_bandwidth import copy_bandwidth  # noqa: E402 (script folder on sys.path)
from torch.nn import functional as F  # noqa: E402

from sglang_aux.srt.layers.layernorm import RMSNorm  # noqa: E402
from sglang_aux.srt.layers.rope_scaling import RopeScaling  # noqa: E402
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang_aux.srt.layers.triton_ops.paired_row_gemv import (  # noqa: E402
    row_gemv_rope_store,
    row_gemv_silu_mul,
)
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store  # noqa: E402
from sglang_aux.srt.layers.triton_ops.row_gemv import (  # noqa: E402
    RowGemvConfig,
    row_gemv,
    row_gemv_config,
)
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul  # noqa: E402


def _nbytes(*ts: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def time_us(fn, calls: int, iters: int, device: torch.device) -> float:
    """us per call of `fn(i)` for i in range(calls), graph-captured on CUDA."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iters):
            for i in range(calls):
                fn(i)
        return (time.perf_counter() - t0) / (iters * calls) * 1e6
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            for i in range(calls):
                fn(i)
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * calls)


class Case:
    """One projection's weights (copies enough to spill the L2), norm and inputs at m rows."""

    def __init__(self, name: str, m: int, dtype: torch.dtype, device: torch.device,
                 shrink: int):
        n, k, bias, self.fused = SHAPES[name]
        self.n, self.k = max(16, n // shrink), max(16, k // shrink)
        self.n -= self.n % 2
        self.m, self.name = m, name
        w_bytes = self.n * self.k * torch.tensor([], dtype=dtype).element_size()
        copies = max(1, math.ceil(L2_FLUSH_BYTES / w_bytes)) if device.type == "cuda" else 1
        scale = self.k ** -0.5
        self.weights = [(torch.randn(self.n, self.k, device=device) * scale).to(dtype)
                        for _ in range(copies)]
        self.bias = torch.randn(self.n, device=device).to(dtype) if bias else None
        self.norm = RMSNorm(self.k, EPS).to(device=device, dtype=dtype)
        self.norm.weight.data.normal_()
        self.x = torch.randn(m, self.k, device=device).to(dtype)
        self.residual = torch.randn(m, self.k, device=device).to(dtype)
        if name == "qkv":
            self.head_dim = max(2, QWEN_HEAD_DIM // shrink)
            self.rope = RotaryEmbedding(self.head_dim, 2 * POSITION, RopeScaling(
                "default", ROPE_THETA, 2 * POSITION)).to(device)
            self.position = torch.tensor([POSITION], device=device)
            self.loc = torch.tensor([SLOT], device=device)
            # (k, v) caches of the default path and of the paired kernel
            self.caches = [[torch.zeros(SLOT + 1, QWEN_HEADS[1], self.head_dim, device=device,
                                        dtype=dtype) for _ in range(2)] for _ in range(2)]

    @property
    def copies(self) -> int:
        return len(self.weights)

    def cublas(self, i: int) -> torch.Tensor:
        return F.linear(self.x, self.weights[i], self.bias)

    def torch_path(self, i: int) -> torch.Tensor:
        """The layers the fused kernel replaces (the SiLU-mul of gate_up stays after it)."""
        normed, _ = self.norm(self.x, self.residual)
        return F.linear(normed, self.weights[i], self.bias)

    def ours(self, i: int, pdl: bool = False) -> torch.Tensor:
        return row_gemv(self.x, self.weights[i], self.bias, pdl=pdl)

    def ours_fused(self, i: int, pdl: bool = False) -> torch.Tensor:
        return row_gemv(self.x, self.weights[i], self.bias, norm_weight=self.norm.weight,
                        eps=EPS, residual=self.residual, pdl=pdl)[0]

    def rope_default(self, i: int, pdl: bool = False) -> torch.Tensor:
        qkv, _ = row_gemv(self.x, self.weights[i], self.bias, norm_weight=self.norm.weight,
                          eps=EPS, residual=self.residual, pdl=pdl)
        q, k, v = qkv.split([QWEN_HEADS[0] * self.head_dim,
                             QWEN_HEADS[1] * self.head_dim, QWEN_HEADS[1] * self.head_dim], -1)
        k_cache, v_cache = self.caches[0]
        rope_store(self.position, q, k, self.rope.cos_sin_cache, v=v, k_cache=k_cache,
                   v_cache=v_cache, loc=self.loc, pdl=pdl)
        return q

    def rope_paired(self, i: int, pdl: bool = False) -> torch.Tensor:
        k_cache, v_cache = self.caches[1]
        return row_gemv_rope_store(self.x, self.weights[i], self.bias, self.position,
                                   self.rope.cos_sin_cache, k_cache, v_cache, self.loc,
                                   QWEN_HEADS[0], norm_weight=self.norm.weight, eps=EPS,
                                   residual=self.residual, pdl=pdl)[0]

    def silu_default(self, i: int, pdl: bool = False) -> torch.Tensor:
        return silu_and_mul(self.ours_fused(i, pdl), pdl=pdl)

    def silu_paired(self, i: int, pdl: bool = False) -> torch.Tensor:
        return row_gemv_silu_mul(self.x, self.weights[i], norm_weight=self.norm.weight, eps=EPS,
                                 residual=self.residual, pdl=pdl)[0]

    def paired_err(self) -> float:
        """Largest |paired - default| of the outputs (and, at qkv, the KV slots written)."""
        if self.name == "qkv":
            pairs = [(self.rope_paired(0), self.rope_default(0)),
                     *zip(self.caches[1], self.caches[0], strict=True)]
        else:
            pairs = [(self.silu_paired(0), self.silu_default(0))]
        return max((a.float() - b.float()).abs().max().item() for a, b in pairs)

    def row(self, i: int, cfg: RowGemvConfig, pdl: bool = False) -> torch.Tensor:
        return row_gemv(self.x, self.weights[i], self.bias, config=cfg, pdl=pdl)

    def row_fused(self, i: int, cfg: RowGemvConfig, pdl: bool = False) -> torch.Tensor:
        return row_gemv(self.x, self.weights[i], self.bias, norm_weight=self.norm.weight,
                        eps=EPS, residual=self.residual, config=cfg, pdl=pdl)[0]

    def bytes_read(self, fused: bool) -> int:
        extra = _nbytes(self.residual, self.norm.weight) if fused else 0
        return (_nbytes(self.weights[0], self.bias, self.x) + extra
                + self.m * self.n * self.x.element_size())

    def max_err(self, fused: bool, fn=None) -> float:
        """Largest |ours - fp32 reference| of the plain or fused variant (or of `fn(0)`)."""
        w = self.weights[0].float()
        b = None if self.bias is None else self.bias.float()
        if not fused:
            got = (fn or self.ours)(0)
            return (got.float() - F.linear(self.x.float(), w, b)).abs().max().item()
        normed, _ = self.norm.forward_native(self.x, self.residual)
        ref = F.linear(normed.float(), w, b)
        return ((fn or self.ours_fused)(0).float() - ref).abs().max().item()


@torch.inference_mode()  # the layers take their kernels only outside autograd
def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    copy_tb_s = copy_bandwidth(device, **({} if device.type == "cuda" else
                                          {"nbytes": 64 << 20, "iters": 3})) / 1e12
    rows = []
    m = 1
    for seed, name in enumerate(args.shapes):
        torch.manual_seed(seed)
        case = Case(name, m, dtype, device, args.shrink)
        cfg = row_gemv_config(case.n)
        row = {"shape": name, "m": m, "n": case.n, "k": case.k, "copies": case.copies,
               "config": dataclasses.asdict(cfg),
               "max_err": case.max_err(False)}
        timed = {"cublas": (case.cublas, False), "ours": (case.ours, False)}
        if case.fused:
            timed |= {"torch_path": (case.torch_path, True),
                      "ours_fused": (case.ours_fused, True)}
            row["max_err_fused"] = case.max_err(True)
        if name in PAIRED:
            timed |= {f"{PAIRED[name]}_{v}": (getattr(case, f"{PAIRED[name]}_{v}"), True)
                      for v in ("default", "paired")}
            row["max_err_paired"] = case.paired_err()
        if args.pdl:
            timed |= {f"{label}_pdl": (functools.partial(fn, pdl=True), fused)
                      for label, (fn, fused) in timed.items() if label in PDL_ROWS}
        for spec in args.row_configs:
            cfg = RowGemvConfig(*map(int, spec.split(":")))
            # launched as the `ours` rows they are set against: dependent with --pdl
            timed[f"row{spec}"] = (lambda i, c=case, g=cfg: c.row(i, g, args.pdl), False)
            row[f"max_err_row{spec}"] = case.max_err(False, timed[f"row{spec}"][0])
            if case.fused:
                timed[f"row_fused{spec}"] = (
                    lambda i, c=case, g=cfg: c.row_fused(i, g, args.pdl), True)
                row[f"max_err_row_fused{spec}"] = case.max_err(
                    True, timed[f"row_fused{spec}"][0])
        for label, (fn, fused) in timed.items():
            us = time_us(fn, case.copies, args.iters, device)
            tb_s = case.bytes_read(fused) / us / 1e6
            row[label] = {"us": us, "tb_s": tb_s, "frac_copy": tb_s / copy_tb_s}
        rows.append(row)
        del case
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "copy_tb_s": copy_tb_s, "args": vars(args), "rows": rows}


def print_table(result: dict) -> None:
    print(f"device {result['device']}, copy {result['copy_tb_s']:.3f} TB/s; us per call "
          "(fraction of copy bandwidth)")
    print(f"{'shape':8} {'M':>3} {'cublas':>15} {'ours':>15} {'torch_path':>15} "
          f"{'ours_fused':>15} {'max_err':>9}")
    for r in result["rows"]:
        def cell(key, r=r):
            return f"{r[key]['us']:8.2f} ({r[key]['frac_copy']:4.2f})" if key in r else ""
        print(f"{r['shape']:8} {r['m']:>3} {cell('cublas'):>15} {cell('ours'):>15} "
              f"{cell('torch_path'):>15} {cell('ours_fused'):>15} "
              f"{max(r['max_err'], r.get('max_err_fused', 0.0)):9.2e}")
        rows_ = sorted((v["us"], k) for k, v in r.items()
                       if k.startswith("row") and isinstance(v, dict))
        for prefix in ("row", "row_fused"):
            best = [(us, k) for us, k in rows_ if k.rstrip("0123456789:") == prefix]
            if best:
                us, k = best[0]
                err = max([v for kk, v in r.items() if kk.startswith("max_err_")] or [0.0])
                print(f"{'':12} best {k:>22}: {us:8.2f} ({r[k]['frac_copy']:4.2f}) "
                      f"of {len(best)}; worst {best[-1][0]:.2f}; row max_err {err:.2e}")


def print_candidates(result: dict) -> None:
    """Each candidate against the default it would replace, us per call (default / it)."""
    pairs = [("ours", "ours_pdl"), ("ours_fused", "ours_fused_pdl")]
    for prefix in PAIRED.values():
        pairs += [(f"{prefix}_default", f"{prefix}_{v}")
                  for v in ("paired", "default_pdl", "paired_pdl")]
    for r in result["rows"]:
        for base, cand in pairs:
            if base in r and cand in r:
                print(f"{r['shape']:8} {cand:>18} {r[cand]['us']:8.2f} us against {base} "
                      f"{r[base]['us']:8.2f}: {r[base]['us'] / r[cand]['us']:5.2f}x")
        if "max_err_paired" in r:
            print(f"{r['shape']:8} paired vs default max |diff| {r['max_err_paired']:.2e}")


def main(args: argparse.Namespace) -> None:
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print_table(result)
    print_candidates(result)
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main(ARGS)

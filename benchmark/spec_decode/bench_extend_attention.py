"""Extend attention per layer call as a captured prefill or mixed graph runs it: per query head
against GQA-packed programs, at the device's key split and at fixed ones.

    python benchmark/spec_decode/bench_extend_attention.py --out extend_attention.json
    python benchmark/spec_decode/bench_extend_attention.py --smoke   # CPU: the interpreter

Qwen2.5-1.5B's attention (12 q heads over 2 kv heads, head_dim 128, bf16; fp32 on the CPU).
Each case `LIVE:NEW:PREFIX:BUCKET` is a graph's batch: `--slots` request slots (a prefill
graph's width), LIVE of them each appending NEW tokens after PREFIX cached keys in scattered
pool slots, the rest empty, the queries padded to BUCKET rows (the graph's token bucket, which
also sizes the grid). The default cases: the GSM8K harness's arrivals (78 new tokens after an
820-token cached prefix; 1, 2 and 4 of them in the mixed graph's 128 / 256 / 512-token buckets)
and two long prefills. Paths: "per_head" (one program per query head, the device's split:
`extend_attention_fwd(pack_gqa=False)`), "packed" (one per kv head, its rows (token, head): the
default since 2026-12-05), and each at every `--splits` count. Every path is checked first
against a float32 reference (each request's softmax over its prefix and its causal new keys),
its output poisoned with NaN before the call.

Time per layer call, on CUDA: one graph of `--calls` back-to-back calls, each reading its own
layer's K/V, replayed `--iters` times (CUDA events, median), divided by the calls. On the CPU:
the wall time of one interpreted call, a smoke of the harness, not a figure."""

from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    # NOTE: before any @triton.jit definition is imported: the kernels run interpreted.
    os.environ["TRITON_INTERPRET"] = "1"

# this script's folder is on sys.path
from bench_decode_attention import (  # noqa: E402
    QWEN_HEADS,
    add_run_flags,
    finish,
    us_per_call,
)

from sglang_aux.srt.layers.attention.triton_ops.extend_attention import (  # noqa: E402
    extend_attention_fwd,
)

CASES = ["1:78:820:128", "2:78:820:256", "4:78:820:512", "1:2048:0:2048", "4:512:0:2048"]
REL_ERR_BOUND = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# each at the device's split and every --splits count
PATHS = {"per_head": {"pack_gqa": False}, "packed": {}}
SMOKE = dict(cases=["1:5:40:16", "2:7:0:16"], splits=[2], heads=[6, 2, 16], calls=1, iters=1)


class Case:
    """One graph batch's tensors: `slots` request rows, `live` of them extending."""

    def __init__(self, spec: str, slots: int, heads: tuple[int, int, int], calls: int,
                 device: str, dtype: torch.dtype):
        live, new, prefix, bucket = map(int, spec.split(":"))
        if live > slots or live * new > bucket:
            raise ValueError(f"case {spec}: {live} requests of {new} tokens do not fit "
                             f"{slots} slots and a {bucket}-token bucket")
        self.spec, self.live, self.new, self.prefix, self.bucket = spec, live, new, prefix, bucket
        h, kvh, d = heads
        context = prefix + new
        num_slots = live * context + 1
        self.k = [torch.randn(num_slots, kvh, d, device=device, dtype=dtype)
                  for _ in range(calls)]
        self.v = [torch.randn_like(x) for x in self.k]
        self.req_to_token = torch.zeros(slots, max(context, 1), dtype=torch.int32,
                                        device=device)
        scattered = (torch.randperm(num_slots - 1) + 1).to(device)
        for b in range(live):
            self.req_to_token[b] = scattered[b * context:(b + 1) * context]
        as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        self.rows = torch.arange(slots, device=device)
        self.extend = as_i32([new] * live + [0] * (slots - live))
        self.prefix_lens = as_i32([prefix] * live + [0] * (slots - live))
        self.q_start = as_i32([min(b, live) * new for b in range(slots)])
        self.q = torch.randn(bucket, h, d, device=device, dtype=dtype)

    def run(self, out: torch.Tensor, layer: int, splits: int | None, path: dict) -> None:
        extend_attention_fwd(self.q, self.k[layer], self.v[layer], out, self.req_to_token,
                             self.rows, self.q_start, self.prefix_lens, self.extend,
                             self.bucket, self.q.shape[-1] ** -0.5, num_kv_splits=splits,
                             **path)

    def reference(self) -> torch.Tensor:
        """Layer 0's live rows in float32."""
        h, d = self.q.shape[1], self.q.shape[2]
        group = h // self.k[0].shape[1]
        outs = []
        for b in range(self.live):
            keys = self.req_to_token[b, : self.prefix + self.new].long()
            k = self.k[0][keys].float().repeat_interleave(group, 1)  # [S, H, D]
            v = self.v[0][keys].float().repeat_interleave(group, 1)
            q = self.q[b * self.new:(b + 1) * self.new].float()
            scores = torch.einsum("thd,shd->hts", q, k) * d ** -0.5
            pos = self.prefix + torch.arange(self.new, device=q.device)
            visible = torch.arange(k.shape[0], device=q.device)[None, :] <= pos[:, None]
            scores = scores.masked_fill(~visible, float("-inf"))
            outs.append(torch.einsum("hts,shd->thd", scores.softmax(-1), v))
        return torch.cat(outs)


def measure(case: Case, splits: int | None, path: dict, iters: int) -> tuple[float, float]:
    """(us per call, rel err of layer 0's live rows against the float32 reference)."""
    out = torch.full_like(case.q, float("nan"))
    case.run(out, 0, splits, path)
    live = case.live * case.new
    expected = case.reference()
    got = out[:live].float()
    if not torch.isfinite(out).all():
        raise AssertionError(f"{case.spec}: non-finite output")
    err = ((got - expected).abs().max() / expected.abs().max()).item()
    if err > REL_ERR_BOUND[case.q.dtype]:
        raise AssertionError(f"{case.spec}: rel err {err:.2e}")
    calls = len(case.k)

    def all_layers() -> None:
        for layer in range(calls):
            case.run(out, layer, splits, path)

    return us_per_call(all_layers, calls, case.q.device, iters), err


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    heads = tuple(args.heads)
    rows = []
    for spec in args.cases:
        torch.manual_seed(args.seed)
        case = Case(spec, args.slots, heads, args.calls, device, dtype)
        for path, kwargs in PATHS.items():
            for splits in (None, *args.splits):
                us, err = measure(case, splits, kwargs, args.iters)
                name = path + ("" if splits is None else f"@{splits}")
                rows.append(dict(case=spec, path=name, us_per_call=us, rel_err=err))
        del case
        if cuda:
            torch.cuda.empty_cache()
    return dict(device=torch.cuda.get_device_name(0) if cuda else "cpu (interpreter)",
                torch=torch.__version__, dtype=str(dtype), heads=heads, args=vars(args),
                rows=rows)


def table(report: dict) -> str:
    base = {r["case"]: r["us_per_call"] for r in report["rows"] if r["path"] == "per_head"}
    lines = [f"{report['device']}, {report['dtype']}, heads {report['heads']}",
             f"{'case':>16} {'path':<14} {'us/call':>8} {'vs per_head':>11}"]
    for r in report["rows"]:
        lines.append(f"{r['case']:>16} {r['path']:<14} {r['us_per_call']:>8.2f} "
                     f"{base[r['case']] / r['us_per_call']:>10.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", nargs="+", default=CASES, help="LIVE:NEW:PREFIX:BUCKET")
    p.add_argument("--slots", type=int, default=4, help="request slots of the graph")
    p.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 8])
    p.add_argument("--heads", type=int, nargs=3, default=list(QWEN_HEADS),
                   help="q heads, kv heads, head_dim")
    p.add_argument("--calls", type=int, default=28, help="layer calls per graph")
    add_run_flags(p, "benchmark/spec_decode/extend_attention.json")
    return finish(p.parse_args(argv), SMOKE, run, table)


if __name__ == "__main__":
    main(sys.argv[1:])

"""FlashInfer's norm, activation and RoPE kernels beside ours, per layer call (issue 38 item 3:
sgl-kernel's fused norms and activations are FlashInfer's, and sgl-kernel's wheel is built for
another torch than the H200's, so FlashInfer's own build stands in for it).

    python benchmark/spec_decode/bench_flashinfer_elementwise.py --rows 1 8 16 32 512 \
        --out flashinfer_elementwise.json                     # H200, flashinfer importable
    python benchmark/spec_decode/bench_flashinfer_elementwise.py --smoke   # CPU: ours only

At Qwen2.5-1.5B's sizes (hidden 1536, intermediate 8960, 12 / 2 heads of 128), bf16, for
each row count (1, 8, 32: decode batches; 16 and 512: the bs-1 and bs-32 verify):
- `rms_norm`: ours (`triton_ops.rms_norm`) against `flashinfer.norm.rmsnorm`;
- `add_rms_norm`: the residual add fused: ours (out of place: normed and new residual)
  against `flashinfer.norm.fused_add_rmsnorm` (in place);
- `silu_and_mul`: ours against `flashinfer.activation.silu_and_mul`;
- `rope_store`: RoPE on q and k plus the K/V store into the pool: ours in one launch
  (`triton_ops.rope_store`) against `flashinfer.rope.apply_rope_with_cos_sin_cache_inplace`
  and the two slot writes SGLang's `set_kv_buffer` does (`k_cache[loc] = k`).
Each path is checked against an fp32 torch reference first, then timed as `bench_gemv.py` times
(`time_us`: a CUDA graph of `--calls` calls on distinct buffers, one per layer, replayed). The
norms run FlashInfer's CUDA kernels (`FLASHINFER_USE_CUDA_NORM=1`: its CuTe DSL path needs
nvidia-cutlass-dsl). FlashInfer absent or failing to load: one line saying why, and our rows.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    # NOTE: before any @triton.jit definition is imported: the kernels run interpreted.
    os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("FLASHINFER_USE_CUDA_NORM", "1")

from bench_flashinfer_attention import (  # noqa: E402  (script folder on sys.path)
    load_flashinfer,
    run_and_report,
)
from bench_gemv import time_us  # noqa: E402

from sglang_aux.srt.configs.presets import PRESETS  # noqa: E402
from sglang_aux.srt.layers.rope_scaling import RopeScaling  # noqa: E402
from sglang_aux.srt.layers.rotary_embedding import RotaryEmbedding  # noqa: E402
from sglang_aux.srt.layers.triton_ops.rms_norm import rms_norm  # noqa: E402
from sglang_aux.srt.layers.triton_ops.rope_store import rope_store  # noqa: E402
from sglang_aux.srt.layers.triton_ops.silu_and_mul import silu_and_mul  # noqa: E402

QWEN = PRESETS["qwen2.5-1.5b-shaped"]
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = (QWEN[k] for k in (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "head_dim"))
EPS, ROPE_THETA, MAX_POS, SLOTS = QWEN["rms_norm_eps"], QWEN["rope_theta"], 4096, 8192
OPS = ("rms_norm", "add_rms_norm", "silu_and_mul", "rope_store")
SMOKE = dict(rows=[1, 4], calls=2, iters=1)
SMOKE_SIZES = dict(hidden=64, inter=96, heads=4, kv_heads=2, head_dim=16)


class Case:
    """One op at m rows: `calls` distinct inputs (a layer each) for timing, and one more, at
    index `check`, for the check against the reference (in-place paths write their inputs)."""

    def __init__(self, op: str, m: int, calls: int, sizes: dict, device, dtype):
        self.op, self.m, self.sizes, self.check = op, m, sizes, calls
        calls += 1
        hidden, inter = sizes["hidden"], sizes["inter"]
        heads, kv_heads, dim = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
        g = torch.Generator().manual_seed(m * 10 + OPS.index(op))

        def rand(*shape):
            return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

        self.weight = (1 + 0.1 * torch.randn(hidden, generator=g)).to(device=device, dtype=dtype)
        if op in ("rms_norm", "add_rms_norm"):
            self.x = [rand(m, hidden) for _ in range(calls)]
            self.r = [rand(m, hidden) for _ in range(calls)]
        elif op == "silu_and_mul":
            self.x = [rand(m, 2 * inter) for _ in range(calls)]
        else:
            self.q = [rand(m, heads * dim) for _ in range(calls)]
            self.k = [rand(m, kv_heads * dim) for _ in range(calls)]
            self.v = [rand(m, kv_heads * dim) for _ in range(calls)]
            self.positions = torch.randint(0, MAX_POS, (m,), generator=g).to(device)
            self.loc = torch.randperm(SLOTS, generator=g)[:m].to(device)
            # the model's RoPE: its cos | sin cache (both libraries' layout) and its torch twin
            self.rope = RotaryEmbedding(dim, MAX_POS, RopeScaling("default", ROPE_THETA,
                                                                  MAX_POS)).to(device)
            self.cache = self.rope.cos_sin_cache
            self.k_cache = [torch.zeros(SLOTS, kv_heads, dim, device=device, dtype=dtype)
                            for _ in range(calls)]
            self.v_cache = [torch.zeros_like(c) for c in self.k_cache]

    def reference(self) -> list[torch.Tensor]:
        """fp32 results of the check call: what every path must give."""
        c = self.check
        if self.op in ("rms_norm", "add_rms_norm"):
            x = self.x[c].float() + (self.r[c].float() if self.op == "add_rms_norm" else 0)
            normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight.float()
            return [normed, x] if self.op == "add_rms_norm" else [normed]
        if self.op == "silu_and_mul":
            gate, up = self.x[c].float().chunk(2, dim=-1)
            return [torch.nn.functional.silu(gate) * up]
        q, k = self.rope.forward_native(self.positions, self.q[c].float(), self.k[c].float())
        return [q, k, self.v[c].float()]

    # every path returns call i's results in the reference's order
    def ours(self, i: int) -> list[torch.Tensor]:
        if self.op == "rms_norm":
            return [rms_norm(self.x[i], self.weight, EPS)]
        if self.op == "add_rms_norm":
            return list(rms_norm(self.x[i], self.weight, EPS, residual=self.r[i]))
        if self.op == "silu_and_mul":
            return [silu_and_mul(self.x[i])]
        rope_store(self.positions, self.q[i], self.k[i], self.cache, v=self.v[i],
                   k_cache=self.k_cache[i], v_cache=self.v_cache[i], loc=self.loc)
        return self._stored(i)

    def flashinfer(self, fi, i: int) -> list[torch.Tensor]:
        if self.op == "rms_norm":
            return [fi.norm.rmsnorm(self.x[i], self.weight, EPS)]
        if self.op == "add_rms_norm":
            fi.norm.fused_add_rmsnorm(self.x[i], self.r[i], self.weight, EPS)
            return [self.x[i], self.r[i]]
        if self.op == "silu_and_mul":
            return [fi.activation.silu_and_mul(self.x[i])]
        dim, kv_heads = self.sizes["head_dim"], self.sizes["kv_heads"]
        fi.rope.apply_rope_with_cos_sin_cache_inplace(self.positions, self.q[i], self.k[i], dim,
                                                      self.cache, is_neox=True)
        self.k_cache[i][self.loc] = self.k[i].view(-1, kv_heads, dim)
        self.v_cache[i][self.loc] = self.v[i].view(-1, kv_heads, dim)
        return self._stored(i)

    def _stored(self, i: int) -> list[torch.Tensor]:
        kv = self.sizes["kv_heads"] * self.sizes["head_dim"]
        return [self.q[i], self.k_cache[i][self.loc].reshape(-1, kv),
                self.v_cache[i][self.loc].reshape(-1, kv)]

    def bytes_moved(self) -> int:
        """Bytes one call must read and write (the floor a kernel could reach)."""
        e = self.weight.element_size()
        hidden, inter = self.sizes["hidden"], self.sizes["inter"]
        if self.op == "rms_norm":
            return 2 * self.m * hidden * e
        if self.op == "add_rms_norm":
            return 4 * self.m * hidden * e
        if self.op == "silu_and_mul":
            return 3 * self.m * inter * e
        qk = (self.sizes["heads"] + self.sizes["kv_heads"]) * self.sizes["head_dim"]
        return self.m * (2 * qk + 3 * self.sizes["kv_heads"] * self.sizes["head_dim"]) * e


def rel_err(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(((g.float() - w).abs().max() / w.abs().max().clamp_min(1e-6)).item()
               for g, w in zip(got, want, strict=True))


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    sizes = (dict(hidden=HIDDEN, inter=INTER, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
             if cuda and not args.smoke else SMOKE_SIZES)
    flashinfer, why_not = load_flashinfer()
    if why_not:
        print(why_not, file=sys.stderr)
    rows = []
    names = ["ours"] + (["flashinfer"] if flashinfer is not None else [])
    for op in args.ops:
        for m in args.rows:
            for name in names:
                # fresh inputs per path (both libraries write some in place), the same values
                case = Case(op, m, args.calls, sizes, device, dtype)
                want = case.reference()
                fn = case.ours if name == "ours" else (
                    lambda i, case=case: case.flashinfer(flashinfer, i))
                try:
                    err = rel_err(fn(case.check), want)
                    us = time_us(fn, args.calls, args.iters, torch.device(device))
                except Exception as e:  # a kernel this build lacks: its row says so
                    print(f"{op} {name}: {type(e).__name__}: {e}".splitlines()[0],
                          file=sys.stderr)
                    continue
                rows.append(dict(op=op, rows=m, path=name, us_per_call=us, rel_err=err,
                                 bytes=case.bytes_moved(),
                                 tb_s=case.bytes_moved() / us / 1e6))
    return dict(device=torch.cuda.get_device_name(0) if cuda else "cpu (interpreter)",
                torch=torch.__version__, dtype=str(dtype), sizes=sizes,
                flashinfer=getattr(flashinfer, "__version__", None), flashinfer_absent=why_not,
                args=vars(args), rows=rows)


def _table(report: dict) -> str:
    ours = {(r["op"], r["rows"]): r["us_per_call"] for r in report["rows"] if r["path"] == "ours"}
    lines = [f"{report['device']}, {report['dtype']}, flashinfer {report['flashinfer']}",
             "op            rows path        us/call   TB/s  rel err  ours / this"]
    for r in report["rows"]:
        base = ours.get((r["op"], r["rows"]))
        ratio = f"{base / r['us_per_call']:>9.2f}x" if base else "        -"
        lines.append(f"{r['op']:<13} {r['rows']:>4} {r['path']:<10} {r['us_per_call']:>8.2f} "
                     f"{r['tb_s']:>6.3f} {r['rel_err']:>8.1e} {ratio}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16, 32, 512])
    p.add_argument("--calls", type=int, default=28, help="calls per graph (a layer each)")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--smoke", action="store_true", help="CPU: tiny sizes, our path only")
    p.add_argument("--out", default=None)
    return run_and_report(p.parse_args(argv), SMOKE, run, _table)


if __name__ == "__main__":
    main()

"""Fixed-layout Triton attention per layer call: split + merge kernel against the in-kernel merge.

    python benchmark/spec_decode/bench_decode_attention.py --bs 1 8 32 \
        --contexts 128 900 4096 --q-lens 1 16 --min-split-keys 128 256 512 \
        --out decode_attention.json
    python benchmark/spec_decode/bench_decode_attention.py --ragged --bs 1 8 32 \
        --contexts 900 --q-lens 16 --out ragged_verify_attention.json
    python benchmark/spec_decode/bench_decode_attention.py --smoke   # CPU: the interpreter

Qwen2.5-1.5B's attention (12 q heads over 2 kv heads, head_dim 128, bf16; fp32 on the CPU,
whose interpreter mishandles bf16). Every request holds `context` keys in scattered pool slots;
`q_len` 1 is DECODE, more is TARGET_VERIFY (causal in the block). Paths: "launch" (today's
default: the split kernel, then the merge kernel when it split) and "in_kernel@N" for each
`--min-split-keys` N (one launch: contexts up to N keys unsplit, longer ones merged by their
last split), and "single@B:W:S" for each `--single-pass` tile (a bench-only candidate: no key
split and no merge, key tile B, W warps, S stages; `tiling.SinglePassTile`). Each path is
checked first against torch_native on fresh random inputs, its
output poisoned with NaN before the call.

`--ragged` times compact verify's attention instead (the launch merge): every request verifies
a seeded random 1..q_len of its block's tokens (mean ~q_len / 2), laid out token-major over the
token bucket that holds them (`RaggedStepPrologue`). Paths: "static" (the whole blocks,
request-major: what static verify runs), "per_token" (the ragged step with one entry per
token, each reading its request's keys: compact verify before `ForwardBatch.ragged`),
"ragged" (the same step read per request, a request slot per token) and "ragged_bounded"
(request slots for the step's requests only, as the server's prologue bounds them since
2026-12-05); the ratio column is against "static".

Time per layer call, on CUDA: one graph of back-to-back calls, each reading its own layer's
K/V (as many layers as `--calls`, more when one layer's K/V is small enough that the calls
would fit in L2 and re-read it from there), replayed `--iters` times (CUDA events, median),
divided by the calls; launch gaps count as in a decode graph. On the CPU: the wall time of one
interpreted call, a smoke of the harness, not a figure. Bytes per call: the K/V read
(bs * context * kv heads * head_dim * 2 * element size); TB/s = bytes / time, next to a
device-to-device copy's TB/s measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable

import torch

if not torch.cuda.is_available():
    # NOTE: before any @triton.jit definition is imported: the kernels run interpreted.
    os.environ["TRITON_INTERPRET"] = "1"

from bench_graph_replay import replay_ms  # noqa: E402  (this script's folder is on sys.path)
from step_bandwidth import copy_bandwidth  # noqa: E402

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode  # noqa: E402
from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests  # noqa: E402
from sglang_aux.srt.layers.attention.torch_native_backend import (  # noqa: E402
    TorchNativeAttnBackend,
)
from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang_aux.srt.layers.attention.triton_ops import tiling  # noqa: E402
from sglang_aux.srt.layers.attention.triton_ops.decode_attention import (  # noqa: E402
    grid_kv_splits,
)
from sglang_aux.srt.layers.radix_attention import RadixAttention  # noqa: E402
from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang_aux.srt.model_executor.runner_backend.cuda_graph_backend import (  # noqa: E402
    CudaGraphBackend,
)
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import (  # noqa: E402
    ragged_token_buckets,
)
from sglang_aux.test.ragged_steps import ragged_verify_batch  # noqa: E402

QWEN_HEADS = (12, 2, 128)  # Qwen2.5-1.5B: q heads, kv heads, head_dim
# Enough distinct K/V per graph to stream this many times the L2 cache between re-reads.
L2_PASSES = 2
# fp32 checks are near-exact; bf16 rounds P, K and V to 16 bits in both paths
REL_ERR_BOUND = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
# the CPU picks one split: force three, so both paths split and merge at the longer context
SMOKE = dict(bs=[1, 3], contexts=[16, 130], q_lens=[1, 4], min_split_keys=[64],
             single_pass=["32:4:1"], splits=[2], merge_heads=[1],
             num_kv_splits=3, max_context=256, calls=1, iters=1)


def _batch(bs: int, context: int, q_len: int, max_context: int, num_layers: int, device: str,
           dtype: torch.dtype) -> ForwardBatch:
    """`bs` requests of `context` keys each in scattered slots; their last q_len are new."""
    heads, kv_heads, head_dim = QWEN_HEADS
    num_slots = bs * context + 1
    req_pool = ReqToTokenPool(bs, max(context, max_context), device)
    kv_pool = MHATokenToKVPool(num_slots, num_layers, kv_heads, head_dim, dtype, device)
    for buf in (*kv_pool.k_buffer, *kv_pool.v_buffer):
        buf.normal_()
    slots = (torch.randperm(num_slots - 1) + 1).to(device).split(context)
    rows = [req_pool.alloc() for _ in range(bs)]
    for row, chunk in zip(rows, slots, strict=True):
        req_pool.write(row, 0, chunk)
    seq_lens = torch.full((bs,), context, device=device)
    positions = torch.arange(context - q_len, context, device=device).repeat(bs)
    mode = ForwardMode.DECODE if q_len == 1 else ForwardMode.TARGET_VERIFY
    return ForwardBatch(
        forward_mode=mode, batch_size=bs,
        input_ids=torch.zeros(bs * q_len, dtype=torch.int64, device=device),
        req_pool_indices=torch.tensor(rows, device=device), seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.cpu(), out_cache_loc=torch.zeros(bs * q_len, dtype=torch.int64,
                                                               device=device),
        positions=positions, req_to_token_pool=req_pool, token_to_kv_pool=kv_pool,
        attn_backend=None)


def _layers(num_layers: int) -> list[RadixAttention]:
    heads, kv_heads, head_dim = QWEN_HEADS
    return [RadixAttention(heads, head_dim, head_dim**-0.5, kv_heads, i)
            for i in range(num_layers)]


def _check(backend: TritonAttnBackend, fb: ForwardBatch, layer: RadixAttention,
           q: torch.Tensor, live: int | None = None) -> float:
    """Max |path - torch_native| over max |torch_native| on layer 0 (its first `live` rows);
    raises past the bound."""
    ref = TorchNativeAttnBackend()
    ref.init_forward_metadata(fb)
    expected = ref.forward(q, None, None, layer, fb, save_kv_cache=False).float()[:live]
    backend.init_forward_metadata(fb)
    out = backend.forward(q, None, None, layer, fb, save_kv_cache=False).float()[:live]
    if not torch.isfinite(out).all():
        raise AssertionError("non-finite output")
    err = ((out - expected).abs().max() / expected.abs().max()).item()
    if err > REL_ERR_BOUND[q.dtype]:
        raise AssertionError(f"rel err {err:.2e} over {REL_ERR_BOUND[q.dtype]:.0e}")
    return err


def us_per_call(calls: Callable[[], None], num_calls: int, device: torch.device,
                iters: int) -> float:
    """us per call of `calls` (`num_calls` back-to-back layer calls): on CUDA one captured
    graph of them replayed `iters` times (its warm-ups compile the kernels and size the
    in-kernel merge's counters); on the CPU one interpreted pass."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        calls()
        return (time.perf_counter() - t0) * 1e6 / num_calls
    graphs = CudaGraphBackend(device)
    graph, _ = graphs.warm_and_capture(calls)
    return replay_ms(graphs, graph, iters, cuda=True) * 1e3 / num_calls


def _us_per_call(backend: TritonAttnBackend, fb: ForwardBatch, layers: list[RadixAttention],
                 q: torch.Tensor, iters: int) -> float:
    def calls() -> None:
        for layer in layers:
            backend.forward(q, None, None, layer, fb, save_kv_cache=False)

    return us_per_call(calls, len(layers), q.device, iters)


def _paths(args: argparse.Namespace) -> dict[str, TritonAttnBackend]:
    paths = {"launch": TritonAttnBackend(args.num_kv_splits)}
    for n in args.min_split_keys:
        paths[f"in_kernel@{n}"] = TritonAttnBackend(args.num_kv_splits, "in_kernel", n)
    for spec in args.single_pass:
        tile = tiling.SinglePassTile(*map(int, spec.split(":")))
        paths[f"single@{spec}"] = TritonAttnBackend(single_pass=tile)
    for n in args.splits:
        paths[f"splits@{n}"] = TritonAttnBackend(n)
    for n in args.merge_heads:
        paths[f"merge_heads@{n}"] = TritonAttnBackend(args.num_kv_splits, merge_heads=n)
    for n in args.splits:
        for h in args.merge_heads:
            paths[f"splits@{n}+merge_heads@{h}"] = TritonAttnBackend(n, merge_heads=h)
    return paths


def _ragged_rows(fb: ForwardBatch, layers: list[RadixAttention], q_len: int,
                 args: argparse.Namespace, kv_bytes: int) -> list[dict]:
    """The static / per-token / ragged rows of one (q_len, bs, context) point over `fb`'s
    requests (the static step)."""
    bs, context, device = fb.batch_size, int(fb.seq_lens_cpu[0]), fb.input_ids.device
    heads, _, head_dim = QWEN_HEADS
    lens = torch.randint(1, q_len + 1, (bs,)).tolist()
    n = next(b for b in ragged_token_buckets(max_bs=bs, tokens_per_req=q_len) if b >= sum(lens))
    ragged = ragged_verify_batch(fb.req_to_token_pool, fb.token_to_kv_pool, None,
                                 fb.req_pool_indices.tolist(), [context - q_len] * bs, lens, n,
                                 q_len)
    q_ragged = torch.randn(n, heads * head_dim, device=device,
                           dtype=fb.token_to_kv_pool.k_buffer[0].dtype)
    q_static = torch.randn(bs * q_len, heads * head_dim, device=device, dtype=q_ragged.dtype)
    # the request slots bounded to the step's requests, as the server's prologue bounds
    # them to its most requests (`max_requests`): no programs for slots no request takes
    bounded = dataclasses.replace(ragged, ragged=RaggedRequests(
        **{name: getattr(ragged.ragged, name)[:bs]
           for name in ("request_rows", "lens", "prefix_lens", "q_start")},
        width=ragged.ragged.width))
    cases = {"static": (fb, q_static, None),
             "per_token": (dataclasses.replace(ragged, ragged=None), q_ragged, sum(lens)),
             "ragged": (ragged, q_ragged, sum(lens)),
             "ragged_bounded": (bounded, q_ragged, sum(lens))}
    rows = []
    for path, (batch, q, live) in cases.items():
        backend = TritonAttnBackend(args.num_kv_splits)
        err = _check(backend, batch, layers[0], q, live)
        us = _us_per_call(backend, batch, layers, q, args.iters)
        rows.append(dict(q_len=q_len, bs=bs, context=context, path=path, tokens=q.shape[0],
                         verified=sum(lens) if path != "static" else bs * q_len,
                         us_per_call=us, kv_bytes=kv_bytes, tb_s=kv_bytes / us / 1e6,
                         calls_per_graph=len(layers), rel_err=err))
    return rows


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    heads, kv_heads, head_dim = QWEN_HEADS
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size if cuda else 0
    rows = []
    for q_len in args.q_lens:
        for bs in args.bs:
            for context in args.contexts:
                kv_bytes = 2 * bs * context * kv_heads * head_dim * dtype.itemsize
                num_layers = max(args.calls, -(-L2_PASSES * l2_bytes // kv_bytes))
                torch.manual_seed(args.seed + context * 1000 + bs * 10 + q_len)
                fb = _batch(bs, context, q_len, args.max_context, num_layers, device, dtype)
                layers = _layers(num_layers)
                if args.ragged:
                    rows += _ragged_rows(fb, layers, q_len, args, kv_bytes)
                    del fb, layers
                    continue
                q = torch.randn(bs * q_len, heads * head_dim, device=device, dtype=dtype)
                rows_per_tile = q_len * (heads // kv_heads)
                m_tiles = -(-rows_per_tile // tiling.q_block(rows_per_tile, head_dim))
                for name, backend in _paths(args).items():
                    splits = backend.num_kv_splits or grid_kv_splits(
                        bs * kv_heads * m_tiles, fb.req_to_token_pool.max_context_len,
                        q.device, backend.decode_merge, backend.min_split_keys, q_len)
                    if backend.single_pass:
                        splits = 1
                    err = _check(backend, fb, layers[0], q)
                    us = _us_per_call(backend, fb, layers, q, args.iters)
                    rows.append(dict(
                        q_len=q_len, bs=bs, context=context, path=name, grid_splits=splits,
                        launches=1 if backend.decode_merge == "in_kernel" or splits == 1 else 2,
                        us_per_call=us, kv_bytes=kv_bytes, tb_s=kv_bytes / us / 1e6,
                        calls_per_graph=num_layers, rel_err=err))
                del fb, layers
                if cuda:
                    torch.cuda.empty_cache()
    return dict(device=torch.cuda.get_device_name(0) if cuda else "cpu (interpreter)",
                torch=torch.__version__, dtype=str(dtype), heads=QWEN_HEADS,
                copy_tb_s=copy_bandwidth(torch.device("cuda")) / 1e12 if cuda else None,
                args=vars(args), rows=rows)


def _table(report: dict) -> str:
    ragged = report["args"]["ragged"]
    first = "static" if ragged else "launch"
    base = {(r["q_len"], r["bs"], r["context"]): r["us_per_call"] for r in report["rows"]
            if r["path"] == first}
    cols = "tokens verified" if ragged else "splits launches"
    lines = [f"{report['device']}, {report['dtype']}, copy "
             f"{report['copy_tb_s'] or float('nan'):.2f} TB/s",
             f"q_len bs context path                    {cols} us/call  TB/s  vs {first}"]
    for r in report["rows"]:
        ratio = base[(r["q_len"], r["bs"], r["context"])] / r["us_per_call"]
        a, b = (r["tokens"], r["verified"]) if ragged else (r["grid_splits"], r["launches"])
        lines.append(f"{r['q_len']:>5} {r['bs']:>2} {r['context']:>7} {r['path']:<24}"
                     f"{a:>6} {b:>8} {r['us_per_call']:>7.2f} "
                     f"{r['tb_s']:>5.2f} {ratio:>9.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 900, 4096])
    p.add_argument("--q-lens", type=int, nargs="+", default=[1, 16],
                   help="tokens per request: 1 is DECODE, more TARGET_VERIFY")
    p.add_argument("--min-split-keys", type=int, nargs="*", default=[tiling.MIN_SPLIT_KEYS],
                   help="one in-kernel path per value (multiples of 64)")
    p.add_argument("--single-pass", nargs="*", default=[],
                   help="one single-pass path per tile BLOCK_N:WARPS:STAGES (e.g. 128:8:2)")
    p.add_argument("--splits", type=int, nargs="*", default=[],
                   help="also the launch path at each of these fixed key splits (splits@N)")
    p.add_argument("--merge-heads", type=int, nargs="*", default=[],
                   help="also the launch path whose merge combines this many heads of a token "
                        "per program (merge_heads@N; today's: tiling.MERGE_HEADS), and with "
                        "each --splits")
    p.add_argument("--max-context", type=int, default=32768,
                   help="the request pool's context bound (a runner's; caps in-kernel splits)")
    p.add_argument("--num-kv-splits", type=int, default=None,
                   help="force the grid's key splits (default: the device's pick)")
    p.add_argument("--calls", type=int, default=28, help="layer calls per graph, at least")
    p.add_argument("--ragged", action="store_true",
                   help="compact verify's attention: static / per_token / ragged per q_len > 1")
    add_run_flags(p, "benchmark/spec_decode/decode_attention.json")
    return finish(p.parse_args(argv), SMOKE, run, _table)


def add_run_flags(p: argparse.ArgumentParser, out: str) -> None:
    """The flags `finish` and the timing read: --iters, --seed, --smoke, --out."""
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes, one call each (the CPU's interpreter)")
    p.add_argument("--out", default=out)


def finish(args: argparse.Namespace, smoke: dict, run: Callable[[argparse.Namespace], dict],
           table: Callable[[dict], str]) -> dict:
    """`run(args)` (`--smoke`: with `smoke`'s values), its report written to `--out` and
    its table printed."""
    if args.smoke:
        for name, value in smoke.items():
            setattr(args, name, value)
    report = run(args)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(table(report))
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

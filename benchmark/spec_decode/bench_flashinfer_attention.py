"""FlashInfer's paged attention beside ours, per layer call (issue 38 item 3: libraries before
hand-written kernels where they win).

    python benchmark/spec_decode/bench_flashinfer_attention.py --bs 1 8 32 --contexts 900 4096 \
        --q-lens 1 16 --out flashinfer_attention.json          # H200, flashinfer importable
    python benchmark/spec_decode/bench_flashinfer_attention.py --smoke   # CPU: ours only

Qwen2.5-1.5B's attention on the KV pool as the runtime lays it out (`MHATokenToKVPool`: one
slot per token, i.e. FlashInfer's page size 1, NHD), requests in scattered slots
(`bench_decode_attention._batch`). Paths: "triton" (our fixed-layout kernel, the default
backend), FlashInfer's `BatchDecodeWithPagedKVCacheWrapper` for q_len 1 (CUDA cores, and
`use_tensor_cores=True`), `BatchPrefillWithPagedKVCacheWrapper` for q_len > 1 (causal, the
block at the end of the context as in TARGET_VERIFY; backends fa2 and fa3). Each path is
checked against torch_native first. Timing as `bench_decode_attention.py`: one CUDA graph of
back-to-back calls over distinct layers' K/V, replayed, divided by the calls; FlashInfer's
`plan` runs on the host before capture (its wrappers in CUDA-graph mode), so its per-step host
cost is measured apart (`plan_us`): a server would pay it every step, our kernel reads its
layout from the batch tensors and has none. FlashInfer absent or failing to load: one line
saying why, and the rows of our path only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

if not torch.cuda.is_available():
    # NOTE: before any @triton.jit definition is imported: the kernels run interpreted.
    os.environ["TRITON_INTERPRET"] = "1"

from bench_decode_attention import (  # noqa: E402  (this script's folder is on sys.path)
    QWEN_HEADS,
    _batch,
    _check,
    _layers,
    _us_per_call,
)
from step_bandwidth import copy_bandwidth  # noqa: E402

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch  # noqa: E402
from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang_aux.srt.layers.radix_attention import RadixAttention  # noqa: E402

L2_PASSES = 2
WORKSPACE_BYTES = 256 << 20  # FlashInfer's float workspace (its split-KV partials)
SMOKE = dict(bs=[1, 2], contexts=[16], q_lens=[1, 4], calls=1, iters=1)


def load_flashinfer():
    """The `flashinfer` module, or the one-line reason it cannot run here."""
    if not torch.cuda.is_available():
        return None, "flashinfer: needs CUDA (this machine has none)"
    try:
        import flashinfer
    except Exception as e:  # ImportError, or a dependency failing at import
        return None, f"flashinfer: not importable ({type(e).__name__}: {e})".splitlines()[0]
    return flashinfer, None


def _kv_layout(fb: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Page-size-1 indptr, indices (each request's slots in order) and last_page_len."""
    lens = fb.seq_lens.to(torch.int32)
    rows = fb.req_to_token_pool.req_to_token[fb.req_pool_indices]
    indices = torch.cat([rows[i, : int(n)] for i, n in enumerate(lens.tolist())]).to(torch.int32)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32, device=lens.device)
    indptr[1:] = lens.cumsum(0)
    return indptr, indices, torch.ones_like(lens)


class FlashInferPath:
    """One FlashInfer wrapper planned for one batch, run on any layer's K/V; called as an
    attention backend is (`bench_decode_attention`'s check and timing take either)."""

    def __init__(self, flashinfer, kind: str, fb: ForwardBatch, q_len: int):
        heads, kv_heads, head_dim = QWEN_HEADS
        device = fb.seq_lens.device
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        indptr, indices, last = _kv_layout(fb)
        dtype = fb.token_to_kv_pool.k_buffer[0].dtype
        t0 = time.perf_counter()
        if q_len == 1:
            self.wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=kind == "decode_tc",
                paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
                paged_kv_last_page_len_buffer=last)
            self.wrapper.plan(indptr, indices, last, heads, kv_heads, head_dim, 1,
                              pos_encoding_mode="NONE", q_data_type=dtype, kv_data_type=dtype,
                              sm_scale=head_dim**-0.5)
        else:
            qo_indptr = torch.arange(0, (fb.batch_size + 1) * q_len, q_len, dtype=torch.int32,
                                     device=device)
            self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, qo_indptr_buf=qo_indptr,
                paged_kv_indptr_buf=indptr, paged_kv_indices_buf=indices,
                paged_kv_last_page_len_buf=last, backend=kind.removeprefix("prefill_"))
            self.wrapper.plan(qo_indptr, indptr, indices, last, heads, kv_heads, head_dim, 1,
                              causal=True, q_data_type=dtype, kv_data_type=dtype,
                              sm_scale=head_dim**-0.5)
        torch.cuda.synchronize()
        self.plan_us = (time.perf_counter() - t0) * 1e6

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Planned for its batch in __init__."""

    def forward(self, q: torch.Tensor, k, v, layer: RadixAttention, fb: ForwardBatch,
                save_kv_cache: bool = False) -> torch.Tensor:
        heads, kv_heads, head_dim = QWEN_HEADS
        pool = fb.token_to_kv_pool
        pages = tuple(buf[layer.layer_id].view(-1, 1, kv_heads, head_dim)  # page size 1
                      for buf in (pool.k_buffer, pool.v_buffer))
        return self.wrapper.run(q.view(-1, heads, head_dim), pages).view(q.shape)


def _paths(flashinfer, fb: ForwardBatch, q_len: int) -> dict:
    """Name -> backend-like path; ours has no plan (`plan_us` 0)."""
    paths = {"triton": TritonAttnBackend()}
    if flashinfer is not None:
        kinds = ["decode", "decode_tc"] if q_len == 1 else ["prefill_fa2", "prefill_fa3"]
        for kind in kinds:
            try:
                paths[kind] = FlashInferPath(flashinfer, kind, fb, q_len)
            except Exception as e:  # a backend this build or GPU lacks: its row says so
                print(f"{kind}: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
    return paths


def run(args: argparse.Namespace) -> dict:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    heads, kv_heads, head_dim = QWEN_HEADS
    flashinfer, why_not = load_flashinfer()
    if why_not:
        print(why_not, file=sys.stderr)
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size if cuda else 0
    rows = []
    for q_len in args.q_lens:
        for bs in args.bs:
            for context in args.contexts:
                kv_bytes = 2 * bs * context * kv_heads * head_dim * dtype.itemsize
                num_layers = max(args.calls, -(-L2_PASSES * l2_bytes // kv_bytes))
                torch.manual_seed(args.seed + context * 1000 + bs * 10 + q_len)
                fb = _batch(bs, context, q_len, context, num_layers, device, dtype)
                layers = _layers(num_layers)
                q = torch.randn(bs * q_len, heads * head_dim, device=device, dtype=dtype)
                for name, path in _paths(flashinfer, fb, q_len).items():
                    err = _check(path, fb, layers[0], q)
                    us = _us_per_call(path, fb, layers, q, args.iters)
                    rows.append(dict(q_len=q_len, bs=bs, context=context, path=name,
                                     us_per_call=us, plan_us=getattr(path, "plan_us", 0.0),
                                     kv_bytes=kv_bytes,
                                     tb_s=kv_bytes / us / 1e6, calls_per_graph=num_layers,
                                     rel_err=err))
                del fb, layers
                if cuda:
                    torch.cuda.empty_cache()
    return dict(device=torch.cuda.get_device_name(0) if cuda else "cpu (interpreter)",
                torch=torch.__version__, dtype=str(dtype), heads=QWEN_HEADS,
                flashinfer=getattr(flashinfer, "__version__", None), flashinfer_absent=why_not,
                copy_tb_s=copy_bandwidth(torch.device("cuda")) / 1e12 if cuda else None,
                args=vars(args), rows=rows)


def _table(report: dict) -> str:
    base = {(r["q_len"], r["bs"], r["context"]): r["us_per_call"] for r in report["rows"]
            if r["path"] == "triton"}
    lines = [f"{report['device']}, {report['dtype']}, flashinfer {report['flashinfer']}, copy "
             f"{report['copy_tb_s'] or float('nan'):.2f} TB/s",
             "q_len bs context path         us/call  TB/s  plan us  vs triton"]
    for r in report["rows"]:
        ratio = base[(r["q_len"], r["bs"], r["context"])] / r["us_per_call"]
        lines.append(f"{r['q_len']:>5} {r['bs']:>2} {r['context']:>7} {r['path']:<12}"
                     f"{r['us_per_call']:>8.2f} {r['tb_s']:>5.2f} {r['plan_us']:>8.1f} "
                     f"{ratio:>8.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[900, 4096])
    p.add_argument("--q-lens", type=int, nargs="+", default=[1, 16],
                   help="tokens per request: 1 is DECODE, more TARGET_VERIFY")
    p.add_argument("--calls", type=int, default=28, help="layer calls per graph, at least")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="CPU: tiny sizes, our path only")
    p.add_argument("--out", default=None)
    return run_and_report(p.parse_args(argv), SMOKE, run, _table)


def run_and_report(args: argparse.Namespace, smoke: dict, run, table) -> dict:
    """`run(args)` (with `--smoke`, `smoke`'s values over the args), the report written to
    `--out` and its table printed; the report returned."""
    if args.smoke:
        for key, value in smoke.items():
            setattr(args, key, value)
    report = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(table(report))
    return report


if __name__ == "__main__":
    main()

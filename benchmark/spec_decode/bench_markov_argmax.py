"""DSpark's greedy Markov loop kernel (`speculative/markov_argmax_kernel.py`) by tile: the n + 1
launches of one draft block's proposals at the DSpark recipes' shapes, each tile against the
default in the same run.

    python benchmark/spec_decode/bench_markov_argmax.py --bs 1 8 32 64 \
        --tiles 16:4:0 32:8:0 32:8:1 16:4:1 --out markov_argmax.json
    python benchmark/spec_decode/bench_markov_argmax.py --smoke   # CPU: the interpreter

Shapes (`--models`): SmolLM2's 7 proposals over 49,152 tokens and Qwen2.5's 15 over 151,936, a
rank-256 head, bf16 (fp32 on the CPU, whose interpreter mishandles bf16). A tile is
ROWS:WARPS:PIPELINED[:STAGES[:MAX_REGISTERS]] (`MarkovTile`); the first listed is the
baseline of the ratio column.
Each tile's tokens are checked equal to the baseline's on the same inputs before it is timed;
`--topk K` adds the certified top-K candidates' path (`markov_topk_kernel.py`: the `topk`, its
launch and the exact kernel's launches, which sweep only the uncertified), its tokens checked
the same, at each `--bias-scales` S (markov_w2 times S, the baseline rerun on it): its rows
report the share of proposals certified, which sets its time (random weights give a point,
not a trained head's: a small S certifies all, a large one none).
Time: on CUDA one captured graph of the whole loop replayed `--iters` times (CUDA events,
median); bytes: `markov_w2` read once per request block and proposal; TB/s against a
device-to-device copy measured in the same run. On the CPU, one interpreted call: a smoke of
the harness, not a figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

import torch

if not torch.cuda.is_available():
    # NOTE: before any @triton.jit definition is imported: the kernels run interpreted.
    os.environ["TRITON_INTERPRET"] = "1"

from bench_decode_attention import add_run_flags, finish  # noqa: E402
from bench_graph_replay import replay_ms  # noqa: E402  (this script's folder is on sys.path)
from step_bandwidth import copy_bandwidth  # noqa: E402

from sglang_aux.srt.model_executor.runner_backend.cuda_graph_backend import (  # noqa: E402
    CudaGraphBackend,
)
from sglang_aux.srt.models.dspark import markov_bias_bounds  # noqa: E402
from sglang_aux.srt.speculative.markov_argmax_kernel import (  # noqa: E402
    MarkovTile,
    markov_greedy_tokens,
    markov_tile,
)
from sglang_aux.srt.speculative.markov_topk_kernel import (  # noqa: E402
    certified_candidates,
    markov_topk_tokens,
)

MODELS = {"smollm2": (7, 49_152), "qwen2.5": (15, 151_936)}
RANK = 256
SMOKE = {"models": ["tiny"], "bs": [1, 17], "iters": 1, "topk": [16], "bias_scales": [1.0, 1e-3]}
TINY = (3, 1000)


def parse_tile(spec: str) -> MarkovTile:
    """ROWS:WARPS:PIPELINED[:STAGES[:MAX_REGISTERS]]."""
    rows, warps, pipelined, *rest = (int(x) for x in spec.split(":"))
    return MarkovTile(rows, warps, bool(pipelined), *rest)


def _inputs(bs: int, n: int, vocab: int, device: torch.device, seed: int):
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(seed)
    base = (4 * torch.randn(bs, n, vocab, device=device, generator=g)).to(dtype)
    w1 = torch.randn(vocab, RANK, device=device, generator=g).to(dtype)
    w2 = (torch.randn(vocab, RANK, device=device, generator=g) / RANK ** 0.5).to(dtype)
    anchor = torch.randint(0, vocab, (bs,), device=device, generator=g)
    return base, anchor, w1, w2


def swept_blocks(cand: torch.Tensor, cert: torch.Tensor, tokens: torch.Tensor, rows: int) -> int:
    """(request block, proposal) pairs the exact kernel sweeps after the top-K launch: a
    request needs it at an uncertified proposal and at every one after a swept token that
    differs from its candidate; a block of `rows` requests sweeps where any of them needs it."""
    cand, cert, tokens = cand.cpu(), cert.cpu(), tokens.cpu()
    bs, n = cand.shape
    need = torch.zeros(-(-bs // rows) * rows, n, dtype=torch.bool)
    for r in range(bs):
        diverged = False
        for k in range(n):
            need[r, k] = not cert[r, k] or diverged
            diverged |= bool(need[r, k]) and bool(tokens[r, k] != cand[r, k])
    return int(need.view(-1, rows, n).any(1).sum())


def _ms(call, device: torch.device, iters: int) -> float:
    if device.type != "cuda":
        t0 = time.perf_counter()
        call()
        return (time.perf_counter() - t0) * 1e3
    graphs = CudaGraphBackend(device)
    graph, _ = graphs.warm_and_capture(call)
    return replay_ms(graphs, graph, iters, cuda=True)


def run(args: argparse.Namespace) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tiles = [parse_tile(t) for t in args.tiles]
    copy = copy_bandwidth(device) / 1e12
    rows = []
    for model in args.models:
        n, vocab = TINY if model == "tiny" else MODELS[model]
        for bs in args.bs:
            base, anchor, w1, w2 = _inputs(bs, n, vocab, device, args.seed + bs)
            ref = None
            for spec, tile in zip(args.tiles, tiles, strict=True):
                out = torch.full((bs, n), -1, dtype=torch.int64, device=device)
                markov_greedy_tokens(base, anchor, w1, w2, out, tile)
                if ref is None:
                    ref = out.clone()
                elif not torch.equal(out, ref):
                    raise AssertionError(f"{model} bs {bs}: tile {spec} chose other tokens than "
                                         f"{args.tiles[0]}")
                ms = _ms(partial(markov_greedy_tokens, base, anchor, w1, w2, out, tile), device,
                         args.iters)
                reads = -(-bs // tile.rows) * n * w2.nbytes
                rows.append({"model": model, "bs": bs, "tile": spec, "ms": ms,
                             "w2_bytes_read": reads, "tb_s": reads / (ms / 1e3) / 1e12})
            for scale in args.bias_scales if args.topk else []:
                w2s = w2 * scale
                bounds = markov_bias_bounds(w2s)
                exact = torch.full((bs, n), -1, dtype=torch.int64, device=device)
                markov_greedy_tokens(base, anchor, w1, w2s, exact)
                for k in args.topk:
                    out = torch.full((bs, n), -1, dtype=torch.int64, device=device)
                    markov_topk_tokens(base, anchor, w1, w2s, out, k, bounds)
                    if not torch.equal(out, exact):
                        raise AssertionError(f"{model} bs {bs}: topk@{k} at bias x{scale} chose "
                                             "other tokens than the exact kernel")
                    cand, cert = certified_candidates(base, anchor, w1, w2s, k, bounds)
                    ms = _ms(partial(markov_topk_tokens, base, anchor, w1, w2s, out, k, bounds),
                             device, args.iters)
                    reads = bs * n * k * RANK * w2.element_size() + \
                        swept_blocks(cand, cert, out, markov_tile(bs, w2.dtype).rows) * w2.nbytes
                    rows.append({"model": model, "bs": bs, "tile": f"topk@{k}x{scale:g}",
                                 "ms": ms, "w2_bytes_read": reads,
                                 "tb_s": reads / (ms / 1e3) / 1e12,
                                 "certified": cert.float().mean().item()})
    base_ms = {(r["model"], r["bs"]): r["ms"] for r in rows if r["tile"] == args.tiles[0]}
    for r in rows:
        r["vs_first"] = base_ms[(r["model"], r["bs"])] / r["ms"]
    return {"device": str(device), "copy_tb_s": copy, "rows": rows}


def _table(report: dict) -> str:
    lines = [f"copy {report['copy_tb_s']:.2f} TB/s",
             f"{'model':>8} {'bs':>3} {'tile':>14} {'ms':>8} {'w2 MB read':>10} {'TB/s':>6} "
             f"{'vs first':>8} {'certified':>9}"]
    for r in report["rows"]:
        cert = f"{r['certified']:>9.2f}" if "certified" in r else ""
        lines.append(f"{r['model']:>8} {r['bs']:>3} {r['tile']:>14} {r['ms']:>8.3f} "
                     f"{r['w2_bytes_read'] / 1e6:>10.1f} {r['tb_s']:>6.2f} {r['vs_first']:>7.2f}x"
                     f" {cert}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=[*MODELS, "tiny"])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--tiles", nargs="+", default=["16:4:0", "32:8:0", "32:8:1", "16:4:1"],
                   help="ROWS:WARPS:PIPELINED tiles (MarkovTile), the first the baseline")
    p.add_argument("--topk", type=int, nargs="*", default=[],
                   help="also the certified top-K candidates' path at these K "
                        "(markov_topk_kernel; its rows report the share certified)")
    p.add_argument("--bias-scales", type=float, nargs="+", default=[1.0],
                   help="the top-K rows' markov_w2 times each of these (small: all certified)")
    add_run_flags(p, "benchmark/spec_decode/markov_argmax.json")
    return finish(p.parse_args(argv), SMOKE, run, _table)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Target-only decode throughput with decode graphs vs eager, measured in one process.

    python benchmark/spec_decode/bench_decode_throughput.py --preset bench-llama --bs 1 32

Weights are random (`--load-format dummy`, fixed seed), prompts random token ids of
`--prompt-len`, greedy, `--max-new-tokens` each with EOS ignored. tokens/s counts generated
tokens over the whole generate call (prefill included; it is a small share at these lengths).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine


def measure(engine: Engine, bs: int, prompt_len: int, max_new: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = engine.model_config.hf_config.vocab_size
    prompts = torch.randint(0, vocab, (bs, prompt_len), generator=g).tolist()
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    engine.generate(input_ids=prompts, sampling_params=params)  # warm-up
    start = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    seconds = time.perf_counter() - start
    tokens = sum(len(o["output_ids"]) for o in outs)
    return {"bs": bs, "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "outputs": [o["output_ids"] for o in outs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench-llama")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="benchmark/spec_decode/decode_throughput.json")
    a = p.parse_args()
    rows = []
    for graphs in (True, False):
        torch.manual_seed(0)
        engine = Engine(model_path=a.preset, load_format="dummy", device=a.device,
                        max_running_requests=max(a.bs), disable_decode_cuda_graph=not graphs,
                        context_length=a.prompt_len + a.max_new_tokens + 8)
        for bs in a.bs:
            rows.append({"graphs": graphs, **measure(engine, bs, a.prompt_len,
                                                     a.max_new_tokens, seed=bs)})
        del engine
    by = {(r["graphs"], r["bs"]): r for r in rows}
    print(f"{'bs':>4} {'graphs tok/s':>13} {'eager tok/s':>12} {'speed-up':>9} {'same tokens':>12}")
    summary = []
    for bs in a.bs:
        g, e = by[(True, bs)], by[(False, bs)]
        same = g["outputs"] == e["outputs"]
        summary.append({"bs": bs, "graphs_tok_per_s": g["tok_per_s"],
                        "eager_tok_per_s": e["tok_per_s"],
                        "speedup": g["tok_per_s"] / e["tok_per_s"], "same_tokens": same})
        print(f"{bs:>4} {g['tok_per_s']:>13.1f} {e['tok_per_s']:>12.1f} "
              f"{g['tok_per_s'] / e['tok_per_s']:>8.2f}x {str(same):>12}")
    for r in rows:
        r.pop("outputs")
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()

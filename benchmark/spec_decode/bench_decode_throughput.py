"""Decode throughput of several engine configurations, measured side by side in one process.

    python benchmark/spec_decode/bench_decode_throughput.py --preset bench-llama --bs 1 32 \
        --configs graphs eager
    python benchmark/spec_decode/bench_decode_throughput.py --preset bench-llama --bs 1 16 \
        --configs graphs dflash

Configurations: `graphs` (target-only, decode CUDA graphs), `eager` (target-only, no graphs),
`dflash` (DFlash with `<preset>-dflash` as the draft, graphs on). Weights are random
(`--load-format dummy`, fixed seed), prompts random token ids of `--prompt-len`, greedy,
`--max-new-tokens` each with EOS ignored. tokens/s counts generated tokens over the whole
generate call (prefill included; a small share at these lengths). Ratios are against the
first configuration; greedy outputs must match it token for token.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from sglang_aux.srt.entrypoints.engine import Engine

CONFIGS = {
    "graphs": {},
    "eager": {"disable_decode_cuda_graph": True},
    "dflash": {"speculative_algorithm": "DFLASH"},
}


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
    accept = sum(o["meta_info"]["spec_accept_length"] for o in outs) / len(outs)
    return {"bs": bs, "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "accept_length": accept, "outputs": [o["output_ids"] for o in outs]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bench-llama")
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["graphs", "eager"])
    p.add_argument("--bs", type=int, nargs="+", default=[1, 32])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default="benchmark/spec_decode/decode_throughput.json")
    a = p.parse_args()
    rows = []
    for name in a.configs:
        extra = dict(CONFIGS[name])
        if name == "dflash":
            extra["speculative_draft_model_path"] = f"{a.preset}-dflash"
        engine = Engine(model_path=a.preset, load_format="dummy", device=a.device,
                        max_running_requests=max(a.bs),
                        context_length=a.prompt_len + a.max_new_tokens + 16, **extra)
        for bs in a.bs:
            rows.append({"config": name, **measure(engine, bs, a.prompt_len,
                                                   a.max_new_tokens, seed=bs)})
        del engine
    by = {(r["config"], r["bs"]): r for r in rows}
    base = a.configs[0]
    print(f"{'bs':>4} {'config':>8} {'tok/s':>10} {'vs ' + base:>12} {'accept':>7} {'same':>5}")
    summary = []
    for bs in a.bs:
        ref = by[(base, bs)]
        for name in a.configs:
            r = by[(name, bs)]
            ratio = r["tok_per_s"] / ref["tok_per_s"]
            same = r["outputs"] == ref["outputs"]
            summary.append({"bs": bs, "config": name, "tok_per_s": r["tok_per_s"],
                            "ratio": ratio, "accept_length": r["accept_length"], "same": same})
            print(f"{bs:>4} {name:>8} {r['tok_per_s']:>10.1f} {ratio:>11.2f}x "
                  f"{r['accept_length']:>7.2f} {str(same):>5}")
    for r in rows:
        r.pop("outputs")
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()

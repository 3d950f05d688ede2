"""Our engine against `transformers.generate` (static cache), side by side in one process.

    python benchmark/spec_decode/bench_vs_transformers.py --model-path smollm2-135m-instruct \
        --draft smollm2-135m-instruct-dflash-b8 --bs 1 8 32 --out vs_transformers.json

Prompts: the first `--num-prompts` GSM8K test questions, 5-shot (train questions as shots),
tokenized once by our tokenizer and fed as the same ids to every engine; batch size 1 takes
the first `--num-prompts-bs1` of them (sequential decoding is slow for the baseline too).
Greedy, static batches of `bs` prompts, two modes: `forced` (`--max-new-tokens` new tokens,
EOS ignored / `min_new_tokens`) and `natural` (stop at "Question", EOS, or the limit).
Engines: transformers `generate(cache_implementation="static")` in the model dtype (the
baseline), ours target-only (decode graphs), ours DFLASH with the shared aux buffer, with
`--disable-shared-aux-buffer`, and with the streamed projection (no `[T, K*H]` tensor); on two
GPUs also `target_tp2` / `dflash_tp2` (`--tp-size 2`).
tokens/s = generated tokens / wall time of the timed calls (prefill included; our prefix cache
is off, since every prompt repeats across modes and warm-ups and transformers keeps no
prefix). GPU busy: the
union of GPU kernel intervals over the wall time of one profiled chunk of `--profile-tokens`
new tokens.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader.builtin import resolve_model, resolve_model_path
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.few_shot_gsm8k import (
    build_prompt,
    few_shot_prefix,
    read_jsonl,
)
from sglang_aux.test.gsm8k_data import data_paths

STOP = "Question"
OURS = {
    "target": {},
    "dflash": {"speculative_algorithm": "DFLASH"},
    "dflash_noshare": {"speculative_algorithm": "DFLASH", "disable_shared_aux_buffer": True},
    "dflash_streamed": {"speculative_algorithm": "DFLASH",
                        "speculative_dflash_aux_projection": "streamed"},
    # two GPUs (scripts/device/tp2_figures.sh); not in the default list
    "target_tp2": {"tp_size": 2},
    "dflash_tp2": {"speculative_algorithm": "DFLASH", "tp_size": 2},
}
ONE_GPU = ["target", "dflash", "dflash_noshare", "dflash_streamed"]


def gsm8k_prompts(data_path: Path | None, n: int, shots: int) -> list[str]:
    data, train = data_paths(data_path)
    prefix = few_shot_prefix(read_jsonl(train)[:shots])
    return [build_prompt(prefix, q["question"]) for q in read_jsonl(data)[:n]]


def gpu_busy(fn) -> float | None:
    """Fraction of `fn`'s wall time during which some GPU kernel ran."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t0) * 1e6
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end = 0.0, float("-inf")
    for s, e in spans:
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy / wall_us


class HFEngine:
    """transformers' model and generate, the baseline a user would pick instead."""

    def __init__(self, folder: str, dtype: torch.dtype, device: str, pad_to: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.device = device
        # One prompt width for every call: the static cache's shape (and the forward that
        # generate compiles for it) stays fixed instead of recompiling per prompt length.
        self.pad_to = pad_to
        self.pad = self.tokenizer.pad_token_id
        if self.pad is None:
            self.pad = self.tokenizer.eos_token_id

    def generate(self, ids: list[list[int]], max_new: int, natural: bool) -> list[list[int]]:
        width = self.pad_to
        # Left padding: every row's last prompt token sits at the same column.
        input_ids = torch.tensor([[self.pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        kwargs = {"stop_strings": [STOP], "tokenizer": self.tokenizer} if natural else {
            "min_new_tokens": max_new}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                max_new_tokens=max_new, do_sample=False, cache_implementation="static",
                pad_token_id=self.pad, **kwargs)
        new = out[:, width:].tolist()
        if not natural:
            return new
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        trimmed = []
        for row in new:  # generate pads rows that finished early: count up to the stop
            n = len(row)
            for i, t in enumerate(row):
                if t in eos or t == self.pad or STOP in self.tokenizer.decode(row[: i + 1]):
                    n = i + 1
                    break
            trimmed.append(row[:n])
        return trimmed


class OurEngine:
    def __init__(self, engine: Engine):
        self.engine = engine

    def generate(self, ids: list[list[int]], max_new: int, natural: bool) -> list[list[int]]:
        params = ({"temperature": 0, "max_new_tokens": max_new, "stop": [STOP]} if natural
                  else {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
        self.outs = self.engine.generate(input_ids=ids, sampling_params=params)
        return [o["output_ids"] for o in self.outs]


def run(name: str, eng, chunks: list[list[list[int]]], max_new: int, natural: bool,
        profile_tokens: int) -> dict:
    eng.generate(chunks[0], max_new, natural)  # warm-up
    outputs, verify_ct = [], 0
    start = time.perf_counter()
    for chunk in chunks:
        outputs += eng.generate(chunk, max_new, natural)
        if isinstance(eng, OurEngine):
            verify_ct += sum(o["meta_info"]["spec_verify_ct"] for o in eng.outs)
    seconds = time.perf_counter() - start
    tokens = sum(map(len, outputs))
    busy = gpu_busy(lambda: eng.generate(chunks[0], profile_tokens, False))
    return {"engine": name, "tokens": tokens, "seconds": seconds, "tok_per_s": tokens / seconds,
            "accept_length": tokens / verify_ct if verify_ct else None, "gpu_busy": busy,
            "outputs": outputs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", default="smollm2-135m-instruct")
    p.add_argument("--draft", default="smollm2-135m-instruct-dflash-b8")
    p.add_argument("--data-path", type=Path, default=None)
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--num-prompts-bs1", type=int, default=16)
    p.add_argument("--num-shots", type=int, default=5)
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--modes", nargs="+", choices=["forced", "natural"],
                   default=["forced", "natural"])
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--profile-tokens", type=int, default=32)
    p.add_argument("--engines", nargs="+", choices=["transformers", *OURS],
                   default=["transformers", *ONE_GPU])
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="benchmark/spec_decode/vs_transformers.json")
    a = p.parse_args()
    folder = resolve_model_path(a.model_path)
    tokenizer = resolve_model(ServerArgs(model_path=folder, device="cpu"))[1]
    ids = [tokenizer.encode(t) for t in gsm8k_prompts(a.data_path, a.num_prompts, a.num_shots)]
    rows = []
    for name in a.engines:
        if name == "transformers":
            eng = HFEngine(folder, getattr(torch, a.dtype), a.device, max(map(len, ids)))
        else:
            extra = dict(OURS[name])
            if "speculative_algorithm" in extra:
                extra["speculative_draft_model_path"] = a.draft
            eng = OurEngine(Engine(model_path=folder, dtype=a.dtype, device=a.device,
                                   max_running_requests=max(a.bs),
                                   context_length=max(map(len, ids)) + a.max_new_tokens + 64,
                                   disable_radix_cache=True, **extra))
        for mode in a.modes:
            for bs in a.bs:
                n = a.num_prompts_bs1 if bs == 1 else a.num_prompts
                chunks = [ids[i : i + bs] for i in range(0, n, bs)]
                r = run(name, eng, chunks, a.max_new_tokens, mode == "natural", a.profile_tokens)
                rows.append({"mode": mode, "bs": bs, "prompts": n, **r})
                print(f"{name:>15} {mode:>8} bs {bs:>3}: {r['tok_per_s']:9.1f} tok/s", flush=True)
        if isinstance(eng, OurEngine):
            eng.engine.shutdown()  # a tensor-parallel engine's other ranks stop
        del eng
        torch.cuda.empty_cache()
    summarize(rows, a)


def summarize(rows: list[dict], a) -> None:
    by = {(r["engine"], r["mode"], r["bs"]): r for r in rows}
    base, ref_ours = a.engines[0], "target"
    print(f"\n{'mode':>8} {'bs':>3} {'engine':>15} {'tok/s':>9} {'vs ' + base:>16} "
          f"{'vs target':>10} {'accept':>7} {'busy':>5} {'same as target':>14}")
    for mode in a.modes:
        for bs in a.bs:
            for name in a.engines:
                r = by[(name, mode, bs)]
                b, t = by.get((base, mode, bs)), by.get((ref_ours, mode, bs))
                r["vs_baseline"] = r["tok_per_s"] / b["tok_per_s"] if b else None
                r["vs_target"] = r["tok_per_s"] / t["tok_per_s"] if t else None
                r["same_as_target"] = (sum(x == y for x, y in zip(r["outputs"], t["outputs"],
                                                                   strict=True))
                                       / len(r["outputs"]) if t else None)
                fmt = lambda v, f: "-" if v is None else format(v, f)
                print(f"{mode:>8} {bs:>3} {name:>15} {r['tok_per_s']:>9.1f} "
                      f"{fmt(r['vs_baseline'], '.2f'):>15}x {fmt(r['vs_target'], '.2f'):>9}x "
                      f"{fmt(r['accept_length'], '.2f'):>7} {fmt(r['gpu_busy'], '.2f'):>5} "
                      f"{fmt(r['same_as_target'], '.2f'):>14}")
    for r in rows:
        r.pop("outputs")
    with open(a.out, "w") as f:
        json.dump({"args": {k: str(v) for k, v in vars(a).items()}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

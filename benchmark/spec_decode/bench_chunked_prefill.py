"""Chunked prefill: one chunk step's memory per aux projection, and a long prompt over HTTP.

    python benchmark/spec_decode/bench_chunked_prefill.py --out chunked_prefill.json  # H200
    python benchmark/spec_decode/bench_chunked_prefill.py --smoke        # CPU, tiny presets

(a) `--step-preset` (k3-shaped, random weights, its DFlash draft with an MXFP8 fc), chunk
`--chunk` (4096): the first chunk step of a longer prompt (`Scheduler.step` ->
`Worker.prefill_chunk`), per projection path: concat (the packed aux rows, quantized whole
into the fc), staged MXFP8, streamed. `step_peak_bytes` is the allocator's peak above the
step's start plus the aux storage rows the step wrote (preallocated, so outside that peak),
CUDA only (`--memory-history`: the largest allocations live at that peak, and the code that
made them). The target's own chunk step (no draft) is measured too: `above_target_bytes` is
what each path adds to it, the aux projection's share (the target's activations peak inside
its forward, where every path adds what it holds then). The seed's K3 figure, concat ->
staged, is of the projection alone: 1,278,083,584 -> 663,355,904 bytes.
(b) `--model-path` / `--draft-path` served over HTTP (`--context-length`), once with
`--chunked-prefill-size --chunk` and once unchunked: `--others` requests decode
`--others-max-new` tokens each while one `--prompt-tokens`-token prompt (random ids) is
prefilled and generates `--long-max-new` tokens. Time to first token, prefill tokens/s,
the server's largest step peak (`max_step_peak_bytes`, CUDA), the others' decode tok/s
before and while the prompt prefills, and whether both runs gave the same tokens (greedy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.scheduler.scheduler import STEP_PEAK_ENV
from sglang_aux.srt.model_loader.builtin import resolve_model
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.gsm8k_data import gsm8k_path
from sglang_aux.test.runtime_utils import tiny_checkpoint
from sglang_aux.test.server_utils import launched_server

PATHS = {"concat": dict(dflash_staged_projection_min_tokens=1 << 30),
         "staged": dict(dflash_staged_projection_min_tokens=1),
         "streamed": dict(speculative_dflash_aux_projection="streamed")}


def live_at_peak(trace: list[dict], top: int = 12) -> tuple[int, list[dict]]:
    """Replays a CUDA memory history's events (`torch.cuda.memory._snapshot()`'s
    `device_traces[i]`): the peak of the bytes they keep live, and the `top` largest
    allocations live at that peak, each with its size and the package's frames that made it."""
    live: dict[int, dict] = {}
    cur = peak = 0
    at: list[dict] = []
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > peak:
                peak, at = cur, list(live.values())
        elif e["action"] == "free_requested" and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]

    def where(e: dict) -> str:
        frames = [f for f in e.get("frames", []) if "sglang_aux/" in f["filename"]]
        return " < ".join(f"{f['filename'].split('sglang_aux/')[-1]}:{f['line']} {f['name']}"
                          for f in frames[:3])

    return peak, [{"bytes": e["size"], "at": where(e)}
                  for e in sorted(at, key=lambda e: -e["size"])[:top]]


def chunk_step(a: argparse.Namespace, path: str) -> dict:
    """One chunk step of `a.chunk` tokens under projection `path`."""
    preset = a.step_preset
    # the preset's context must hold a prompt longer than one chunk
    PRESETS[preset] = {**PRESETS[preset], "max_position_embeddings": 2 * a.chunk + 64}
    spec = {} if path == "target" else dict(
        speculative_algorithm="DFLASH", speculative_draft_model_path=f"{preset}-dflash",
        speculative_draft_fc_quantization="mxfp8", **PATHS[path])
    engine = Engine(model_path=preset, load_format="dummy", device=a.device,
                    chunked_prefill_size=a.chunk, max_running_requests=4,
                    max_total_tokens=4 * a.chunk, disable_decode_cuda_graph=True,
                    disable_prefill_cuda_graph=True, disable_radix_cache=True, **spec)
    runner, sched = engine.worker.model_runner, engine.scheduler
    vocab = engine.model_config.hf_config.vocab_size
    prompt = torch.randint(3, vocab, (a.chunk + 16,), generator=torch.Generator().manual_seed(0))
    req = engine.make_request(input_ids=prompt.tolist(), sampling_params={"max_new_tokens": 1})
    sched.add_request(req)
    cuda = runner.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    history = cuda and a.memory_history
    if history:
        torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    sched.step()
    assert sched.chunked is req and req.kv_len == a.chunk, "the first step is not a chunk"
    peak, at_peak = None, None
    if history:
        torch.cuda.synchronize()
        trace = torch.cuda.memory._snapshot()["device_traces"][runner.device.index or 0]
        torch.cuda.memory._record_memory_history(enabled=None)
        at_peak = live_at_peak(trace)[1]
    storage = getattr(runner, "aux_storage", None)
    rows_bytes = 0 if path == "staged" or storage is None else \
        a.chunk * storage.buffer.shape[1] * storage.buffer.element_size()
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    sched.abort(req)
    out = {"path": path, "chunk": a.chunk, "allocator_peak_bytes": peak,
           "aux_rows_bytes": rows_bytes,
           "step_peak_bytes": None if peak is None else peak + rows_bytes,
           "aux_storage_bytes": None if storage is None else storage.nbytes()}
    if at_peak is not None:
        out["live_at_peak"] = at_peak
    del engine, runner, sched, storage
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def _stream(url: str, body: dict, times: list[float], done: threading.Event | None = None
            ) -> list[int]:
    """POST a streamed /generate; the arrival time of every new token in `times`."""
    ids: list[int] = []
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True},
                      timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            new = event["output_ids"][len(ids):] if "output_ids" in event else []
            now = time.perf_counter()
            times.extend([now] * len(new))
            ids += new
            if done is not None and done.is_set():
                break
    return ids


def _rate(times: list[float], start: float, end: float) -> float:
    n = sum(start <= t < end for t in times)
    return n / (end - start) if end > start else 0.0


def text_prompt(a: argparse.Namespace) -> list[int]:
    """`a.prompt_tokens` ids of GSM8K train problems and their solutions one after another,
    in the served model's tokenizer (as the server resolves it from the same flags)."""
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    _, tokenizer = resolve_model(ServerArgs.from_cli_args(
        parser.parse_args(["--model-path", a.model_path, *a.server_args])))
    ids: list[int] = []
    with gsm8k_path("train").open() as f:
        for line in f:
            item = json.loads(line)
            ids += tokenizer.encode(f"Question: {item['question']}\nAnswer: {item['answer']}\n\n")
            if len(ids) >= a.prompt_tokens:
                return ids[: a.prompt_tokens]
    raise ValueError(f"GSM8K train holds {len(ids)} tokens, fewer than --prompt-tokens "
                     f"{a.prompt_tokens}")


def long_prompt(a: argparse.Namespace, chunk: int, log: Path) -> dict:
    args = ["--model-path", a.model_path, "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", a.draft_path, "--device", a.device,
            "--context-length", str(a.context_length), "--chunked-prefill-size", str(chunk),
            "--max-running-requests", str(a.others + 1), *a.server_args]
    vocab = a.vocab
    g = torch.Generator().manual_seed(1)
    prompt = (text_prompt(a) if a.prompt == "gsm8k"
              else torch.randint(3, vocab, (a.prompt_tokens,), generator=g).tolist())
    greedy = {"temperature": 0, "ignore_eos": True}
    os.environ[STEP_PEAK_ENV] = "1"  # the server inherits it: max_step_peak_bytes
    with launched_server(args, log, timeout_s=1200) as url:
        info = httpx.get(f"{url}/get_server_info").json()
        # warm the kernels on a prompt of other tokens (no prefix cache hit), by default as
        # long as the measured one: a first prefill of a new length compiles kernel variants
        # (the unchunked 32k prompt's TTFT varied 1.16-1.65 s over calls after a 256-token
        # warm-up)
        warm = a.warm_tokens or len(prompt)
        httpx.post(f"{url}/generate", timeout=600, json={
            "input_ids": torch.randint(3, vocab, (warm,), generator=g).tolist(),
            "sampling_params": {**greedy, "max_new_tokens": 2}})
        times: list[list[float]] = [[] for _ in range(a.others)]
        done = threading.Event()
        threads = [threading.Thread(target=_stream, args=(url, {
            "input_ids": torch.randint(3, vocab, (16,), generator=g).tolist(),
            "sampling_params": {**greedy, "max_new_tokens": a.others_max_new}}, times[i], done))
            for i in range(a.others)]
        for t in threads:
            t.start()
        while sum(len(t) for t in times) < a.others * 4:  # every other request decoding
            time.sleep(0.01)
        before_start = time.perf_counter()
        time.sleep(a.baseline_s)
        sent = time.perf_counter()
        long_times: list[float] = []
        ids = _stream(url, {"input_ids": prompt,
                            "sampling_params": {**greedy, "max_new_tokens": a.long_max_new}},
                      long_times)
        first = long_times[0]
        others = [t for ts in times for t in ts]
        before = _rate(others, before_start, sent)
        during = _rate(others, sent, first)
        done.set()
        for t in threads:
            t.join()
        after = httpx.get(f"{url}/get_server_info").json()
    ttft = first - sent
    return {"chunk": chunk, "server_chunked_prefill_size": info["chunked_prefill_size"],
            "prompt_tokens": len(prompt), "ttft_s": ttft, "prefill_tok_s": len(prompt) / ttft,
            "max_step_peak_bytes": after["scheduler_stats"].get("max_step_peak_bytes"),
            "chunked_prefill_steps": after["scheduler_stats"]["chunked_prefill_steps"],
            # a mixed step replays a graph whose memory was taken at capture: no step peak
            "mixed_steps": after["scheduler_stats"].get("mixed_steps", 0),
            "others_decode_tok_s_before": before, "others_decode_tok_s_during": during,
            "others_kept": during / before if before else None, "output_ids": ids}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny presets, small sizes")
    p.add_argument("--device", default="cuda")
    p.add_argument("--step-preset", default="k3-shaped")
    p.add_argument("--chunk", type=int, default=4096)
    p.add_argument("--model-path", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--draft-path", default="qwen2.5-coder-1.5b-instruct-dflash-b16")
    p.add_argument("--vocab", type=int, default=151000, help="prompt ids are drawn below it")
    p.add_argument("--context-length", type=int, default=32768)
    p.add_argument("--prompt-tokens", type=int, default=32000)
    p.add_argument("--long-max-new", type=int, default=64)
    p.add_argument("--prompt", choices=["random", "gsm8k"], default="random",
                   help="the long prompt: random ids below --vocab, or real text (GSM8K train "
                        "problems and solutions in the model's tokenizer), whose greedy tokens "
                        "a real model does not leave near-tied")
    p.add_argument("--warm-tokens", type=int, default=None,
                   help="the warm-up prompt's tokens before the measured one (default: as "
                        "many as --prompt-tokens)")
    p.add_argument("--others", type=int, default=8)
    p.add_argument("--others-max-new", type=int, default=4096)
    p.add_argument("--baseline-s", type=float, default=2.0)
    p.add_argument("--memory-history", action="store_true",
                   help="(a): record CUDA memory history over each chunk step; the report "
                        "names the largest allocations live at its peak (live_at_peak)")
    p.add_argument("--skip-step", action="store_true", help="only (b)")
    p.add_argument("--skip-server", action="store_true", help="only (a)")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="more server flags, last on the line")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench_chunked_"))
    if a.smoke:
        a.device, a.step_preset, a.chunk = "cpu", "tiny-k3", 32
        a.model_path = tiny_checkpoint("tiny-llama", tmp)
        a.draft_path = tiny_checkpoint("tiny-llama-dflash", tmp)
        a.vocab, a.context_length, a.prompt_tokens = 256, 512, 200
        a.long_max_new, a.others, a.others_max_new, a.baseline_s = 8, 2, 400, 0.5
        a.server_args = [*a.server_args, "--max-total-tokens", "4096"]
    report: dict = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                    "args": {k: v for k, v in vars(a).items() if k != "server_args"}}
    if not a.skip_step:
        target, *steps = [chunk_step(a, path) for path in ("target", *PATHS)]
        report["target_chunk_step"] = target
        report["chunk_step"] = steps
        concat, floor = steps[0]["step_peak_bytes"], target["step_peak_bytes"]
        for s in steps:
            s["vs_concat"] = s["step_peak_bytes"] / concat if concat else None
            # what the draft's aux projection adds to the target's own chunk step
            s["above_target_bytes"] = None if floor is None else s["step_peak_bytes"] - floor
            s["above_target_vs_concat"] = (s["above_target_bytes"] / (concat - floor)
                                           if concat and floor is not None else None)
        print(f"{'path':>9} {'chunk':>6} {'step peak B':>14} {'aux rows B':>12} {'/concat':>8} "
              f"{'above target B':>15} {'/concat':>8}")
        print(f"{'target':>9} {target['chunk']:>6} {floor or 'n/a':>14}")

        def ratio(x: float | None) -> str:
            return f"{x:8.3f}" if x else f"{'n/a':>8}"

        for s in steps:
            print(f"{s['path']:>9} {s['chunk']:>6} {s['step_peak_bytes'] or 'n/a':>14} "
                  f"{s['aux_rows_bytes']:>12} {ratio(s['vs_concat'])} "
                  f"{s['above_target_bytes'] or 'n/a':>15} {ratio(s['above_target_vs_concat'])}")
    if not a.skip_server:
        runs = [long_prompt(a, n, tmp / f"server_{n}.log") for n in (a.chunk, -1)]
        report["long_prompt"] = runs
        report["same_tokens"] = runs[0]["output_ids"] == runs[1]["output_ids"]
        print(f"{'chunk':>6} {'TTFT s':>8} {'prefill tok/s':>14} {'step peak B':>14} "
              f"{'others tok/s before':>20} {'during':>8} {'kept':>6}")
        for r in runs:
            kept = f"{r['others_kept']:6.2f}" if r["others_kept"] is not None else "   n/a"
            print(f"{r['chunk']:>6} {r['ttft_s']:8.3f} {r['prefill_tok_s']:14.1f} "
                  f"{r['max_step_peak_bytes'] or 'n/a':>14} "
                  f"{r['others_decode_tok_s_before']:20.1f} "
                  f"{r['others_decode_tok_s_during']:8.1f} {kept}")
        print(f"same tokens chunked and unchunked: {report['same_tokens']}")
    text = json.dumps(report, indent=2)
    if a.out:
        Path(a.out).write_text(text)
    print(json.dumps({k: v for k, v in report.items() if k != "args"}, default=str)[:4000])
    return report


if __name__ == "__main__":
    main(sys.argv[1:])

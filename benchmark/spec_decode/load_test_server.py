"""Load test through the real HTTP server: concurrency, aborts, KV give-back, memory growth.

    python benchmark/spec_decode/load_test_server.py --out load_test.json -- \
        --model-path smollm2-135m-instruct --speculative-algorithm DFLASH \
        --speculative-draft-model-path smollm2-135m-instruct-dflash-b8 --dtype float32

Arguments after `--` start the server (`python -m sglang_aux.launch_server ...`); `--url`
targets one already running instead. Phases: (1) every greedy prompt alone, one after another
(the references); (2) `--num-requests` at once: greedy and seeded sampled requests of mixed
lengths, every `--abort-every`-th streamed and dropped after a few chunks; greedy outputs must
equal their references; seeded sampled ones are compared with their own sequential run too
(draws are keyed by seed and position, not by batch) and reported, since a logit that moves
in the last bit with the batch size may flip a draw (repeated prompts hit the prefix cache);
(3) once the prefix cache is flushed, the server must hold every KV slot and request row free
again; (4) `--long-steps` decode steps of concurrent long requests; the
device's allocated bytes when idle must not grow. Use float32 for the equality checks: in
bf16, GEMMs of different batch sizes may round near-ties differently.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sglang_aux.test.server_utils import launched_server

WORDS = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "a",
         "cat", "counts", "to", "twelve", "and", "Natalia", "sells", "48", "clips"]
TIMEOUT_S = 600


def _prompt(i: int) -> str:
    n = 3 + (i * 7) % 40  # mixed prompt lengths
    return " ".join(WORDS[(i + j) % len(WORDS)] for j in range(n)) + f" #{i}"


def _params(i: int, max_new: int) -> dict:
    base = {"max_new_tokens": max_new, "ignore_eos": True}
    if i % 2 == 0:
        return {**base, "temperature": 0}
    return {**base, "temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 1000 + i}


def _generate(client: httpx.Client, url: str, text: str, params: dict) -> list[int]:
    r = client.post(f"{url}/generate", json={"text": text, "sampling_params": params})
    r.raise_for_status()
    return r.json()["output_ids"]


def _stream_then_drop(client: httpx.Client, url: str, text: str, params: dict,
                      chunks: int) -> int:
    """Read `chunks` streamed chunks, then close the connection (an abort mid-stream)."""
    seen = 0
    body = {"text": text, "sampling_params": params, "stream": True}
    with client.stream("POST", f"{url}/generate", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= chunks:
                    break
    return seen


def _info(client: httpx.Client, url: str) -> dict:
    return client.get(f"{url}/get_server_info").json()


def _wait_idle(client: httpx.Client, url: str, timeout_s: float = 60.0) -> dict:
    """Server info once no request holds KV (aborts are applied between steps; the prefix
    cache's unlocked tokens are the only KV not free), after flushing that cache."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = _info(client, url)
        held = (info["max_total_num_tokens"] - info["available_kv_tokens"]
                - info["radix_cache_evictable_tokens"])
        if held == 0 and info["available_req_rows"] == info["max_req_rows"]:
            client.post(f"{url}/flush_cache").raise_for_status()
            return _info(client, url)
        if time.monotonic() > deadline:
            return info
        time.sleep(0.2)


def run(url: str, a: argparse.Namespace) -> dict:
    client = httpx.Client(timeout=TIMEOUT_S)
    n = a.num_requests
    lengths = [a.min_new + (i * 37) % (a.max_new - a.min_new + 1) for i in range(n)]
    aborted = {i for i in range(n) if a.abort_every and i % a.abort_every == a.abort_every - 1}
    checked = [i for i in range(n) if i not in aborted]
    start = time.perf_counter()
    reference = {i: _generate(client, url, _prompt(i), _params(i, lengths[i])) for i in checked}
    sequential_s = time.perf_counter() - start

    def one(i: int):
        if i in aborted:
            return _stream_then_drop(client, url, _prompt(i), _params(i, lengths[i]), chunks=3)
        return _generate(client, url, _prompt(i), _params(i, lengths[i]))

    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(one, range(n)))
    concurrent_s = time.perf_counter() - start
    mismatched = [i for i in checked if results[i] != reference[i]]
    greedy_mismatched = [i for i in mismatched if i % 2 == 0]
    idle = _wait_idle(client, url)
    kv_back = idle["available_kv_tokens"] == idle["max_total_num_tokens"]
    rows_back = idle["available_req_rows"] == idle["max_req_rows"]

    mem_before = idle["device_memory_allocated"]
    steps0 = idle["scheduler_stats"]["decode_steps"]
    long_params = {"max_new_tokens": a.long_max_new, "ignore_eos": True, "temperature": 0}
    samples = []
    with ThreadPoolExecutor(a.long_concurrency) as pool:
        while _info(client, url)["scheduler_stats"]["decode_steps"] - steps0 < a.long_steps:
            list(pool.map(lambda i: _generate(client, url, _prompt(i), long_params),
                          range(a.long_concurrency)))
            samples.append(_wait_idle(client, url)["device_memory_allocated"])
    after = _wait_idle(client, url)
    mem_after = after["device_memory_allocated"]
    growth = None if mem_before is None else mem_after - mem_before
    report = {
        "num_requests": n, "aborted": len(aborted), "checked": len(checked),
        "greedy_checked": sum(1 for i in checked if i % 2 == 0),
        "greedy_mismatched": greedy_mismatched,
        "sampled_mismatched": [i for i in mismatched if i % 2],
        "kv_slots_back": kv_back, "req_rows_back": rows_back,
        "sequential_s": round(sequential_s, 2), "concurrent_s": round(concurrent_s, 2),
        "long_decode_steps": after["scheduler_stats"]["decode_steps"] - steps0,
        "device_memory_allocated_before": mem_before, "device_memory_allocated_after": mem_after,
        "idle_memory_samples": samples, "memory_growth_bytes": growth,
        "final_kv_slots_back": after["available_kv_tokens"] == after["max_total_num_tokens"],
        "radix_cache_hit_tokens": after["radix_cache_hit_tokens"],
        # the kinds of steps that ran (prefill, decode, mixed), after each phase
        "scheduler_stats_after_concurrent": idle["scheduler_stats"],
        "scheduler_stats": after["scheduler_stats"],
    }
    report["ok"] = (not greedy_mismatched and kv_back and rows_back
                    and report["final_kv_slots_back"]
                    and (growth is None or growth <= a.mem_tolerance_bytes))
    return report


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    server_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running server (else start one)")
    p.add_argument("--num-requests", type=int, default=128)
    p.add_argument("--min-new", type=int, default=8)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--abort-every", type=int, default=8)
    p.add_argument("--long-steps", type=int, default=10_000)
    p.add_argument("--long-concurrency", type=int, default=32)
    p.add_argument("--long-max-new", type=int, default=512)
    p.add_argument("--mem-tolerance-bytes", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(own)
    if a.url:
        report = run(a.url, a)
    else:
        with tempfile.TemporaryDirectory() as tmp, \
                launched_server(server_args, Path(tmp) / "server.log", timeout_s=600) as url:
            report = run(url, a)
    brief = {k: v for k, v in report.items() if k != "idle_memory_samples"}
    print("\n".join(f"{k:>32}: {v}" for k, v in brief.items()))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)

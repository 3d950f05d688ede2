"""Served throughput of DFlash against target-only: a closed loop of requests, prefills and
mixed steps included, through the engine's own scheduler.

    python benchmark/spec_decode/bench_dflash_served.py --bs 1 8 32 --out dflash_served.json
    python benchmark/spec_decode/bench_dflash_served.py --smoke     # tiny presets, CPU

`bench_dflash_step.py` times decode steps of a fixed batch; a server also prefills: the GSM8K
harness's requests end after ~122 tokens and a new one arrives at once, its prompt a cached
5-shot prefix and ~78 new tokens. This bench runs that traffic without HTTP, on the same
random-weight presets (`--load-format dummy`, default `qwen2.5-1.5b-shaped` and its block-16
draft). For each concurrency `bs`, `bs` requests live at all times: each prompt is one shared
random prefix of `--context` - `--new-prompt-tokens` tokens (the prefix cache holds it once a
request has finished) and `--new-prompt-tokens` fresh ones; each request's output length is
drawn uniformly from [L/2, 3L/2], L = `--output-tokens` (greedy, EOS ignored), and when one
finishes the next is added before the following scheduler step. After a warm-up (below), the
engine's scheduler steps `--steps` times, timed as the step bench times them (CUDA events
between steps, wall time on the CPU), and every token the requests emit meanwhile counts.

Configurations (`--configs`): `target`, `target_mixed`, `dflash`, `dflash_mixed`; the `_mixed`
ones run arrivals' prefills inside the decode / verify forward (`--enable-mixed-chunk`), the
others prefill them in steps of their own; `target_mixed_delay` and `dflash_mixed_delay` (not
run by default) also hold arrivals back until a mixed forward takes several
(`--enable-prefill-delayer`). DFlash runs static verify at the draft length
schedule the server derives from `--profile` and the step costs it measures at start-up (the
step bench's `--schedule derived`; `--step-costs FILE` instead of measuring), its verdicts
forced to draws from the profile by the step bench's `ForcedAcceptance` (a verify step of width
1, plain decoding, drafts nothing and is not forced).

Per configuration and concurrency: tok/s, ms per scheduler step, the scheduler's statistics
over the timed steps (prefill, decode and mixed steps, the requests they ran, ...), emitted
tokens per request-step (over the request rows of its decode, verify and mixed steps), and for
DFlash the accept histogram the requests recorded and the one forced on the rows whose tokens
were read. Ratios per concurrency: dflash / target, dflash_mixed / target_mixed, and the best
of each (the higher of plain and mixed tok/s).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_dflash_step import (  # this script's folder is on sys.path
    DEFAULT_PROFILE,
    PROFILES,
    ForcedAcceptance,
    StepClock,
    add_engine_flags,
    engine_kwargs,
    parse_with_smoke,
    release_device_memory,
    request_counters,
    stratified,
    verify_width_of,
)
from bench_dflash_step import SMOKE as STEP_SMOKE

from sglang_aux.srt.configs.acceptance_profile import AcceptanceProfile
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker

CONFIGS = ("target", "target_mixed", "dflash", "dflash_mixed")
# also measurable (`--configs`): mixed steps whose arrivals the prefill delayer gathers
DELAYED = ("target_mixed_delay", "dflash_mixed_delay")
SMOKE = {**{k: STEP_SMOKE[k] for k in ("target", "draft", "device", "overlap_schedule",
                                       "profile")},
         "bs": [1, 4], "context": 24, "new_prompt_tokens": 8, "output_tokens": 8, "steps": 24,
         "step_costs": str(PROFILES / "tiny-llama-dflash-b4_step_costs_synthetic.json")}
# a running max, not a count: no change over a window
NOT_ADDITIVE = {"max_step_peak_bytes"}


class ClosedLoop:
    """`bs` requests live at all times on `engine`'s scheduler: a request that finishes is
    replaced right after the scheduler step that finished it."""

    def __init__(self, engine: Engine, bs: int, args: argparse.Namespace):
        self.engine, self.sched = engine, engine.scheduler
        self.g = torch.Generator().manual_seed(args.seed + bs)
        self.vocab = engine.model_config.hf_config.vocab_size
        self.new_tokens, self.lengths = args.new_prompt_tokens, output_lengths(args)
        self.prefix = self._random_tokens(args.context - args.new_prompt_tokens)
        self.reqs: list[Req] = []  # every request, in order of arrival
        self.live: list[Req] = []
        self.finished_at: dict[int, int] = {}  # id(request) -> the step that finished it
        self.steps = 0  # scheduler steps so far
        for _ in range(bs):
            self._add()

    def _random_tokens(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab, (n,), generator=self.g).tolist()

    def _add(self) -> None:
        lo, hi = self.lengths
        params = {"temperature": 0.0, "ignore_eos": True,
                  "max_new_tokens": int(torch.randint(lo, hi + 1, (1,), generator=self.g))}
        req = self.engine.make_request(
            input_ids=self.prefix + self._random_tokens(self.new_tokens), sampling_params=params)
        self.sched.add_request(req)
        self.reqs.append(req)
        self.live.append(req)

    def step(self) -> None:
        self.sched.step()
        done = [r for r in self.live if r.finished]
        for r in done:
            self.finished_at[id(r)] = self.steps
            self._add()
        self.live = [r for r in self.live if not r.finished]
        self.steps += 1

    def close(self) -> None:
        for r in self.live:
            self.sched.abort(r)
        self.sched.step()  # completes the step still in flight


class ServedForcing(ForcedAcceptance):
    """`ForcedAcceptance` that also keeps, per verify step, the scheduler step that launched
    it and its requests: a batch changes from step to step here, and under overlap a request
    that finished still runs one more step whose row nobody reads."""

    def __init__(self, loop: ClosedLoop, worker: DFlashWorker, draws: torch.Tensor,
                 profile: AcceptanceProfile):
        # static verify ranks no confidences: the confidence mode is idle
        super().__init__(worker, draws, profile, "profile")
        self.loop = loop
        self.batches: list[tuple[int, list[Req]]] = []

    def _propose(self, reqs: list[Req], fb) -> torch.Tensor:
        self.batches.append((self.loop.steps, list(reqs)))
        return super()._propose(reqs, fb)

    def read_histogram(self, window: range, lag: int, width: int) -> list[int]:
        """The forced counts of the rows whose tokens the host read in the scheduler steps
        `window` (a verify step launched in scheduler step j is read in step j + lag)."""
        log, counts = self.log.cpu(), [0] * width
        for k, (launched, reqs) in enumerate(self.batches):
            read = launched + lag
            if read not in window:
                continue
            for i, r in enumerate(reqs):
                if self.loop.finished_at.get(id(r), read) >= read:  # live when read
                    counts[log[k % len(log), i]] += 1
        return counts


def output_lengths(args: argparse.Namespace) -> tuple[int, int]:
    """The range output lengths are drawn from: [L/2, 3L/2], centred on L exactly."""
    half = args.output_tokens // 2
    return args.output_tokens - half, args.output_tokens + half


def scheduler_stats(engine: Engine) -> dict:
    return dict(engine.scheduler.stats) | engine.worker.step_stats


def forward_counts(engine: Engine) -> dict[str, int]:
    """Forwards so far by runner, mode and path (`/get_server_info` `forwards`), flat:
    `"target MIXED eager": n`, ...: a step that misses its graph shows as eager."""
    worker = engine.worker
    runners = {"target": worker.model_runner}
    if isinstance(worker, DFlashWorker):
        runners["draft"] = worker.draft_runner
    return {f"{name} {mode} {path}": n for name, runner in runners.items()
            for mode, counts in runner.forward_counts.items() for path, n in counts.items()}


def run_served(engine: Engine, bs: int, args: argparse.Namespace, width: int,
               profile: AcceptanceProfile | None = None) -> dict:
    """Warm the closed loop of `bs` requests up, step it `--steps` times; the timed steps'
    mean ms, the tokens emitted over them and the statistics' change. With `profile`, DFlash
    verdicts forced to draws from it."""
    loop = ClosedLoop(engine, bs, args)
    lag = int(engine.server_args.resolved_overlap_schedule())
    forced = None
    if profile is not None:
        # the window's verify steps and the one in flight at its end: no row the window reads
        # is overwritten before it is read (the warm-up's steps wrap around)
        rows = args.steps + 1
        g = torch.Generator().manual_seed(args.seed + bs)
        forced = ServedForcing(loop, engine.worker,
                               stratified(profile, rows * bs, g).view(rows, bs), profile)
    # Steady state once every request of the first wave has finished: no request of that
    # synchronised start is left, the shared prefix is cached, and the live requests' starts
    # spread over a whole output length.
    first_wave = list(loop.reqs)
    while not all(r.finished for r in first_wave):
        loop.step()
    warmup, stats, forwards = loop.steps, scheduler_stats(engine), forward_counts(engine)
    before = request_counters(loop.reqs, width)  # the window's arrivals start from nothing
    clock = StepClock(engine.worker.model_runner.device)
    clock.mark()
    for _ in range(args.steps):
        loop.step()
        clock.mark()
    ms = clock.mean_ms()
    after, now = request_counters(loop.reqs, width), scheduler_stats(engine)
    loop.close()
    delta = [b - a for a, b in zip(before, after, strict=True)]
    stats = {k: now[k] - stats[k] for k in now if k not in NOT_ADDITIVE}
    forwards = {k: n - forwards.get(k, 0) for k, n in forward_counts(engine).items()}
    stepped = stats["decode_batch_requests"]  # request rows of decode, verify and mixed steps
    r = {"bs": bs, "step_ms": ms, "tok_s": delta[0] / (args.steps * ms) * 1e3,
         "emitted": delta[0], "tokens_per_request_step": delta[0] / stepped if stepped else None,
         "steps": args.steps, "warmup_steps": warmup, "stats": stats, "forwards": forwards,
         "requests_started": len(loop.reqs), "requests_finished": len(loop.finished_at),
         "finished_in_window": sum(s >= warmup for s in loop.finished_at.values())}
    if forced is not None:
        window = range(warmup, warmup + args.steps)
        r |= {"accept_histogram": delta[3:],
              "forced_histogram": forced.read_histogram(window, lag, width)}
    return r


def config_kwargs(args: argparse.Namespace, config: str) -> dict:
    """The engine of `config`: the step bench's (DFlash: static verify at the derived
    schedule), mixed steps on or off, explicitly either way."""
    mode = "static" if config.startswith("dflash") else None
    kw = engine_kwargs(args, mode) | {"enable_mixed_chunk": "_mixed" in config,
                                      "enable_prefill_delayer": config.endswith("_delay")}
    if args.max_running_requests is not None:
        kw["max_running_requests"] = args.max_running_requests
    if "_mixed" in config:
        kw["cuda_graph_tokens_mixed"] = args.mixed_tokens
    return kw


def measure_config(args: argparse.Namespace, config: str, profile: AcceptanceProfile | None
                   ) -> tuple[list[dict], dict | None]:
    """`config`'s row at each concurrency, and for DFlash the schedule its engine ran (its
    `/get_server_info` field)."""
    engine = Engine(ServerArgs(**config_kwargs(args, config)))
    dflash = config.startswith("dflash")
    rows = []
    for bs in args.bs:
        row = {"config": config, **run_served(engine, bs, args, args.verify_width if dflash
                                              else 1, profile if dflash else None)}
        if dflash:  # the verify width the schedule gives a full batch, the profile cut there
            width = engine.worker.draft_len.width(bs)
            row |= {"verify_width": width,
                    "profile_tokens_per_step": profile.truncated(width).tokens_per_step}
        rows.append(row)
    server = (engine.worker.server_info()["speculative_draft_len_schedule"] if dflash
              else None)
    engine.shutdown()
    del engine
    release_device_memory()
    return rows, server


def ratios(rows: list[dict], batch_sizes: list[int]) -> list[dict]:
    """Per concurrency, the tok/s quotients of the configurations measured: dflash / target,
    dflash_mixed / target_mixed, dflash_mixed_delay / target_mixed_delay, and the best of each
    side (plain, mixed or delayed)."""
    tok = {(r["config"], r["bs"]): r["tok_s"] for r in rows}
    out = []
    for bs in batch_sizes:
        x = {"bs": bs}
        for variant in ("", "_mixed", "_mixed_delay"):
            num, den = f"dflash{variant}", f"target{variant}"
            if (num, bs) in tok and (den, bs) in tok:
                x[f"{num}/{den}"] = tok[num, bs] / tok[den, bs]
        best = [max((tok[c, bs] for c in (side, f"{side}_mixed", f"{side}_mixed_delay")
                     if (c, bs) in tok), default=None) for side in ("dflash", "target")]
        if None not in best:
            x["best_dflash/best_target"] = best[0] / best[1]
        out.append(x)
    return out


def print_table(rows: list[dict], by_bs: list[dict], header: bool = True) -> None:
    if header:
        print(f"{'config':>12} {'bs':>4} {'step ms':>8} {'tok/s':>9} {'prefill':>7} "
              f"{'decode':>6} {'mixed':>5} {'tok/req-step':>12} {'finished':>8}")
    for r in rows:
        s, per_step = r["stats"], r["tokens_per_request_step"]
        print(f"{r['config']:>12} {r['bs']:>4} {r['step_ms']:>8.3f} {r['tok_s']:>9.0f} "
              f"{s['prefill_steps']:>7} {s['decode_steps']:>6} {s['mixed_steps']:>5} "
              f"{per_step or float('nan'):>12.3f} {r['finished_in_window']:>8}")
    for x in by_bs:
        print(f"bs {x['bs']}: " + ", ".join(f"{k} {v:.2f}x" for k, v in x.items() if k != "bs"))
    sys.stdout.flush()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-1.5b-shaped")
    p.add_argument("--draft", default="qwen2.5-1.5b-shaped-dflash")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE))
    p.add_argument("--step-costs", default=None,
                   help="the DFlash servers' --speculative-step-costs (default: measured at "
                        "start-up, as a server does)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS + DELAYED)
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32],
                   help="concurrent requests (each a closed loop of its own)")
    p.add_argument("--context", type=int, default=900, help="prompt tokens per request")
    p.add_argument("--new-prompt-tokens", type=int, default=78,
                   help="of them, fresh for each request after the shared prefix")
    p.add_argument("--output-tokens", type=int, default=122,
                   help="mean output tokens per request, each drawn from [L/2, 3L/2]")
    p.add_argument("--steps", type=int, default=400, help="timed scheduler steps")
    p.add_argument("--mixed-tokens", type=int, nargs="+", default=None,
                   help="the mixed configurations' arrival token counts to capture graphs for "
                        "(--cuda-graph-tokens-mixed; default: the server's, 2x apart)")
    p.add_argument("--max-running-requests", type=int, default=None,
                   help="the engines' (default: the largest --bs). Above the concurrency, rows "
                        "stay free, as in a server started for more clients: only then does "
                        "the prefill delayer hold arrivals back")
    p.add_argument("--seed", type=int, default=0, help="of the prompts, lengths and draws")
    add_engine_flags(p)
    p.add_argument("--smoke", action="store_true",
                   help="tiny presets on the CPU, short requests, a few steps (the CI test)")
    p.add_argument("--out", default="benchmark/spec_decode/dflash_served.json")
    args = parse_with_smoke(p, argv, SMOKE)
    if args.steps < 1 or min(args.bs) < 1 or args.output_tokens < 1:
        p.error("--steps, every --bs and --output-tokens must be >= 1")
    if args.max_running_requests is not None and args.max_running_requests < max(args.bs):
        p.error(f"--max-running-requests must be >= the largest --bs {max(args.bs)}, got "
                f"{args.max_running_requests}")
    if not 0 <= args.new_prompt_tokens < args.context:
        p.error(f"--new-prompt-tokens must be in [0, --context {args.context}) (each prompt "
                f"is a shared prefix and that many fresh tokens), got {args.new_prompt_tokens}")
    args.configs = list(dict.fromkeys(args.configs))
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # what the step bench's engine_kwargs reads: the server's derived schedule (its step
    # costs measured at start-up), requests up to the longest output drawn
    args.schedule = "derived"
    args.max_new_tokens = output_lengths(args)[1]
    args.verify_width, profile = None, None
    # Everything that can be wrong with the input fails here, before any model loads.
    try:
        if any(c.startswith("dflash") for c in args.configs):
            args.verify_width = verify_width_of(args.draft)
            profile = AcceptanceProfile.load(args.profile, args.verify_width)
        for config in args.configs:
            ServerArgs(**config_kwargs(args, config))
    except ValueError as e:
        raise SystemExit(f"bench_dflash_served: {e}") from None
    rows, servers = [], {}
    for i, config in enumerate(args.configs):
        config_rows, server = measure_config(args, config, profile)
        rows += config_rows
        if server is not None:
            servers[config] = server
        # written and printed after each configuration: a run cut by a time limit keeps
        # the configurations it finished
        report = _report(args, rows, servers, profile)
        Path(args.out).write_text(json.dumps(report, indent=1))
        last = i == len(args.configs) - 1
        print_table(config_rows, report["ratios"] if last else [], header=i == 0)
    return report


def _report(args: argparse.Namespace, rows: list[dict], servers: dict,
            profile: AcceptanceProfile | None) -> dict:
    report = {"args": vars(args), "rows": rows, "ratios": ratios(rows, args.bs),
              "server_schedule": servers}
    if profile is not None:
        report["profile"] = {"path": profile.path, "probs": profile.probs,
                             "tokens_per_step": profile.tokens_per_step}
    return report


if __name__ == "__main__":
    main()

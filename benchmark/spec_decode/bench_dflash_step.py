"""DFlash decode step cost at a forced acceptance profile, against target-only decoding.

    python benchmark/spec_decode/bench_dflash_step.py --bs 1 8 32 --out dflash_step.json
    python benchmark/spec_decode/bench_dflash_step.py --smoke     # tiny presets, CPU

Random weights (`--load-format dummy`) on a preset pair (default `qwen2.5-1.5b-shaped` and its
block-16 draft), so nothing is staged. For each batch size, `bs` requests of `--context` random
prompt tokens are prefilled, then the engine's own scheduler steps them (greedy, EOS ignored,
the overlap scheduler where the server has it): `--warmup` steps, then `--steps` timed ones
(CUDA events between steps on CUDA, wall time on the CPU), first on a target-only engine, then
on a DFlash engine per `--verify-modes` (the server's `--speculative-verify-mode`).

Random weights accept nothing worth measuring, so the bench forces each verify step's accepted
proposals to draws from `--profile` (a JSON file: `accept_histogram`, P(accepted = a) for
a = 0..W-1, and where it came from; `profiles/`). It does so through the DFlash worker's two
seams, from outside: `propose` (after the draft forward) and `on_aux_consumed` (after the
verify forward, before the worker advances each request by its verdict). The verdict's count
becomes the draw (at most the request's verified proposals under compact verify); the
emitted tokens stay the target's argmax row, as if the draft had proposed the target's tokens
that far. Draft forward, verify forward, commit and acceptance all run as in the server; the
forcing adds one or two small kernels per step. Under compact verify the draft's confidences
(which rank what is verified) are forced too, `--compact-confidence`: `profile`, every
request's the profile's per-position conditional rates (a calibrated draft that cannot tell
requests apart), or `oracle`, 1 for exactly the proposals its draw accepts. The draws of the
timed steps are stratified: their histogram is the profile's, rounded.

Per batch size and mode: step ms, the profile's tokens per step (accepted + 1), the tokens per
step the worker emitted, DFlash and target-only tok/s, their ratio, and verify tokens per
emitted token (the harness's `verify_tokens_per_accepted`). The step-cost model: docs/dspark.md.
The DFlash engines run one verify width at every batch size (`--speculative-verify-width w
--speculative-draft-len-schedule 1:w`): the draft's block size W, or each of `--widths`, the
forced profile truncated to w (an acceptance of w - 1 or more proposals counts as w - 1): a
narrower static verify's cost and tokens, which the draft length schedule trades.
Under compact verify the report adds `step_costs` (the draft graph per batch size, the
ragged verify graph per token bucket, replayed over padding rows as the server does at
start-up, and what a request's context of `--context` tokens adds to each; the file
`--speculative-step-costs` reads) and `draft_len_schedule`, the schedule
the server derives from them and the profile (`speculative/draft_len_planner.py`); each
compact row adds `predicted_step_ms` (those costs at its batch size and verified tokens) and
`step_ms_over_predicted`, the share of a real step the costs leave out.
With `--schedule derived` the DFlash engines run the schedule the server derives at start-up
from `--profile` (`--speculative-acceptance-profile`) and the step costs (measured, or
`--step-costs`): static verify's narrower graphs, each batch size's row at its width, the
draws cut to its proposals; the report's `server_schedule` gives each engine's schedule.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from pathlib import Path

import torch

from sglang_aux.srt.configs.acceptance_profile import AcceptanceProfile
from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative.dflash_worker import DFlashWorker
from sglang_aux.srt.speculative.draft_len_planner import derive_widths
from sglang_aux.srt.speculative.step_cost_probe import measure_step_costs

PROFILES = Path(__file__).resolve().parent / "profiles"
DEFAULT_PROFILE = PROFILES / "qwen2.5-coder-1.5b-dflash-b16_gsm8k.json"
SMOKE = {"target": "tiny-llama", "draft": "tiny-llama-dflash", "bs": [1, 4], "context": 24,
         "warmup": 2, "steps": 8, "device": "cpu", "overlap_schedule": "on",
         "profile": str(PROFILES / "tiny-llama-dflash-b4_synthetic.json")}
CONFIDENCES = ("profile", "oracle")
# --overlap-schedule -> ServerArgs.disable_overlap_schedule (auto: the server's default, on
# where the device runs apart from the host)
OVERLAP = {"auto": None, "on": False, "off": True}


def verify_width_of(draft: str) -> int:
    """The draft's block size (its verify width), from its preset or its folder's config."""
    config = PRESETS.get(draft)
    if config is None:
        try:
            config = json.loads((Path(draft) / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"draft {draft}: neither a preset nor a model folder ({e})") from None
    return config["dflash_config"]["block_size"]


def stratified(profile: AcceptanceProfile, n: int, g: torch.Generator) -> torch.Tensor:
    """`n` accepted counts whose histogram is the profile's times n, rounded (largest
    remainders), in random order."""
    exact = [p * n for p in profile.probs]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda a: counts[a] - exact[a])
    for a in by_remainder[: n - sum(counts)]:
        counts[a] += 1
    values = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return values[torch.randperm(n, generator=g)]


class ForcedAcceptance:
    """Forces a DFlash worker's verify verdicts to `draws[k, :bs]` at its k-th verify step,
    through the worker's `propose` and `on_aux_consumed` seams; `log[k, :bs]` keeps what was
    forced (at most each request's verified proposals under compact verify)."""

    def __init__(self, worker: DFlashWorker, draws: torch.Tensor, profile: AcceptanceProfile,
                 confidence: str):
        device = worker.target_runner.device
        self.worker, self.confidence = worker, confidence
        self.draws = draws.to(device)
        self.log = torch.zeros_like(self.draws)
        self.rates = torch.tensor(profile.conditional_rates(), device=device)
        self.offsets = torch.arange(worker.verify_width - 1, device=device)
        self.step = 0  # verify steps so far
        self._bs: int | None = None  # set by a draft forward, until its verify consumes it
        worker.propose = self._propose
        worker.on_aux_consumed = self._force

    def _propose(self, reqs: list[Req], _fb) -> torch.Tensor:
        bs, proposals = len(reqs), self.worker.proposals
        self._bs = bs
        if self.worker.verify_plan.compact:
            if self.confidence == "profile":
                proposals.confidence[:bs] = self.rates
            else:
                draws = self.draws[self.step % len(self.draws), :bs]
                proposals.confidence[:bs] = (self.offsets < draws[:, None]).float()
        return proposals.tokens[:bs]

    def _force(self) -> None:
        bs = self._bs
        if bs is None:  # a prefill chunk's forward, no verify
            return
        k = self.step % len(self.draws)
        forced, plan = self.log[k, :bs], self.worker.verify_plan
        if plan.compact:
            torch.minimum(self.draws[k, :bs], plan.verify_lens[:bs] - 1, out=forced)
        else:  # the proposals the step's width verifies (a derived schedule's, or all)
            torch.clamp_max(self.draws[k, :bs], self.worker.draft_len.width(bs) - 1,
                            out=forced)
        self.worker.acceptance.verdicts[:bs, 0] = forced
        self.step, self._bs = self.step + 1, None


class StepClock:
    """Marks between scheduler steps: CUDA events on CUDA (the device's time from one mark
    to the next), the host's clock elsewhere."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def mean_ms(self) -> float:
        first, last = self.marks[0], self.marks[-1]
        if self.cuda:
            last.synchronize()
            return first.elapsed_time(last) / (len(self.marks) - 1)
        return (last - first) * 1e3 / (len(self.marks) - 1)


def request_counters(reqs: list[Req], width: int) -> list[int]:
    """Emitted tokens, verify steps, verify tokens, then the accept histogram (summed)."""
    hist = [sum(r.spec_accept_histogram[a] if r.spec_accept_histogram else 0 for r in reqs)
            for a in range(width)]
    return [sum(len(r.output_ids) for r in reqs), sum(r.spec_verify_ct for r in reqs),
            sum(r.spec_verify_tokens for r in reqs), *hist]


def run_steps(engine: Engine, bs: int, args: argparse.Namespace, width: int,
              forced: ForcedAcceptance | None = None) -> dict:
    """Prefill `bs` requests, step them `warmup` then `steps` times; the timed steps' mean ms
    and the counters' change over them. `forced` counts verify steps from the first one of
    the whole batch."""
    sched = engine.scheduler
    g = torch.Generator().manual_seed(bs)
    vocab = engine.model_config.hf_config.vocab_size
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": args.max_new_tokens}
    reqs = [engine.make_request(input_ids=torch.randint(0, vocab, (args.context,),
                                                        generator=g).tolist(),
                                sampling_params=params) for _ in range(bs)]
    for r in reqs:
        sched.add_request(r)
    while sched.waiting or len(sched.running) < bs:
        sched.step()
    if forced is not None:
        forced.step = 0
    for _ in range(args.warmup):
        sched.step()
    clock = StepClock(engine.worker.model_runner.device)
    clock.mark()
    before = request_counters(reqs, width)
    for _ in range(args.steps):
        sched.step()
        clock.mark()
    after = request_counters(reqs, width)
    ms = clock.mean_ms()
    if any(r.finished for r in reqs):
        raise RuntimeError("a request finished inside the timed steps: raise --max-new-tokens")
    for r in reqs:
        sched.abort(r)
    sched.step()  # completes the step still in flight
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return {"step_ms": ms, "emitted": delta[0], "verify_steps": delta[1],
            "verify_tokens": delta[2], "accept_histogram": delta[3:]}


def engine_kwargs(args: argparse.Namespace, mode: str | None, width: int | None = None
                  ) -> dict:
    kw = {"model_path": args.target, "load_format": args.load_format, "device": args.device,
          "max_running_requests": max(args.bs), "speculative_step_cost_context": args.context,
          "disable_overlap_schedule": OVERLAP[args.overlap_schedule],
          # decode steps only (the batch is prefilled before them): no mixed graphs to capture
          "enable_mixed_chunk": False,
          "context_length": args.context + args.max_new_tokens + 64}
    if mode is None:
        return kw
    width = width or args.verify_width
    kw |= {"speculative_algorithm": "DFLASH", "speculative_draft_model_path": args.draft,
           "speculative_verify_mode": mode, "speculative_verify_width": width}
    if args.schedule == "derived":
        # the server's own schedule, derived from the profile and the step costs
        kw |= {"speculative_acceptance_profile": args.profile,
               "speculative_step_costs": args.step_costs}
    else:
        # one verify width at every batch size (the draft's, or a narrower one `--widths`
        # asks for), the forced profile truncated to it
        kw["speculative_draft_len_schedule"] = f"1:{width}"
    if mode == "compact":
        kw |= {"compact_verify_budget_frac": args.compact_verify_budget_frac,
               "compact_verify_max_tokens": args.compact_verify_max_tokens}
    return kw


def schedule_report(worker: DFlashWorker, profile: AcceptanceProfile
                    ) -> tuple[dict, StepCosts]:
    """A compact engine's step costs, measured as the server measures them at start-up (the
    format `--speculative-step-costs` reads), and the draft length schedule the server would
    derive from them and the profile; and the costs."""
    draft = worker.draft_runner.step_graphs
    costs = measure_step_costs(draft, worker.target_runner.step_graphs,
                               context=worker.step_cost_context,
                               ragged_lens=worker.verify_plan.verify_lens)
    widths = derive_widths([x.step_bs for x in draft.layouts], costs,
                           profile.conditional_rates(), worker.verify_plan.budget)
    return {"step_costs": costs.to_json(),
            "draft_len_schedule": str(DraftLenSchedule.of_widths(widths))}, costs


def measure_dflash(args: argparse.Namespace, mode: str, profile: AcceptanceProfile,
                   target: dict[int, dict]) -> tuple[list[dict], dict | None, dict]:
    """The mode's rows at `profile`'s verify width, and under compact verify its
    `schedule_report`, and the schedule the engine ran (its `/get_server_info` field); with
    `--schedule derived`, each row at the width the server's schedule gives its batch
    size."""
    width = len(profile.probs)
    engine = Engine(ServerArgs(**engine_kwargs(args, mode, width)))
    derived = args.schedule == "derived"
    schedule, costs = (schedule_report(engine.worker, profile) if mode == "compact"
                       else (None, None))
    # the steps whose verdicts the timed window's counters read: one earlier with overlap
    lag = int(engine.server_args.resolved_overlap_schedule())
    rows = []
    for bs in args.bs:
        g = torch.Generator().manual_seed(args.seed + bs)
        first, total = args.warmup - lag, args.warmup + args.steps + 2
        draws = stratified(profile, total * bs, g).view(total, bs)  # outside the window
        draws[first : first + args.steps] = stratified(profile, args.steps * bs, g).view(
            args.steps, bs)
        forced = ForcedAcceptance(engine.worker, draws, profile, args.compact_confidence)
        r = run_steps(engine, bs, args, width, forced)
        window = forced.log[first : first + args.steps].flatten().cpu()
        r["forced_histogram"] = torch.bincount(window, minlength=width).tolist()
        t = target[bs]
        tokens = r["emitted"] / r["verify_steps"]
        # a derived schedule's static step verifies its batch size's width: the profile cut
        step_width = engine.worker.draft_len.width(bs) if derived else width
        expected = (profile.truncated(step_width) if mode == "static" else profile)
        rows.append({
            "mode": mode, "width": step_width, "bs": bs, "step_ms": r["step_ms"],
            "target_step_ms": t["step_ms"],
            "step_cost": r["step_ms"] / t["step_ms"],
            "profile_tokens_per_step": expected.tokens_per_step, "tokens_per_step": tokens,
            "dflash_tok_s": bs * tokens / r["step_ms"] * 1e3, "target_tok_s": t["tok_s"],
            "ratio": tokens * t["step_ms"] / r["step_ms"],
            "verify_tokens_per_accepted": r["verify_tokens"] / r["emitted"],
            "accept_histogram": r["accept_histogram"],
            "forced_histogram": r["forced_histogram"], "steps": args.steps})
        if costs is not None:
            # what the schedule's derivation takes this step to cost: the draft graph and the
            # ragged verify graph of the tokens it verified, timed over padding rows, and
            # what its requests' contexts add
            tokens = math.ceil(r["verify_tokens"] / args.steps)
            rows[-1]["predicted_step_ms"] = (costs.draft(bs) + costs.verify(tokens)
                                             + costs.context_cost(bs, drafted=True))
            rows[-1]["step_ms_over_predicted"] = r["step_ms"] / rows[-1]["predicted_step_ms"]
    server = engine.worker.server_info()["speculative_draft_len_schedule"]
    if derived and engine.worker.draft_len.costs is not None:
        # what the server derived its schedule from (static: its narrower drafts' too)
        server["costs"] = engine.worker.draft_len.costs.to_json()
    engine.shutdown()
    del engine, forced
    release_device_memory()
    return rows, schedule, server


def measure_target(args: argparse.Namespace) -> dict[int, dict]:
    engine = Engine(ServerArgs(**engine_kwargs(args, None)))
    out = {}
    for bs in args.bs:
        r = run_steps(engine, bs, args, 1)
        out[bs] = {"bs": bs, "step_ms": r["step_ms"],
                   "tok_s": r["emitted"] / args.steps / r["step_ms"] * 1e3}
    engine.shutdown()
    del engine
    release_device_memory()
    return out


def release_device_memory() -> None:
    """After the last reference to an engine is gone: its device memory back, before the
    next engine sizes its KV pool."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def best_widths(rows: list[dict]) -> dict[str, dict[int, tuple[int, float]]]:
    """Per mode and batch size, the verify width whose DFlash / target-only ratio is highest,
    with that ratio."""
    best: dict[str, dict[int, tuple[int, float]]] = {}
    for r in rows:
        by_bs = best.setdefault(r["mode"], {})
        if r["bs"] not in by_bs or r["ratio"] > by_bs[r["bs"]][1]:
            by_bs[r["bs"]] = (r["width"], r["ratio"])
    return best


def print_table(rows: list[dict]) -> None:
    print(f"{'mode':>8} {'width':>5} {'bs':>4} {'step ms':>8} {'target ms':>9} {'cost':>6} "
          f"{'tok/step':>8} {'profile':>7} {'tok/s':>9} {'target tok/s':>12} {'ratio':>6} "
          f"{'verify/tok':>10}")
    for r in rows:
        print(f"{r['mode']:>8} {r['width']:>5} {r['bs']:>4} {r['step_ms']:>8.3f} "
              f"{r['target_step_ms']:>9.3f} "
              f"{r['step_cost']:>5.2f}x {r['tokens_per_step']:>8.3f} "
              f"{r['profile_tokens_per_step']:>7.3f} {r['dflash_tok_s']:>9.0f} "
              f"{r['target_tok_s']:>12.0f} {r['ratio']:>5.2f}x "
              f"{r['verify_tokens_per_accepted']:>10.2f}")


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the DFlash benches' engines: weights, device, overlap scheduler."""
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--device", default="auto")
    p.add_argument("--overlap-schedule", default="auto", choices=list(OVERLAP))


def parse_with_smoke(p: argparse.ArgumentParser, argv: list[str] | None, smoke: dict
                     ) -> argparse.Namespace:
    """`argv` parsed, with `smoke`'s values as the defaults under `--smoke` (flags given
    still win)."""
    if p.parse_args(argv).smoke:
        p.set_defaults(**smoke)
    return p.parse_args(argv)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-1.5b-shaped")
    p.add_argument("--draft", default="qwen2.5-1.5b-shaped-dflash")
    p.add_argument("--profile", default=str(DEFAULT_PROFILE))
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--verify-modes", nargs="+", default=["static", "compact"],
                   choices=["static", "compact"])
    p.add_argument("--compact-verify-budget-frac", type=float, default=None)
    p.add_argument("--compact-verify-max-tokens", type=int, default=None)
    p.add_argument("--compact-confidence", default="profile", choices=CONFIDENCES)
    p.add_argument("--widths", type=int, nargs="+", default=None,
                   help="verify widths (anchor included) to run every mode at, the profile "
                        "truncated to each (default: the draft's block size)")
    p.add_argument("--schedule", default="full", choices=["full", "derived"],
                   help="full: every batch size at the verify width (or each of --widths); "
                        "derived: the server's draft length schedule from --profile (and "
                        "--step-costs), each batch size at its width, the draws cut to it")
    p.add_argument("--step-costs", default=None,
                   help="with --schedule derived: the server's --speculative-step-costs "
                        "(default: measured at start-up)")
    p.add_argument("--context", type=int, default=900, help="prompt tokens per request")
    p.add_argument("--seed", type=int, default=0, help="of the prompts and the draws")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    add_engine_flags(p)
    p.add_argument("--smoke", action="store_true",
                   help="tiny presets on the CPU, a few steps (the CI test)")
    p.add_argument("--out", default="benchmark/spec_decode/dflash_step.json")
    args = parse_with_smoke(p, argv, SMOKE)
    if args.warmup < 1 or args.steps < 1 or min(args.bs) < 1:
        p.error("--warmup, --steps and every --bs must be >= 1")
    given = [f for f in ("compact_verify_budget_frac", "compact_verify_max_tokens")
             if getattr(args, f) is not None]
    if given and "compact" not in args.verify_modes:
        p.error(f"--{given[0].replace('_', '-')} acts on compact verify, not in --verify-modes")
    if args.schedule == "derived" and args.widths:
        p.error("--schedule derived runs each batch size at the width the server derives: "
                "drop --widths")
    if args.step_costs and args.schedule != "derived":
        p.error("--step-costs acts with --schedule derived")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    # Everything that can be wrong with the input fails here, before any model loads.
    try:
        width = args.verify_width = verify_width_of(args.draft)
        profile = AcceptanceProfile.load(args.profile, width)
        args.widths = args.widths or [width]
        profiles = {w: profile.truncated(w) for w in args.widths}
        if min(args.widths) < 2:
            raise ValueError(f"--widths {args.widths}: a verify width of 1 is target-only")
        # a request must outlive the timed steps even if every one accepts the whole block
        args.max_new_tokens = (args.warmup + args.steps + 4) * width
        for mode in args.verify_modes:
            for w in args.widths:
                ServerArgs(**engine_kwargs(args, mode, w))
    except ValueError as e:
        raise SystemExit(f"bench_dflash_step: {e}") from None
    target = measure_target(args)
    rows, schedule, servers = [], {}, {}
    for mode in args.verify_modes:
        for w in args.widths:
            mode_rows, mode_schedule, server = measure_dflash(args, mode, profiles[w], target)
            rows += mode_rows
            servers[f"{mode} width {w}"] = server
            if w == width:  # the schedule is derived from the full width's costs
                schedule = mode_schedule or schedule
    report = {"args": vars(args), "profile": {"path": profile.path, "probs": profile.probs,
                                              "tokens_per_step": profile.tokens_per_step},
              "target_only": list(target.values()), "rows": rows, **schedule,
              "server_schedule": servers}
    report["best_width"] = best_widths(rows)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print_table(rows)
    if len(args.widths) > 1:
        print("best verify width per mode and batch size (ratio to target-only): " + ", ".join(
            f"{mode} bs {bs}: {w} ({ratio:.2f}x)"
            for mode, by_bs in report["best_width"].items() for bs, (w, ratio) in by_bs.items()))
    if args.schedule == "derived":
        print("the servers' draft length schedules: " + ", ".join(
            f"{name}: {x['schedule']} ({x['source']})" for name, x in servers.items()))
    if schedule:
        print(f"draft length schedule derived from the profile and the step costs: "
              f"{schedule['draft_len_schedule']}")
        print("step ms over what the step costs predict (attention over real contexts and "
              "the host's share, which the probe's padding rows leave out): " + ", ".join(
                  f"bs {r['bs']} {r['step_ms_over_predicted']:.2f}x" for r in rows
                  if "step_ms_over_predicted" in r))
    return report


if __name__ == "__main__":
    main()

"""Helpers tests share to stand up a runner over a tiny checkpoint and give it KV state."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.distributed import parallel_state
from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.managers.schedule_batch import (
    Req,
    extend_inputs,
    release_kv,
    reserve_kv,
    step_inputs,
)
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.srt.server_args import ServerArgs

if TYPE_CHECKING:
    from sglang_aux.srt.entrypoints.engine import Engine


def tiny_checkpoint(preset: str, root: Path) -> str:
    out = root / preset
    if not (out / "config.json").is_file():
        write_checkpoint(preset, out)
    return str(out)


def make_runner(model_path: str, *, aux_layer_ids: list[int] | None = None,
                model: torch.nn.Module | None = None, **server_args) -> ModelRunner:
    """A runner over `model_path` (or over `model`, built from it by the caller)."""
    server_args.setdefault("device", "cpu")
    args = ServerArgs(model_path=model_path, **server_args)
    return ModelRunner(ModelConfig.from_pretrained(model_path), args, aux_layer_ids=aux_layer_ids,
                       model=model)


@contextmanager
def full_collections() -> Iterator[list[int]]:
    """A list that gets one entry per full (generation-2) collection started in the block."""
    starts: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            starts.append(1)
    gc.callbacks.append(count)
    try:
        yield starts
    finally:
        gc.callbacks.remove(count)


@contextmanager
def pipeline_stage(world_size: int) -> Iterator[None]:
    """This process as the last stage of a `world_size`-stage pipeline while the block runs
    (the runtime refuses --pp-size > 1; this reaches the models' pipeline gating)."""
    old = parallel_state._PP
    parallel_state._PP = parallel_state.GroupCoordinator(world_size - 1, world_size, None, None)
    try:
        yield
    finally:
        parallel_state._PP = old


def new_requests(runner: ModelRunner, lens: list[int], seed: int) -> list[Req]:
    """Requests with random prompts of the given lengths, each given a request row (no KV
    slots yet: a prefill reserves them)."""
    g = torch.Generator().manual_seed(seed)
    vocab = runner.model_config.hf_config.vocab_size
    reqs = [Req(f"r{i}", torch.randint(0, vocab, (n,), generator=g).tolist(), SamplingParams())
            for i, n in enumerate(lens)]
    for r in reqs:
        r.req_pool_idx = runner.req_to_token_pool.alloc()
    return reqs


def extend_batch(runner: ModelRunner, prompts: list[list[int]]) -> tuple[list[Req], ForwardBatch]:
    """New requests for `prompts` with their slots allocated, and their EXTEND batch (not run;
    eager, a FULL capture: no graph takes it; the attention backend is ready for it)."""
    reqs = [Req(f"r{i}", list(ids), SamplingParams()) for i, ids in enumerate(prompts)]
    for req in reqs:
        req.req_pool_idx = runner.req_to_token_pool.alloc()
    fb = runner.prepare(extend_inputs(runner, reqs, CaptureHiddenMode.FULL))
    runner.attn_backend.init_forward_metadata(fb)
    return reqs, fb


def prefill(runner: ModelRunner, prompts: list[list[int]]):
    """Requests for `prompts`, prefilled eagerly into the runner's KV (the model alone: no
    epilogue); returns them and the prefill output (last-token logits per request)."""
    reqs, fb = extend_batch(runner, prompts)
    return reqs, eager_forward(runner, fb)


def prefill_random(runner: ModelRunner, prompt_lens: list[int], seed: int = 0) -> list[Req]:
    """Requests with random prompts of the given lengths, prefilled into the runner's KV."""
    g = torch.Generator().manual_seed(seed)
    vocab = runner.model_config.hf_config.vocab_size
    return prefill(runner, [torch.randint(0, vocab, (n,), generator=g).tolist()
                            for n in prompt_lens])[0]


def release(runner: ModelRunner, reqs: list[Req]) -> None:
    """Give back the requests' KV slots and rows."""
    for r in reqs:
        release_kv(runner, r)


def build_fixed_batch(runner: ModelRunner, reqs: list[Req], mode: ForwardMode,
                      input_ids: list[int], out_cache_loc: torch.Tensor,
                      start_lens: list[int]) -> ForwardBatch:
    """A fixed-layout batch of `len(input_ids) // len(reqs)` tokens per request at positions
    `[start, start + n)` per request, over given slots (`out_cache_loc`); eager only."""
    dev, bs = runner.device, len(reqs)
    n = len(input_ids) // bs
    positions = [s + j for s in start_lens for j in range(n)]
    seq_lens = [s + n for s in start_lens]

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=dev)

    return ForwardBatch(
        forward_mode=mode, batch_size=bs, input_ids=ints(input_ids),
        req_pool_indices=ints([r.req_pool_idx for r in reqs]), seq_lens=ints(seq_lens),
        seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=out_cache_loc.to(dev, torch.int64), positions=ints(positions),
        req_to_token_pool=runner.req_to_token_pool, token_to_kv_pool=runner.token_to_kv_pool,
        attn_backend=runner.attn_backend)


def publish_rows(runner: ModelRunner, reqs: list[Req]) -> None:
    """Set the rows' device state (kv_len, last token) from the host's view of `reqs`, for
    tests that step requests no prefill went through; one copy."""
    last = [(r.output_ids or r.origin_input_ids)[-1] for r in reqs]
    rows, kv_lens, last_t = to_device([[r.req_pool_idx for r in reqs], [r.kv_len for r in reqs],
                                       last], runner.device)
    runner.req_to_token_pool.set_rows(rows, kv_lens, last_t)


def fixed_batch(runner: ModelRunner, reqs: list[Req], mode: ForwardMode, width: int,
                seed: int = 0) -> ForwardBatch:
    """`width` random tokens per request after its cached prefix, slots allocated."""
    g = torch.Generator().manual_seed(seed)
    vocab = runner.model_config.hf_config.vocab_size
    starts = [r.kv_len for r in reqs]
    for r in reqs:
        reserve_kv(runner, r, r.kv_len + width)
    pool = runner.req_to_token_pool.req_to_token
    locs = torch.cat([pool[r.req_pool_idx, r.kv_len : r.kv_len + width] for r in reqs])
    for r in reqs:
        r.kv_len += width
    ids = torch.randint(0, vocab, (len(reqs) * width,), generator=g).tolist()
    return build_fixed_batch(runner, reqs, mode, ids, locs, starts)


def step_batch(runner: ModelRunner, reqs: list[Req], mode: ForwardMode,
               tokens_per_req: int) -> ForwardBatch:
    """The runner's `mode` step of `reqs` (a graph's when one fits), their slots reserved and
    their device rows set from the host (`publish_rows`); not run."""
    for r in reqs:
        reserve_kv(runner, r, r.kv_len + tokens_per_req)
    publish_rows(runner, reqs)
    return runner.prepare(step_inputs(reqs, mode, tokens_per_req))


def eager_forward(runner: ModelRunner, fb: ForwardBatch):
    runner.attn_backend.init_forward_metadata(fb)
    return runner.model.forward(fb.input_ids, fb.positions, fb)


def assert_same_outputs(want: list[dict], got: list[dict]) -> None:
    """Request by request: the same tokens, finish reason and verify-step count."""
    for a, b in zip(want, got, strict=True):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
        assert b["meta_info"]["spec_verify_ct"] == a["meta_info"]["spec_verify_ct"]


def assert_kv_all_back(engine: Engine) -> None:
    """Idle: no cached prefix is still locked, and once the prefix cache is flushed every KV
    slot is free exactly once (none lost, none freed twice) and so is every request row."""
    sched = engine.scheduler
    assert not (sched.waiting or sched.running)  # a step may be in flight (overlap)
    assert sched.tree_cache is None or sched.tree_cache.protected_size() == 0, "a lock leaked"
    assert sched.flush_cache() is not None
    runner = engine.worker.model_runner
    alloc, rows = runner.token_to_kv_pool_allocator, runner.req_to_token_pool
    assert alloc.available_size() == alloc.size, "KV slots leaked"
    assert rows.available_size() == rows.size, "request rows leaked"
    slots = alloc.alloc(alloc.size)
    alloc.free(slots.flip(0))  # the free stack as it was
    assert sorted(slots.tolist()) == list(range(1, alloc.size + 1)), "a KV slot was freed twice"


def committed_tokens(req: Req) -> list[int]:
    """The tokens whose K/V a finished or aborted request handed to the prefix cache."""
    return (req.origin_input_ids + req.output_ids)[: min(req.kv_len, req.seq_len)]


def cached_kv_error(engine: Engine, tokens: list[int]) -> float:
    """Max |K/V - recomputed| over the cached slots of `tokens` (the target's, and with
    DFlash the draft context), recomputed by an eager prefill of `tokens` into fresh slots."""
    worker = engine.worker
    runner = worker.model_runner
    cached = engine.scheduler.tree_cache.match_prefix(tokens).slots
    assert cached.numel() == len(tokens), "not all of it is cached"
    fresh, fb = extend_batch(runner, [tokens])
    fresh = fresh[0]
    out = eager_forward(runner, fb)
    pools = [runner.token_to_kv_pool]
    if hasattr(worker, "draft_runner"):
        worker.draft_context.commit(out.aux_hidden_states, fb.positions, fb.out_cache_loc)
        pools.append(worker.draft_runner.token_to_kv_pool)
    err = max(float((buf[cached] - buf[fb.out_cache_loc]).abs().max())
              for pool in pools for buf in (*pool.k_buffer, *pool.v_buffer))
    release_kv(runner, fresh)
    return err


def assert_spec_counts(meta: dict, block_size: int) -> None:
    """A DFlash request's `meta_info` adds up: the histogram holds every verify step and the
    accepted drafts, and the steps' tokens (accepted drafts + 1 each, after the first token)
    cover the completion, overshooting by less than one block (a finished step is cut)."""
    hist, steps = meta["spec_accept_histogram"], meta["spec_verify_ct"]
    accepted = meta["spec_accepted_drafts"]
    assert steps > 0 and sum(hist) == steps and len(hist) == block_size, meta
    assert accepted == sum(k * n for k, n in enumerate(hist)), meta
    emitted = 1 + steps + accepted
    assert meta["completion_tokens"] <= emitted < meta["completion_tokens"] + block_size, meta
    assert meta["spec_accept_length"] == meta["completion_tokens"] / steps


def assert_graphs_equal_eager(graphs: Engine, eager: Engine, prompts: list[str],
                              params_of: Callable[[int], dict], max_bs: int = 8) -> None:
    """At every batch size up to `max_bs` (those between captured sizes replay padded graphs):
    the graph engine's outputs and accept histograms equal the eager engine's; request i
    samples with `params_of(i)`. Some draft must be rejected, or the rejection path went
    untested."""
    rejected = 0
    for bs in range(1, max_bs + 1):
        params = [params_of(i) for i in range(bs)]
        batch = (prompts * max_bs)[:bs]
        for x, y in zip(graphs.generate(batch, params), eager.generate(batch, params),
                        strict=True):
            assert x["output_ids"] == y["output_ids"], bs
            hist = x["meta_info"]["spec_accept_histogram"]
            assert hist == y["meta_info"]["spec_accept_histogram"]
            rejected += hist[0]
    assert rejected > 0, "no draft was rejected: the rejection path went untested"


def flat_step_costs(folder: Path) -> str:
    """A `--speculative-step-costs` file under which drafting pays at every batch size, so
    compact verify's derived schedule drafts at each of them whatever this machine's timings
    (derived from timings taken at start-up on a loaded CI machine, it once verified a batch
    of four plainly). The path, as the flag takes it."""
    path = Path(folder) / "flat_step_costs.json"
    path.write_text('{"draft_ms": {"8": 0.1}, "verify_ms": {"64": 1.0}}')
    return str(path)


def engine_in_verify_mode(mode: str, **kw) -> Engine:
    """An Engine started with `--speculative-verify-mode mode`."""
    from sglang_aux.srt.entrypoints.engine import Engine

    return Engine(speculative_verify_mode=mode, **kw)


def record_graph_forwards(runner: ModelRunner) -> list[tuple[int, int | None]]:
    """(batch size, the graph it replayed or None) of every forward of the runner's step mode
    from now on."""
    seen, forward = [], runner.forward

    def record(fb):
        if fb.forward_mode.is_cuda_graph():
            seen.append((fb.batch_size, fb.prepared_graph))
        return forward(fb)

    runner.forward = record
    return seen


def record_mixed_steps(runner: ModelRunner) -> list[tuple[int, int, int | None]]:
    """(live step requests, their width, the width of the mixed graph replayed or None) of
    every MIXED forward the runner prepares from now on."""
    seen, prepare = [], runner.prepare

    def record(inputs):
        fb = prepare(inputs)
        if inputs.mode == ForwardMode.MIXED:
            graph = fb.prepared_graph
            layouts = runner.graph_runners[ForwardMode.MIXED].layouts if graph is not None \
                else None
            seen.append((len(inputs.step_rows), fb.mixed_step_width,
                         None if layouts is None else layouts[graph].tokens_per_req))
        return fb

    runner.prepare = record
    return seen


def record_verdict_rows(worker) -> list[list[int]]:
    """Every verdict row the host reads from a speculative worker's verify steps from now on
    (accepted proposals, the emitted tokens; compact: then the tokens verified)."""
    rows, verified = [], worker._verified

    def recording(width: int):
        apply = verified(width)

        def record(req, row):
            rows.append(row)
            return apply(req, row)

        return record

    worker._verified = recording
    return rows


def pair_checkpoints(root: Path, pairs: dict[str, str], *extra: str) -> dict[str, str]:
    """Tiny checkpoints of every target and draft of `pairs` (target -> draft) and of `extra`
    presets, by preset name."""
    return {p: tiny_checkpoint(p, root) for p in {*pairs, *pairs.values(), *extra}}


# Speculative end-to-end tests' batch: four prompts whose requests end one after another, so a
# batch of 4 steps at 4, 3 (padded to 4 on graphs of CAPTURED_BS), 2 and 1
SPEC_PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY_IGNORE_EOS = {"temperature": 0, "ignore_eos": True}
STAGGERED = [dict(GREEDY_IGNORE_EOS, max_new_tokens=n) for n in (26, 19, 12, 6)]
CAPTURED_BS = [1, 2, 4]
SPEC_ENGINE_KW = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=CAPTURED_BS,
                      max_running_requests=4)

# Requests that arrive and finish so a running batch grows from 1 to 6 and shrinks back to 1:
# (prompt, max new tokens, the scheduler step it arrives at); ARRIVAL_SAMPLED samples
ARRIVALS = [("Hi", 40, 0), ("The quick brown fox jumps over", 30, 0), ("12 + 30 =", 22, 2),
            ("Natalia sold clips to 48 of", 14, 4), ("x", 12, 5),
            ("What is the capital of France?", 10, 5), ("Once upon a time", 24, 7)]
ARRIVAL_SAMPLED = 6


def arrival_params(i: int) -> dict:
    """Request i of ARRIVALS' sampling parameters: greedy, but ARRIVAL_SAMPLED samples."""
    params = dict(GREEDY_IGNORE_EOS, max_new_tokens=ARRIVALS[i][1])
    if i == ARRIVAL_SAMPLED:
        params |= {"temperature": 0.8, "top_p": 0.9, "seed": 7}
    return params


def run_arrivals(engine: Engine) -> list[Req]:
    """Step `engine`'s scheduler, adding each of ARRIVALS at its step, until all finish."""
    sched, reqs, step = engine.scheduler, [], 0
    while len(reqs) < len(ARRIVALS) or not all(r.finished for r in reqs):
        for i, (prompt, _, at) in enumerate(ARRIVALS):
            if at == step:
                reqs.append(engine.make_request(text=prompt, sampling_params=arrival_params(i)))
                sched.add_request(reqs[-1])
        sched.step()
        step += 1
    return reqs

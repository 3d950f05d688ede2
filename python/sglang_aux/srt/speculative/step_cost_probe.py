"""Step costs measured at start-up, right after graph capture: replays of the draft's
DRAFT_BLOCK graph at every captured batch size and of the target's TARGET_VERIFY graph at
every token bucket (compact verify's ragged graphs) or batch size (static verify's full-width
ones, keyed by their tokens), over their padding batches (CUDA events on the GPU; on the CPU
the eager-replay backend runs the forwards, timed by the host's clock).

The padding rows read almost no KV, so the attention over real contexts is measured apart:
the largest graph of each runner replayed again over requests of `context` tokens each
(request rows and KV slots nobody holds yet at start-up, set for the probe and cleared after),
the difference per request is what a request's context adds (`StepCosts.context_cost`).
For a draft whose narrower static steps compute fewer proposals' logits, its graphs of one
proposal a request are captured first (a step of width 2 replays them) and timed too
(`StepCosts.draft_one_ms`).
`benchmark/spec_decode/bench_dflash_step.py` writes the same probe's costs for
`--speculative-step-costs`; its step rows, over real contexts, show what is still left out.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.mem_cache.memory_pool import PADDING_REQ_ROW, ReqToTokenPool
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs
from sglang_aux.srt.model_executor.runner.graph_runner import GraphRunner

PROBE_REPLAYS = 7  # timed replays per graph, after one untimed; the median counts


def _median_ms(run: Callable[[], None], device: torch.device, replays: int) -> float:
    """The median of `replays` timed calls of `run`, after one untimed (a shared host is
    noisy)."""
    run()
    if device.type != "cuda":
        times = []
        for _ in range(replays):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    for start, end in events:
        start.record()
        run()
        end.record()
    events[-1][1].synchronize()  # start-up only, once per graph: never on a step
    return statistics.median(start.elapsed_time(end) for start, end in events)


@contextmanager
def _context_rows(pool: ReqToTokenPool, num_slots: int, rows: int, context: int,
                  width: int) -> Iterator[list[int]]:
    """Request rows 1..`rows`, each at kv_len `context` over slots of its own (room for a
    step of `width` after them), for the probe's replays; cleared after. Start-up only:
    no request holds a row or a slot yet."""
    span = context + width
    if rows * span > num_slots - 1 or span > pool.max_context_len:
        raise ValueError(f"{rows} probe requests of {context} + {width} tokens do not fit "
                         f"{num_slots} KV slots and a context of {pool.max_context_len}")
    ids = list(range(1, rows + 1))
    slots = 1 + torch.arange(rows * span, device=pool.req_to_token.device).view(rows, span)
    pool.req_to_token[1 : rows + 1, :span] = slots.to(torch.int32)
    pool.kv_lens[1 : rows + 1] = context
    try:
        yield ids
    finally:
        pool.req_to_token[1 : rows + 1, :span] = 0
        pool.kv_lens[1 : rows + 1] = 0
        pool.last_tokens[1 : rows + 1] = 0


def _context_inputs(graphs: GraphRunner, i: int, rows: list[int], context: int,
                    ragged_lens: torch.Tensor | None) -> tuple[ForwardInputs, int]:
    """Layout `i` of `graphs` over requests of `rows` (a ragged bucket: as many as hold the
    full width each, `ragged_lens` set for them), and how many requests it holds."""
    layout, parts = graphs.layouts[i], graphs.parts
    if not parts.ragged:
        bs = layout.step_bs
        return ForwardInputs(layout.mode, step_rows=rows[:bs], step_kv_bounds=[context] * bs,
                             step_width=layout.tokens_per_req), bs
    width, n = parts.tokens_per_req, layout.step_bs
    bs = n // width
    ragged_lens[:n] = 0
    ragged_lens[:bs] = width
    # each token's length bound, as `VerifyPlan.ragged_inputs` gives it
    return ForwardInputs(layout.mode, step_rows=rows[:bs] + [PADDING_REQ_ROW] * (n - bs),
                         step_kv_bounds=[context + width - 1] * n, step_width=1), bs


def _context_ms_per_request(graphs: GraphRunner, i: int, padded_ms: float, rows: list[int],
                            context: int, replays: int,
                            ragged_lens: torch.Tensor | None) -> float:
    """What one request's context adds to graph `i`: its replay over requests of `context`
    tokens, less its replay over padding rows, per request (>= 0: the host's noise)."""
    inputs, bs = _context_inputs(graphs, i, rows, context, ragged_lens)
    batch = graphs.prepare(i, inputs)
    try:
        ms = _median_ms(lambda: graphs.replay(batch), graphs.model_runner.device, replays)
    finally:
        if ragged_lens is not None:
            ragged_lens.zero_()
    return max(0.0, (ms - padded_ms) / bs)


def _draft_one_ms(draft: GraphRunner, replays: int) -> dict[int, float]:
    """The draft graph of one proposal's logits a request at each captured batch size,
    captured where missing, then timed over its padding batch."""
    have = set(draft.layouts)
    ones = [dataclasses.replace(x, logits_per_req=1) for x in draft.layouts
            if x.logits_per_req == draft.parts.logits_per_req]
    draft.capture([x for x in ones if x not in have])
    index = {x: i for i, x in enumerate(draft.layouts)}
    return {x.step_bs: _median_ms(lambda i=index[x]: draft.replay_padding(i),
                                  draft.model_runner.device, replays) for x in ones}


def measure_step_costs(draft: GraphRunner, verify: GraphRunner,
                       replays: int = PROBE_REPLAYS, context: int = 0,
                       ragged_lens: torch.Tensor | None = None,
                       narrow_draft: bool = False) -> StepCosts:
    """The draft graph's cost per batch size and the verify graph's per token count (static
    verify: its full-width graphs, a batch size's tokens); with `context` > 0, what a
    request's context of that many tokens (fewer where the KV pool holds fewer for the
    largest graph's requests) adds to each (`ragged_lens`: a ragged verify's per-request
    lengths, its static storage); `narrow_draft`: the draft's cost at one proposal's logits a
    request too, where its graphs compute fewer (a static server's narrower steps)."""
    if verify.parts.ragged and context and ragged_lens is None:
        raise ValueError("a ragged verify's context probe needs its per-request lengths")
    device = draft.model_runner.device
    proposals = draft.parts.logits_per_req

    def full() -> list[int]:  # the draft graphs of every proposal's logits
        return [i for i, x in enumerate(draft.layouts) if x.logits_per_req == proposals]

    draft_ms = {draft.layouts[i].step_bs: _median_ms(lambda i=i: draft.replay_padding(i),
                                                     device, replays) for i in full()}
    verify_ms = {x.num_tokens: _median_ms(lambda i=i: verify.replay_padding(i), device,
                                          replays)
                 for i, x in enumerate(verify.layouts)}
    source = f"measured at start-up ({device.type} graph replays, padding rows"
    extra = {}
    if narrow_draft and proposals >= 2:  # captures graphs: the indices move
        extra = {"draft_one_ms": _draft_one_ms(draft, replays), "draft_proposals": proposals}
    runner = verify.model_runner
    width = verify.parts.tokens_per_req
    d, v = full()[-1], len(verify.layouts) - 1
    rows = max(draft.layouts[d].step_bs,
               verify.layouts[v].step_bs // (width if verify.parts.ragged else 1))
    num_slots = runner.token_to_kv_pool_allocator.size
    fits = min(context, (num_slots - 1) // max(rows, 1) - width,
               runner.req_to_token_pool.max_context_len - width)
    if context > 0 and fits > 0:
        with _context_rows(runner.req_to_token_pool, num_slots, rows, fits, width) as ids:
            extra |= {
                "context": fits,
                "draft_context_ms": _context_ms_per_request(
                    draft, d, draft_ms[draft.layouts[d].step_bs], ids, fits, replays, None),
                "verify_context_ms": _context_ms_per_request(
                    verify, v, verify_ms[verify.layouts[v].num_tokens], ids, fits, replays,
                    ragged_lens)}
        source += f"; contexts of {fits} tokens"
    return StepCosts(draft_ms, verify_ms, **extra, source=source + ")")

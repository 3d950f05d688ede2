"""Step costs measured at start-up, right after graph capture: replays of the draft's
DRAFT_BLOCK graph at every captured batch size and of the target's TARGET_VERIFY graph at
every token bucket (compact verify's ragged graphs) or batch size (static verify's full-width
ones, keyed by their tokens), over their padding batches (CUDA events on the GPU; on the CPU the
eager-replay backend runs the forwards, timed by the host's clock).

The padding rows read almost no KV, so attention over real contexts is not in these figures
(nor in the `step_costs` that `benchmark/spec_decode/bench_dflash_step.py` writes for
`--speculative-step-costs`: the same probe; its step rows, over real contexts, show the gap).
"""

from __future__ import annotations

import statistics
import time

import torch

from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.model_executor.runner.graph_runner import GraphRunner

PROBE_REPLAYS = 7  # timed replays per graph, after one untimed; the median counts


def _replay_ms(graphs: GraphRunner, i: int, replays: int) -> float:
    """The median of `replays` timed replays of graph `i` (a shared host is noisy)."""
    graphs.replay_padding(i)
    if graphs.model_runner.device.type != "cuda":
        times = []
        for _ in range(replays):
            t0 = time.perf_counter()
            graphs.replay_padding(i)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(replays)]
    for start, end in events:
        start.record()
        graphs.replay_padding(i)
        end.record()
    events[-1][1].synchronize()  # start-up only, once per graph: never on a step
    return statistics.median(start.elapsed_time(end) for start, end in events)


def measure_step_costs(draft: GraphRunner, verify: GraphRunner,
                       replays: int = PROBE_REPLAYS) -> StepCosts:
    """The draft graph's cost per batch size and the verify graph's per token count (static
    verify: its full-width graphs, a batch size's tokens)."""
    draft_ms = {x.step_bs: _replay_ms(draft, i, replays)
                for i, x in enumerate(draft.layouts)}
    verify_ms = {x.num_tokens: _replay_ms(verify, i, replays)
                 for i, x in enumerate(verify.layouts)}
    device = draft.model_runner.device
    return StepCosts(draft_ms, verify_ms,
                     source=f"measured at start-up ({device.type} graph replays, padding rows)")

"""What the scheduler process reports about itself, read between its steps: KV and request
rows, the prefix cache, the aux-state memory of the decode graphs. The HTTP front end serves
these figures (`entrypoints/server_info.py`: /get_server_info and /metrics)."""

from __future__ import annotations

import os

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.srt.managers.scheduler.scheduler import Scheduler
from sglang_aux.srt.managers.scheduler.serving_engine import ServingEngine
from sglang_aux.srt.managers.scheduler.step_throughput import StepThroughput
from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)

GRAPH_KEYS = ("forward_mode", "capture_bs", "capture_widths", "prefill_capture_tokens",
              "graph_memory_bytes",
              "graph_memory_reserved_bytes", "graph_memory_allocated_bytes", "aux_path",
              "aux_buffer_bytes", "aux_per_graph_bytes", "aux_bytes_saved")


def graph_memory(runner: ModelRunner) -> dict:
    """Capture sizes and the aux-state memory of a runner's step graphs; nulls without them.
    `aux_per_graph_bytes` is what one aux output per captured graph (step, prefill and mixed
    graphs alike) would retain, sum(tokens * aux width * element size); the runner's one aux
    storage (or the streamed projection's fp32 accumulator, `aux_path` "streamed") saves that
    less its own size (nothing when sharing is off)."""
    step = runner.step_graphs
    if step is None:
        return dict.fromkeys(GRAPH_KEYS)
    aux_width = resolve_aux_hidden_states_width(
        model=runner.model, spec_algorithm=runner.spec_algorithm,
        is_draft_worker=runner.is_draft_worker,
    )
    elem = runner.model_config.dtype.itemsize
    prefill = runner.graph_runners.get(ForwardMode.EXTEND)
    prefill_tokens = [] if prefill is None else [x.arrival_tokens for x in prefill.layouts]
    per_graph = sum(x.num_tokens for g in runner.graph_runners.values()
                    for x in g.layouts) * aux_width * elem
    storage = runner.aux_storage
    shared = 0 if storage is None else storage.nbytes()
    stats = step.capture_stats

    def captured(key: str) -> int | None:
        """A capture figure, with the graphs added after the first capture (a static verify's
        narrower widths)."""
        first = stats.get(key)
        return None if first is None else first + sum(a.get(key) or 0
                                                      for a in stats.get("added", []))

    widths: dict[str, list[int]] = {}
    for x in step.layouts:
        widths.setdefault(str(x.step_bs), []).append(x.tokens_per_req)
    return {
        "forward_mode": step.mode.name,
        "capture_bs": sorted({x.step_bs for x in step.layouts}),
        # tokens per request of each size's graphs (a ragged step's: 1, per token)
        "capture_widths": {bs: sorted(ws) for bs, ws in widths.items()},
        "prefill_capture_tokens": prefill_tokens,
        # the capture's drop in free device memory (SGLang's figure), and the allocator's view
        "graph_memory_bytes": captured("free_memory_drop_bytes"),
        "graph_memory_reserved_bytes": captured("reserved_delta_bytes"),
        "graph_memory_allocated_bytes": captured("allocated_delta_bytes"),
        "aux_path": "per-graph" if storage is None else storage.path,
        "aux_buffer_bytes": shared,
        "aux_per_graph_bytes": per_graph,
        "aux_bytes_saved": per_graph - shared if shared else 0,
    }


def prefix_cache_info(sched: Scheduler) -> dict:
    """The prefix cache's sizes in tokens (one KV slot each) and its hits since start."""
    c = sched.tree_cache
    return {
        "radix_cache_enabled": c is not None,
        "radix_cache_tokens": 0 if c is None else c.total_size(),
        "radix_cache_evictable_tokens": 0 if c is None else c.evictable_size(),
        "radix_cache_protected_tokens": 0 if c is None else c.protected_size(),
        "radix_cache_hit_tokens": sched.admission.cache_hit_tokens,
        "radix_cache_admitted_prompt_tokens": sched.admission.admitted_prompt_tokens,
    }


def engine_info(engine: ServingEngine, throughput: StepThroughput) -> dict:
    """The scheduler process's figures, read between its steps."""
    runner, sched = engine.worker.model_runner, engine.scheduler
    return {
        "max_total_num_tokens": runner.token_to_kv_pool_allocator.size,
        "available_kv_tokens": runner.token_to_kv_pool_allocator.available_size(),
        "max_req_rows": runner.req_to_token_pool.size,
        "available_req_rows": runner.req_to_token_pool.available_size(),
        # the caching allocator's live bytes on the runner's device (None off the GPU)
        "device_memory_allocated": torch.cuda.memory_allocated(runner.device)
        if runner.device.type == "cuda" else None,
        # as SGLang reports it: the resolved size, -1 when off
        "chunked_prefill_size": sched.chunked_prefill_size or -1,
        "scheduler_stats": dict(sched.stats) | engine.worker.step_stats,
        **prefix_cache_info(sched),
        "last_gen_throughput": throughput.last_gen_throughput,
        **graph_memory(runner),
        "forwards": runner.forwards_info(),
        **engine.worker.server_info(),
        "num_running_reqs": len(sched.running),
        "num_queue_reqs": len(sched.waiting),
        "scheduler_pid": os.getpid(),
    }

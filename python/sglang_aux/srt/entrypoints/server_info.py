"""What the server reports about itself: /get_model_info, /get_server_info and /metrics."""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import TYPE_CHECKING

from sglang_aux.srt.managers.io_struct import EngineSpec
from sglang_aux.srt.managers.scheduler.scheduler_info import GRAPH_KEYS

if TYPE_CHECKING:
    from sglang_aux.srt.managers.tokenizer.tokenizer_manager import TokenizerManager

METRIC_PREFIX = "sglang_aux:"


def model_info(spec: EngineSpec) -> dict:
    args = spec.server_args
    return {
        "model_path": args.model_path,
        "served_model_name": args.served_model_name,
        "tokenizer_path": args.tokenizer_path or args.model_path,
        "architecture": spec.architecture,
        "is_generation": True,
        "context_length": spec.context_len,
        "dtype": spec.dtype,
        "speculative_algorithm": args.speculative_algorithm,
    }


def server_info(server: TokenizerManager, engine: dict) -> dict:
    """/get_server_info: the front end's own figures around `engine`
    (`scheduler_info.engine_info`)."""
    args = dataclasses.asdict(server.server_args)
    if args.get("api_key"):
        args["api_key"] = "<redacted>"
    engine = dict(engine)
    # the scheduler's pick when the flag left it to the device's memory
    args["chunked_prefill_size"] = engine["chunked_prefill_size"]
    # SGLang's per-scheduler figures (one scheduler here)
    states = [{"avg_spec_accept_length": server.metrics.mean_accept_length(),
               "avg_spec_verify_tokens_per_accepted":
                   server.metrics.verify_tokens_per_accepted(),
               "last_gen_throughput": engine.pop("last_gen_throughput")}]
    counts = {k: engine.pop(k) for k in ("num_running_reqs", "num_queue_reqs", "scheduler_pid")}
    head = [k for k in engine if k not in GRAPH_KEYS]
    return {
        "server_args": args,
        **model_info(server.spec),
        **{k: engine[k] for k in head},
        "internal_states": states,
        **{k: engine[k] for k in GRAPH_KEYS},
        "gil_switch_interval": sys.getswitchinterval(),
        **counts,
        "pid": os.getpid(),
    }


def _metric(name: str, kind: str, help_text: str, value: float) -> str:
    full = METRIC_PREFIX + name
    return f"# HELP {full} {help_text}\n# TYPE {full} {kind}\n{full} {value}\n"


def render_metrics(server: TokenizerManager, engine: dict) -> str:
    """The Prometheus text exposition of the server's counters and the gauges of `engine`
    (`scheduler_info.engine_info`)."""
    m = server.metrics
    return "".join([
        _metric("requests_total", "counter",
                "Generation requests received, valid or not.", m.requests_total),
        _metric("requests_finished_total", "counter",
                "Requests that finished (stop or length).", m.requests_finished),
        _metric("requests_failed_total", "counter",
                "Requests rejected as bad input or failed in the scheduler.",
                m.requests_failed),
        _metric("requests_aborted_total", "counter",
                "Requests dropped because their client went away.", m.requests_aborted),
        _metric("prompt_tokens_total", "counter",
                "Prompt tokens of finished requests.", m.prompt_tokens),
        _metric("generation_tokens_total", "counter",
                "Output tokens of finished requests.", m.generation_tokens),
        _metric("spec_accept_length", "gauge",
                "Mean tokens per speculative verify step (0 without speculation).",
                m.mean_accept_length()),
        _metric("spec_verify_tokens_total", "counter",
                "Target tokens spent verifying drafts, over finished requests.",
                m.spec_verify_tokens),
        _metric("spec_accepted_tokens_total", "counter",
                "Tokens speculative verify steps emitted, over finished requests.",
                m.spec_accepted_tokens),
        _metric("num_running_reqs", "gauge",
                "Requests in the running batch.", engine["num_running_reqs"]),
        _metric("num_queue_reqs", "gauge",
                "Requests waiting for admission.", engine["num_queue_reqs"]),
    ])

"""Which batch sizes a decode graph runner captures, and which token counts a prefill one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang_aux.srt.server_args import ServerArgs

# SGLang's default lists, before the cut at the maximum batch size.
_SPECULATIVE_BS = [
    *range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, 1025, 16)
]
_DECODE_BS = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 1025, 16)]


def get_capture_bs(
    *, max_bs: int, speculative: bool, override: list[int] | None = None
) -> list[int]:
    """Sorted sizes to capture: `override` as given, else the default list cut at `max_bs`
    with `max_bs` itself always included."""
    if max_bs < 1:
        raise ValueError(f"max capture batch size must be >= 1, got {max_bs}")
    if override is not None:
        if any(bs < 1 for bs in override):
            raise ValueError(f"capture batch sizes must be >= 1, got {override}")
        return sorted(set(override))
    base = _SPECULATIVE_BS if speculative else _DECODE_BS
    return sorted({bs for bs in base if bs <= max_bs} | {max_bs})


def ragged_token_buckets(*, max_bs: int, tokens_per_req: int) -> list[int]:
    """Token counts a ragged step's graphs are captured for (DSpark's compact verify): the
    speculative batch-size list read as token counts, up to `max_bs` requests of
    `tokens_per_req` tokens each; a step pads its tokens to the next bucket."""
    return get_capture_bs(max_bs=max_bs * tokens_per_req, speculative=True)


def step_widths(sizes: list[int], width: Callable[[int], int]) -> dict[int, set[int]]:
    """For each captured batch size of `sizes` (ascending), the widths `width(bs)` of the
    running batch sizes it takes (those above the size before it): a step pads to the
    smallest captured size of its own width, so each needs its graph."""
    widths, low = {}, 0
    for size in sizes:
        widths[size] = {width(bs) for bs in range(low + 1, size + 1)}
        low = size
    return widths


# About 1.5x apart: a prefill pads to the next size, so at most a third of a graph's tokens
# are padding.
_PREFILL_TOKENS = [16, 32, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096,
                   6144, 8192, 12288, 16384]


def get_capture_prefill_tokens(*, max_tokens: int, override: list[int] | None = None
                               ) -> list[int]:
    """Sorted token counts to capture: `override` as given, else the default list cut at
    `max_tokens` with `max_tokens` itself always included."""
    if max_tokens < 1:
        raise ValueError(f"max prefill capture tokens must be >= 1, got {max_tokens}")
    if override is not None:
        if any(n < 1 for n in override):
            raise ValueError(f"prefill capture token counts must be >= 1, got {override}")
        return sorted(set(override))
    return sorted({n for n in _PREFILL_TOKENS if n <= max_tokens} | {max_tokens})


# Unset, prefill graphs go up to this many tokens for models up to this hidden size on CUDA:
# their prefills are host-bound (SmolLM2, 900 tokens: ~2 ms of kernels, 24-30 ms eager).
# Wider models are GPU-bound there, and a graph's activations and aux rows grow with the width.
DEFAULT_PREFILL_GRAPH_TOKENS = 2048
DEFAULT_PREFILL_GRAPH_MAX_HIDDEN = 2048


def prefill_graph_plan(args: ServerArgs, on_cuda: bool, hidden_size: int
                       ) -> tuple[list[int], int]:
    """(token counts, requests per graph) of a runner's prefill graphs; no counts: none.
    Off on CPU unless asked for: replay buys no speed there."""
    max_tokens = args.cuda_graph_max_tokens_prefill
    if max_tokens is None:
        default = (DEFAULT_PREFILL_GRAPH_TOKENS
                   if on_cuda and hidden_size <= DEFAULT_PREFILL_GRAPH_MAX_HIDDEN else 0)
        max_tokens = max(args.cuda_graph_tokens_prefill or [default])
    max_bs = args.cuda_graph_max_bs_prefill
    max_bs = min(args.max_running_requests, 4 if max_bs is None else max_bs)
    if args.disable_prefill_cuda_graph or max_tokens == 0 or max_bs == 0:
        return [], 0
    tokens = get_capture_prefill_tokens(max_tokens=max_tokens,
                                        override=args.cuda_graph_tokens_prefill)
    return [n for n in tokens if n <= max_tokens], max_bs


# Arrival tokens a mixed graph pads to by default: 2x apart. A padded arrival token costs what
# a live one costs the GEMMs (on an H100 at Qwen2.5-1.5B's shapes, 32 requests verifying 8
# tokens each, 128 arrival rows added 366 us, one arrival's 78 tokens padded to 128:
# docs/benchmarks.md section 9e); `--cuda-graph-tokens-mixed` captures other counts.
_MIXED_ARRIVAL_TOKENS = [32, 64, 128, 256, 512, 1024, 2048, 4096]


def mixed_graph_plan(args: ServerArgs, max_step_bs: int) -> tuple[list[int], list[int], int]:
    """(step request counts, arrival token counts, arrivals per graph) of a runner's mixed
    graphs (`--enable-mixed-chunk`): the decode sizes up to `max_step_bs`, arrival tokens
    `--cuda-graph-tokens-mixed`, else the default counts up to
    `--mixed-chunk-max-prefill-tokens` and that bound, as many arrivals as a prefill graph
    takes."""
    max_tokens = args.mixed_chunk_max_prefill_tokens
    tokens = (sorted(set(args.cuda_graph_tokens_mixed)) if args.cuda_graph_tokens_mixed
              else sorted({n for n in _MIXED_ARRIVAL_TOKENS if n <= max_tokens} | {max_tokens}))
    step_bs = get_capture_bs(max_bs=max_step_bs, speculative=False)
    return step_bs, tokens, mixed_max_arrivals(args)


def mixed_max_arrivals(args: ServerArgs) -> int:
    """Arrivals one mixed forward takes (graph or eager)."""
    return min(args.max_running_requests, args.cuda_graph_max_bs_prefill or 4)

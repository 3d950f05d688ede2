"""Owns one model on one device: its weights, KV memory, attention backend, aux storage and
graphs, and decides for each forward whether a graph replays it or it runs eagerly.

Keep this file minimal: decisions go to `model_runner_components`, buffers to `runner_utils`,
capture and replay to `runner/graph_runner.py`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.distributed.parallel_state import get_tp_group, kv_heads_per_rank
from sglang_aux.srt.forward_state.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang_aux.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang_aux.srt.layers.decode_gemv import set_decode_gemv_backend
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.layers.triton_ops.dispatch import require_triton
from sglang_aux.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)
from sglang_aux.srt.model_executor.model_runner_components.sizing import kv_pool_size
from sglang_aux.srt.model_executor.runner.epilogue import run_model
from sglang_aux.srt.model_executor.runner.forward_layout import ForwardInputs, ForwardLayout
from sglang_aux.srt.model_executor.runner.forward_parts import ForwardParts
from sglang_aux.srt.model_executor.runner.graph_runner import GraphRunner
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_backend.eager_replay_backend import EagerReplayBackend
from sglang_aux.srt.model_executor.runner_utils.aux_storage import AuxStorage, aux_rows
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import (
    get_capture_bs,
    mixed_graph_plan,
    mixed_max_arrivals,
    prefill_graph_plan,
    ragged_token_buckets,
    step_widths,
)
from sglang_aux.srt.model_executor.runner_utils.host_transfer import to_device_into
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_CAPTURE_BS = 8


def make_attn_backend(name: str, decode_merge: str = "launch") -> AttentionBackend:
    if name == "triton":
        require_triton()
        from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend(decode_merge=decode_merge)
    from sglang_aux.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend()


def make_graph_backend(device: torch.device) -> GraphBackend:
    if device.type == "cuda":
        from sglang_aux.srt.model_executor.runner_backend.cuda_graph_backend import (
            CudaGraphBackend,
        )

        return CudaGraphBackend(device)
    return EagerReplayBackend()


class ModelRunner:
    """A target runner owns the request rows and the slot allocator; a draft runner
    (`is_draft_worker`) shares the target's and owns only its KV storage, so draft K/V of a
    token lives at the slot the target gave that token."""

    def __init__(
        self,
        model_config: ModelConfig,
        server_args: ServerArgs,
        *,
        is_draft_worker: bool = False,
        aux_layer_ids: list[int] | None = None,
        req_to_token_pool: ReqToTokenPool | None = None,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator | None = None,
        model: nn.Module | None = None,
    ):
        self.model_config = model_config
        self.server_args = server_args
        self.is_draft_worker = is_draft_worker
        # forwards run since start, by mode, replayed from a graph or eager
        # (/get_server_info `forwards`): a step that misses its graphs shows here
        self.forward_counts: dict[str, dict[str, int]] = {}
        self.spec_algorithm = server_args.spec_algorithm
        self.device = torch.device(server_args.resolved_device())
        self.model = model or get_model(model_config, self.device,
                                        load_format=server_args.load_format,
                                        seed=server_args.random_seed)
        if hasattr(self.model, "post_load_weights"):  # SGLang's hook: what the weights imply,
            self.model.post_load_weights()  # taken before any graph captures
        set_decode_gemv_backend(self.model, server_args.decode_gemv_backend)
        if aux_layer_ids:
            self.model.set_dflash_layers_to_capture(list(aux_layer_ids))
        if req_to_token_pool is None:
            req_to_token_pool = ReqToTokenPool(
                server_args.max_running_requests, model_config.context_len, self.device
            )
        self.req_to_token_pool = req_to_token_pool
        tp = get_tp_group()
        # this rank's KV heads: the pool holds only what its attention reads
        self.num_kv_heads = kv_heads_per_rank(model_config.num_kv_heads, tp.world_size)
        if token_to_kv_pool_allocator is None:
            # every rank schedules the same slots: the size the smallest rank holds
            size = tp.min_int(kv_pool_size(model_config, server_args, self.device,
                                           self.num_kv_heads))
            token_to_kv_pool_allocator = TokenToKVPoolAllocator(size, self.device)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.token_to_kv_pool = MHATokenToKVPool(
            token_to_kv_pool_allocator.size,
            model_config.num_layers,
            self.num_kv_heads,
            model_config.head_dim,
            model_config.dtype,
            self.device,
        )
        self.attn_backend = make_attn_backend(server_args.resolved_attention_backend(),
                                              server_args.triton_attention_decode_merge)
        self.prefill_capture_tokens, self.prefill_capture_bs = prefill_graph_plan(
            server_args, on_cuda=self.device.type == "cuda",
            hidden_size=model_config.hf_config.hidden_size)
        # What every forward of a mode runs besides the model (`init_forwards`), the graphs
        # captured for it, and the one aux storage they and the eager forwards write.
        self.forwards: dict[ForwardMode, ForwardParts] = {}
        self.graph_runners: dict[ForwardMode, GraphRunner] = {}
        self.aux_storage: AuxStorage | None = None

    def get_aux_hidden_states_width(self) -> int:
        """Width of the runner-owned packed aux storage (0: none, also when its forwards
        stream their aux states into a projection)."""
        if self.server_args.disable_shared_aux_buffer or any(
                p.streamed_aux is not None for p in self.forwards.values()):
            return 0
        return resolve_aux_hidden_states_width(
            model=self.model, spec_algorithm=self.spec_algorithm,
            is_draft_worker=self.is_draft_worker,
        )

    def init_forwards(self, *forwards: ForwardParts) -> None:
        """Register what each mode's forwards run besides the model (at most one step mode,
        EXTEND, MIXED), allocate the aux storage once for the largest of them, then capture
        their graphs unless disabled. Call once, before the first forward."""
        if self.forwards:
            raise RuntimeError("init_forwards runs once per runner")
        steps = [p for p in forwards if p.mode.is_cuda_graph()]
        modes = [p.mode for p in forwards]
        if len(steps) > 1 or len(set(modes)) < len(modes):
            raise ValueError(f"one step mode and one of each other mode, got {modes}")
        mixed = [p for p in forwards if p.mode.is_mixed()]
        if mixed and (not steps or steps[0].tokens_per_req != mixed[0].tokens_per_req):
            raise ValueError("MIXED forwards step as many tokens per request as the step mode")
        self.forwards = {p.mode: p for p in forwards}
        self.aux_storage = self._new_aux_storage()
        for parts in (*steps, *(p for p in forwards if not p.mode.is_cuda_graph())):
            layouts = self._graph_layouts(parts)
            if not layouts:
                continue
            graphs = GraphRunner(self, parts, layouts, make_graph_backend(self.device),
                                 self.aux_storage)
            self.graph_runners[parts.mode] = graphs
            graphs.capture()

    def _new_aux_storage(self) -> AuxStorage | None:
        """The runner's one aux allocation, sized for every registered forward; None unless a
        DFlash target shares or streams."""
        streamed = {p.streamed_aux.width for p in self.forwards.values()
                    if p.streamed_aux is not None}
        if len(streamed) > 1:
            raise ValueError(f"streamed projections of two widths: {streamed}")
        width = next(iter(streamed)) if streamed else self.get_aux_hidden_states_width()
        step = next((p for p in self.forwards.values() if p.tokens_per_req), None)
        extend = self.forwards.get(ForwardMode.EXTEND)
        prefill = max(self.prefill_capture_tokens, default=0) if extend else 0
        chunk = (self.server_args.resolved_chunked_prefill_size() or 0) if extend else 0
        if extend is not None and extend.staged_from_tokens is not None:
            chunk = min(chunk, extend.staged_from_tokens - 1)
        rows = aux_rows(self.server_args,
                        tokens_per_req=0 if step is None else step.tokens_per_req,
                        prefill_graph_tokens=prefill, chunk_tokens=chunk,
                        mixed=ForwardMode.MIXED in self.forwards)
        if width == 0 or rows == 0:
            return None
        storage = AuxStorage.create(rows=rows, width=width,
                                    streamed=bool(streamed), dtype=self.model_config.dtype,
                                    device=self.device)
        logger.info("Aux storage (%s): %s, %.1f MiB", storage.path,
                    tuple(storage.buffer.shape), storage.nbytes() / 2**20)
        return storage

    def _graph_layouts(self, parts: ForwardParts) -> list[ForwardLayout]:
        """The layouts to capture for `parts`' mode; none when its graphs are off."""
        args, mode, w = self.server_args, parts.mode, parts.tokens_per_req
        extend_ok = self.device.type != "cuda" or self.attn_backend.extend_graph_safe
        if mode.is_cuda_graph():
            if args.disable_decode_cuda_graph:
                return []
            default_max_bs = args.max_running_requests
            if self.device.type != "cuda":
                # Eager replay buys no speed; a few sizes keep every line of the runner
                # exercised without 3 warm-up forwards for each of dozens of sizes at start.
                default_max_bs = min(default_max_bs, CPU_DEFAULT_MAX_CAPTURE_BS)
            max_bs = min(args.cuda_graph_max_bs_decode or default_max_bs,
                         args.max_running_requests)
            sizes = get_capture_bs(max_bs=max_bs, speculative=not self.spec_algorithm.is_none(),
                                   override=args.cuda_graph_bs_decode)
            if parts.ragged:
                return [ForwardLayout(mode, n, 1)
                        for n in ragged_token_buckets(max_bs=sizes[-1], tokens_per_req=w)]
            return [ForwardLayout(mode, bs, w, logits_per_req=parts.logits_per_req)
                    for bs in sizes]
        if mode == ForwardMode.EXTEND:
            if self.prefill_capture_tokens and not extend_ok:
                logger.info("No prefill graphs: the %s attention backend reads host lists",
                            type(self.attn_backend).__name__)
                return []
            return [ForwardLayout(mode, arrivals=self.prefill_capture_bs, arrival_tokens=n)
                    for n in self.prefill_capture_tokens]
        step = self.step_graphs
        if step is None or not extend_ok:
            return []
        step_bs, tokens, arrivals = mixed_graph_plan(args, step.layouts[-1].step_bs)
        return [ForwardLayout(mode, bs, w, arrivals, n) for bs in step_bs for n in tokens]

    def capture_step_widths(self, width: Callable[[int], int]) -> None:
        """Add graphs of the step mode at each captured batch size's narrower widths
        `width(bs)` (static verify under a draft length schedule; `step_widths`), beside its
        full-width ones (which steps that verify every token keep replaying), and mixed
        graphs likewise (each step size's arrival token counts at each width); a step's
        `ForwardInputs.step_width` picks its graph. Nothing without step graphs."""
        graphs = self.step_graphs
        if graphs is None or graphs.parts.ragged:
            return
        full = graphs.parts.tokens_per_req
        too_many = f"step widths above the full width {full}"
        _capture_per_size(graphs, width, full, too_many,
                          lambda bs, x: [ForwardLayout(graphs.mode, bs, x)])
        mixed = self.graph_runners.get(ForwardMode.MIXED)
        if mixed is not None:
            _capture_per_size(mixed, width, full, too_many, lambda bs, x: [
                dataclasses.replace(y, tokens_per_req=x) for y in mixed.layouts
                if y.step_bs == bs and y.tokens_per_req == full])

    def capture_logits_widths(self, per_req: Callable[[int], int]) -> None:
        """Add graphs of the step mode whose requests' logits are fewer, `per_req(bs)` rows
        (block offsets 1..n) for each captured batch size's running sizes, beside the ones of
        the registered count: the DFlash draft of a static step verifying n proposals (its
        LM head, most of the draft's FLOPs at large batches, then reads only those). A step
        asks for its count with `ForwardInputs.logits_per_req`; none under 1 is captured
        (a step of width 1 runs no draft). Nothing without narrowable step graphs."""
        graphs = self.step_graphs
        if graphs is None or not graphs.parts.logits_per_req:
            return
        most, w = graphs.parts.logits_per_req, graphs.parts.tokens_per_req
        _capture_per_size(graphs, per_req, most,
                          f"logits rows per request above the registered {most}",
                          lambda bs, n: [ForwardLayout(graphs.mode, bs, w, logits_per_req=n)]
                          if n >= 1 else [])

    def forwards_info(self) -> dict[str, dict[str, int]]:
        """A copy of `forward_counts`: each mode's forwards so far, graph or eager."""
        return {mode: dict(counts) for mode, counts in self.forward_counts.items()}

    @property
    def step_graphs(self) -> GraphRunner | None:
        """The graphs of the runner's step mode (DECODE, TARGET_VERIFY or DRAFT_BLOCK)."""
        return next((g for g in self.graph_runners.values() if g.mode.is_cuda_graph()), None)

    def mixed_limits(self) -> tuple[int, int, int] | None:
        """(step requests, arrivals, arrival tokens) one MIXED forward takes: the largest
        captured graph's, or eagerly the running limit, a prefill graph's width and
        `--mixed-chunk-max-prefill-tokens`; None without MIXED forwards."""
        if ForwardMode.MIXED not in self.forwards:
            return None
        g, args = self.graph_runners.get(ForwardMode.MIXED), self.server_args
        if g is not None:
            x = g.layouts[-1]
            return x.step_bs, x.arrivals, x.arrival_tokens
        return (args.max_running_requests, mixed_max_arrivals(args),
                args.mixed_chunk_max_prefill_tokens)

    def mixed_chunk_sizes(self) -> list[int]:
        """Chunk token counts a MIXED forward takes without padding, ascending: its graphs'
        arrival token counts, or eagerly the default plan's; empty without MIXED forwards."""
        if ForwardMode.MIXED not in self.forwards:
            return []
        g = self.graph_runners.get(ForwardMode.MIXED)
        if g is not None:
            return sorted({x.arrival_tokens for x in g.layouts})
        return mixed_graph_plan(self.server_args, self.server_args.max_running_requests)[1]

    def prefill_graph_limits(self) -> tuple[int, int] | None:
        """(requests, tokens) one captured prefill graph takes; None without prefill graphs."""
        g = self.graph_runners.get(ForwardMode.EXTEND)
        return None if g is None else (g.layouts[-1].arrivals, g.layouts[-1].arrival_tokens)

    def prepare(self, inputs: ForwardInputs) -> ForwardBatch:
        """The batch of `inputs`: a captured graph's static views when one fits (the batch
        then replays it), else fresh tensors. Either way one host-to-device copy; the rest is
        derived on the device (`ForwardLayout.complete`: in the graph, or right here)."""
        # a prefill needs no registered parts; a step needs its prologue
        parts = self.forwards.get(inputs.mode) or ForwardParts(inputs.mode)
        live = ForwardLayout.of(inputs, inputs.step_width or parts.layout_width,
                                inputs.logits_per_req or parts.logits_per_req)
        if live.num_reqs == 0:
            raise ValueError(f"a {inputs.mode.name} forward needs requests")
        graphs = self.graph_runners.get(inputs.mode)
        if graphs is not None and inputs.aux_projection is None \
                and inputs.capture_hidden_mode == CaptureHiddenMode.NULL:
            i = graphs.fit(live)
            if i is not None:
                return graphs.prepare(i, inputs)
        host = live.pack(inputs)
        packed = torch.empty(live.num_values, dtype=torch.int64, device=self.device)
        to_device_into(packed, host.values)
        fb = live.batch(packed, self, host, torch.tensor(host.seq_lens_cpu),
                        capture_hidden_mode=inputs.capture_hidden_mode,
                        aux_projection=inputs.aux_projection)
        live.complete(packed, fb, parts.prologue)
        return fb

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replays the graph `prepare` chose (its outputs are borrowed until the next
        replay), else runs eagerly over row views of the aux storage where they fit."""
        fb, mode = forward_batch, forward_batch.forward_mode
        counts = self.forward_counts.setdefault(mode.name, {"graph": 0, "eager": 0})
        counts["graph" if fb.prepared_graph is not None else "eager"] += 1
        if fb.prepared_graph is not None:
            return self.graph_runners[mode].replay(fb)
        self.attn_backend.init_forward_metadata(fb)
        parts = self.forwards.get(mode)
        streamed = None if parts is None else parts.streamed_aux
        rows = None if self.aux_storage is None else self.aux_storage.rows(fb.num_tokens)
        if streamed is not None and fb.aux_projection is None:
            fb.aux_projection = streamed.new(fb.num_tokens, self.model_config.dtype, rows)
        elif (rows is not None and not self.aux_storage.streamed and fb.aux_projection is None
              and fb.aux_hidden_states_buffer is None):
            fb.aux_hidden_states_buffer = rows
        return run_model(self.model, fb, None if parts is None else parts.epilogue)


def _capture_per_size(graphs: GraphRunner, per_size: Callable[[int], int], most: int,
                      too_many: str, layouts: Callable[[int, int], list[ForwardLayout]]
                      ) -> None:
    """Add to `graphs` the `layouts(bs, x)` of each captured step size bs and each `x =
    per_size(b)` of the running sizes b it takes (`step_widths`), those not captured yet; a
    ValueError `too_many` where some `per_size(b)` exceeds `most`."""
    sizes = sorted({x.step_bs for x in graphs.layouts})
    if any(per_size(bs) > most for bs in range(1, sizes[-1] + 1)):
        raise ValueError(too_many)
    have = set(graphs.layouts)
    graphs.capture([y for bs, xs in step_widths(sizes, per_size).items() for x in xs
                    for y in layouts(bs, x) if y not in have])

"""Owns one model on one device: its weights, KV memory, attention backend and decode graphs.

Keep this file minimal: decisions go to `model_runner_components`, buffers to `runner_utils`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang_aux.srt.layers.aux_hidden_states import resolve_aux_hidden_states_width
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.layers.triton_ops.dispatch import require_triton
from sglang_aux.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from sglang_aux.srt.model_executor.model_runner_components.sizing import kv_pool_size
from sglang_aux.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue, run_model
from sglang_aux.srt.model_executor.runner.mixed_cuda_graph_runner import MixedCudaGraphRunner
from sglang_aux.srt.model_executor.runner.mixed_prologue import MixedLayout, MixedPrologue
from sglang_aux.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner
from sglang_aux.srt.model_executor.runner.step_prologue import StepPrologue
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_backend.eager_replay_backend import EagerReplayBackend
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import (
    get_capture_bs,
    mixed_graph_plan,
    mixed_max_arrivals,
    prefill_graph_plan,
)
from sglang_aux.srt.model_executor.runner_utils.mixed_buffers import MixedInputBuffers
from sglang_aux.srt.model_executor.runner_utils.pool import PREFILL_POOL, SHARED_POOL
from sglang_aux.srt.model_executor.runner_utils.prefill_buffers import PrefillInputBuffers
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_CAPTURE_BS = 8


def make_attn_backend(name: str) -> AttentionBackend:
    if name == "triton":
        require_triton()
        from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend()
    from sglang_aux.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    return TorchNativeAttnBackend()


def make_graph_backend(device: torch.device, pool: str = SHARED_POOL) -> GraphBackend:
    if device.type == "cuda":
        from sglang_aux.srt.model_executor.runner_backend.cuda_graph_backend import (
            CudaGraphBackend,
        )

        return CudaGraphBackend(device, pool)
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
        self.spec_algorithm = server_args.spec_algorithm
        self.device = torch.device(server_args.resolved_device())
        self.pp_size = server_args.pp_size
        self.model = model or get_model(model_config, self.device, pp_size=self.pp_size,
                                        load_format=server_args.load_format,
                                        seed=server_args.random_seed)
        if aux_layer_ids:
            self.model.set_dflash_layers_to_capture(list(aux_layer_ids))
        if req_to_token_pool is None:
            req_to_token_pool = ReqToTokenPool(
                server_args.max_running_requests, model_config.context_len, self.device
            )
        self.req_to_token_pool = req_to_token_pool
        if token_to_kv_pool_allocator is None:
            size = kv_pool_size(model_config, server_args, self.device)
            token_to_kv_pool_allocator = TokenToKVPoolAllocator(size, self.device)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.token_to_kv_pool = MHATokenToKVPool(
            token_to_kv_pool_allocator.size,
            model_config.num_layers,
            model_config.num_kv_heads,
            model_config.head_dim,
            model_config.dtype,
            self.device,
        )
        self.attn_backend = make_attn_backend(server_args.resolved_attention_backend())
        self.graph_runner: DecodeCudaGraphRunner | None = None
        self.prefill_graph_runner: PrefillCudaGraphRunner | None = None
        self.mixed_graph_runner: MixedCudaGraphRunner | None = None
        self.mixed_width = 0  # tokens per step request of MIXED forwards (0: none)
        # derives MIXED forwards' inputs on the device, in their graphs or eagerly
        self.mixed_prologue: MixedPrologue | None = None
        self.prefill_capture_tokens, self.prefill_capture_bs = prefill_graph_plan(
            server_args, on_cuda=self.device.type == "cuda",
            hidden_size=model_config.hf_config.hidden_size)
        # What every forward of a mode runs besides the model, inside its graph when one
        # replays: the epilogue after it, the streamed projection it feeds.
        self.epilogues: dict[ForwardMode, Epilogue] = {}
        self.streamed_aux: dict[ForwardMode, StreamedAux] = {}

    def get_aux_hidden_states_width(self) -> int:
        """Width of the runner-owned aux buffer its decode graphs share (0: none, also when
        they stream their aux states into a projection)."""
        if self.server_args.disable_shared_aux_buffer or self.streamed_aux:
            return 0
        return resolve_aux_hidden_states_width(
            model=self.model, spec_algorithm=self.spec_algorithm,
            is_draft_worker=self.is_draft_worker,
        )

    def init_decode_graphs(self, forward_mode: ForwardMode, captured_req_width: int,
                           epilogue: Epilogue | None = None,
                           streamed_aux: StreamedAux | None = None,
                           step_prologue: StepPrologue | None = None) -> None:
        """Capture the decode-step graphs, unless disabled. `epilogue` runs after every
        `forward_mode` forward, inside its graph when one replays, eagerly otherwise; so does
        the `streamed_aux` projection (before the model). With `step_prologue` the graphs
        derive their inputs from three values per request (`schedule_batch.build_step_batch`
        hands them over)."""
        args = self.server_args
        self._register(forward_mode, epilogue, streamed_aux)
        if args.disable_decode_cuda_graph:
            return
        default_max_bs = args.max_running_requests
        if self.device.type != "cuda":
            # Eager replay buys no speed; a few sizes keep every line of the runner exercised
            # without replaying 3 warm-up forwards for each of dozens of sizes at start.
            default_max_bs = min(default_max_bs, CPU_DEFAULT_MAX_CAPTURE_BS)
        max_bs = min(args.cuda_graph_max_bs_decode or default_max_bs, args.max_running_requests)
        capture_bs = get_capture_bs(
            max_bs=max_bs,
            speculative=not self.spec_algorithm.is_none(),
            override=args.cuda_graph_bs_decode,
        )
        self.graph_runner = DecodeCudaGraphRunner(
            self, forward_mode=forward_mode, captured_req_width=captured_req_width,
            capture_bs=capture_bs, backend=make_graph_backend(self.device), epilogue=epilogue,
            streamed_aux=streamed_aux,
            # the prefill graphs write the same shared aux buffer
            aux_rows=max(self.prefill_capture_tokens, default=0), step_prologue=step_prologue,
        )
        self.graph_runner.capture()

    def init_prefill_graphs(self, epilogue: Epilogue | None = None,
                            streamed_aux: StreamedAux | None = None) -> None:
        """Capture the prefill (EXTEND) graphs `prefill_graph_plan` asks for; `epilogue` and
        `streamed_aux` as in `init_decode_graphs`. Call after `init_decode_graphs`: the
        prefill graphs borrow the decode graphs' shared aux storage, unless a prefill may
        replay beside a decode step (`enable_concurrent_prefill`): then they own their aux
        storage and graph pool, and nothing they write is read by a decode graph."""
        self._register(ForwardMode.EXTEND, epilogue, streamed_aux)
        tokens, max_bs = self.prefill_capture_tokens, self.prefill_capture_bs
        if not tokens:
            return
        if self.device.type == "cuda" and not self.attn_backend.extend_graph_safe:
            logger.info("No prefill graphs: the %s attention backend reads host lists",
                        type(self.attn_backend).__name__)
            return
        beside = self.server_args.enable_concurrent_prefill
        decode = None if self.graph_runner is None or beside else self.graph_runner.buffers
        aux = None if decode is None else decode.aux_hidden_states
        acc = None if decode is None else decode.aux_projection_acc
        if aux is None and self.get_aux_hidden_states_width() > 0:
            aux = torch.zeros((tokens[-1], self.get_aux_hidden_states_width()),
                              dtype=self.model_config.dtype, device=self.device)
        if acc is None and streamed_aux is not None:
            acc = torch.zeros((tokens[-1], streamed_aux.width), dtype=torch.float32,
                              device=self.device)
        buffers = PrefillInputBuffers.create(
            max_tokens=tokens[-1], max_bs=max_bs, vocab_size=self.model_config.hf_config.vocab_size,
            dtype=self.model_config.dtype, device=self.device, aux_hidden_states=aux,
            aux_projection_acc=acc)
        self.prefill_graph_runner = PrefillCudaGraphRunner(
            self, capture_tokens=tokens, max_bs=max_bs,
            backend=make_graph_backend(self.device, PREFILL_POOL if beside else SHARED_POOL),
            buffers=buffers, epilogue=epilogue, streamed_aux=streamed_aux)
        self.prefill_graph_runner.capture()

    def init_mixed_graphs(self, width: int, step_prologue: StepPrologue,
                          epilogue: Epilogue | None = None,
                          streamed_aux: StreamedAux | None = None) -> None:
        """Let MIXED forwards run: a step of `width` tokens per running request and arrivals'
        prefills in one forward (`--enable-mixed-chunk`), captured when the decode graphs
        are. `step_prologue` derives the step requests' inputs, as in their decode graphs;
        `epilogue` and `streamed_aux` as in `init_decode_graphs`. Call after
        `init_decode_graphs`: the graphs borrow its shared aux storage when it has the rows."""
        args = self.server_args
        self._register(ForwardMode.MIXED, epilogue, streamed_aux)
        self.mixed_width = width
        self.mixed_prologue = MixedPrologue(step_prologue)
        decode = self.graph_runner
        if decode is None or (self.device.type == "cuda"
                              and not self.attn_backend.extend_graph_safe):
            return
        step_bs, tokens, arrivals = mixed_graph_plan(args, max(decode.capture_bs))
        largest = MixedLayout(step_bs[-1], width, arrivals, tokens[-1])
        max_tokens = largest.num_tokens
        aux, acc = decode.buffers.aux_hidden_states, decode.buffers.aux_projection_acc
        if aux is not None and aux.shape[0] < max_tokens:
            aux = torch.zeros((max_tokens, aux.shape[1]), dtype=aux.dtype, device=self.device)
        if streamed_aux is not None and (acc is None or acc.shape[0] < max_tokens):
            acc = torch.zeros((max_tokens, streamed_aux.width), dtype=torch.float32,
                              device=self.device)
        buffers = MixedInputBuffers.create(
            num_values=largest.num_values, max_tokens=max_tokens,
            max_logits_rows=largest.num_logits_rows,
            vocab_size=self.model_config.hf_config.vocab_size, dtype=self.model_config.dtype,
            device=self.device, aux_hidden_states=aux, aux_projection_acc=acc)
        self.mixed_graph_runner = MixedCudaGraphRunner(
            self, width=width, step_bs=step_bs, arrival_tokens=tokens, max_arrivals=arrivals,
            backend=make_graph_backend(self.device), buffers=buffers,
            prologue=self.mixed_prologue, epilogue=epilogue, streamed_aux=streamed_aux)
        self.mixed_graph_runner.capture()

    def mixed_layout(self, step_bs: int, num_arrivals: int, arrival_tokens: int
                     ) -> MixedLayout:
        """The layout of a MIXED batch: its mixed graph's (padded), else the live sizes (it
        runs eagerly)."""
        g = self.mixed_graph_runner
        padded = None if g is None else g.padded_layout(step_bs, num_arrivals, arrival_tokens)
        return padded or MixedLayout(step_bs, self.mixed_width, num_arrivals, arrival_tokens)

    def mixed_limits(self) -> tuple[int, int, int] | None:
        """(step requests, arrivals, arrival tokens) one MIXED forward takes: the largest
        captured graph's, or eagerly the running limit, a prefill graph's width and
        `--mixed-chunk-max-prefill-tokens`; None before `init_mixed_graphs`."""
        if not self.mixed_width:
            return None
        g, args = self.mixed_graph_runner, self.server_args
        if g is not None and g.graphs:
            return g.step_bs[-1], g.max_arrivals, g.arrival_tokens[-1]
        return (args.max_running_requests, mixed_max_arrivals(args),
                args.mixed_chunk_max_prefill_tokens)

    def prefill_graph_limits(self) -> tuple[int, int] | None:
        """(requests, tokens) one captured prefill graph takes; None without prefill graphs."""
        g = self.prefill_graph_runner
        return None if g is None or not g.graphs else (g.max_bs, g.capture_tokens[-1])

    def _register(self, mode: ForwardMode, epilogue: Epilogue | None,
                  streamed_aux: StreamedAux | None) -> None:
        for part, registry in ((epilogue, self.epilogues), (streamed_aux, self.streamed_aux)):
            if part is not None and part.mode != mode:
                raise ValueError(f"a {part.mode.name} {type(part).__name__} for {mode.name}")
            registry.pop(mode, None)
            if part is not None:
                registry[mode] = part

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replays a graph when one fits (its outputs are borrowed until the next replay),
        else runs eagerly."""
        for graphs in (self.graph_runner, self.prefill_graph_runner, self.mixed_graph_runner):
            if graphs is not None and graphs.can_run_graph(forward_batch):
                return graphs.execute(forward_batch)
        mode = forward_batch.forward_mode
        self.attn_backend.init_forward_metadata(forward_batch)
        streamed = self.streamed_aux.get(mode)
        if streamed is not None:
            forward_batch.aux_projection = streamed.new(
                forward_batch.num_tokens, self.model_config.dtype, None)
        return run_model(self.model, forward_batch, self.epilogues.get(mode))

"""Owns one model on one device: its weights, KV memory, attention backend and decode graphs.

Keep this file minimal: decisions go to `model_runner_components`, buffers to `runner_utils`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang_aux.srt.layers.logits_processor import LogitsProcessorOutput
from sglang_aux.srt.mem_cache.memory_pool import (
    MHATokenToKVPool,
    ReqToTokenPool,
    TokenToKVPoolAllocator,
)
from sglang_aux.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)
from sglang_aux.srt.model_executor.model_runner_components.sizing import kv_pool_size
from sglang_aux.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang_aux.srt.model_executor.runner.epilogue import Epilogue
from sglang_aux.srt.model_executor.runner.streamed_aux import StreamedAux
from sglang_aux.srt.model_executor.runner_backend.base import GraphBackend
from sglang_aux.srt.model_executor.runner_backend.eager_replay_backend import EagerReplayBackend
from sglang_aux.srt.model_executor.runner_utils.capture_sizes import get_capture_bs
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.server_args import ServerArgs

logger = logging.getLogger(__name__)

CPU_DEFAULT_MAX_CAPTURE_BS = 8


def make_attn_backend(name: str) -> AttentionBackend:
    if name == "triton":
        from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend

        return TritonAttnBackend()
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
        self.epilogue: Epilogue | None = None
        self.streamed_aux: StreamedAux | None = None

    def get_aux_hidden_states_width(self) -> int:
        """Width of the runner-owned aux buffer its decode graphs share (0: none, also when
        they stream their aux states into a projection)."""
        if self.server_args.disable_shared_aux_buffer or self.streamed_aux is not None:
            return 0
        return resolve_aux_hidden_states_width(
            model=self.model, spec_algorithm=self.spec_algorithm,
            is_draft_worker=self.is_draft_worker,
        )

    def init_decode_graphs(self, forward_mode: ForwardMode, captured_req_width: int,
                           epilogue: Epilogue | None = None,
                           streamed_aux: StreamedAux | None = None) -> None:
        """Capture the decode-step graphs, unless disabled. `epilogue` runs after every
        `forward_mode` forward, inside its graph when one replays, eagerly otherwise; so does
        the `streamed_aux` projection (before the model)."""
        args = self.server_args
        self.epilogue = epilogue
        self.streamed_aux = streamed_aux
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
        )
        self.graph_runner.capture()

    def forward(self, forward_batch: ForwardBatch) -> LogitsProcessorOutput:
        """Replays a graph when one fits (its outputs are borrowed until the next replay),
        else runs eagerly."""
        if self.graph_runner is not None and self.graph_runner.can_run_graph(forward_batch):
            return self.graph_runner.execute(forward_batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        streamed = self.streamed_aux
        if streamed is not None and streamed.mode == forward_batch.forward_mode:
            forward_batch.aux_projection = streamed.new(
                forward_batch.num_tokens, self.model_config.dtype, None)
        if forward_batch.aux_projection is not None:
            forward_batch.aux_projection.reset()
        out = self.model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
        if self.epilogue is not None and self.epilogue.mode == forward_batch.forward_mode:
            self.epilogue(forward_batch, out)
        return out

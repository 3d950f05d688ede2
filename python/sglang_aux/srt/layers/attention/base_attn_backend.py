"""The attention backend seam and its graph hooks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
    from sglang_aux.srt.layers.radix_attention import RadixAttention


class AttentionBackend(ABC):
    """Computes attention for every forward mode and owns its per-batch metadata.

    Eager forwards call `init_forward_metadata`. A graph runner calls
    `init_cuda_graph_state` once, `init_forward_metadata_capture_cuda_graph` before each
    capture and `init_forward_metadata_replay_cuda_graph` before each replay, so metadata that
    a graph reads lives in static storage the backend owns.
    """

    # Whether a real CUDA graph of an EXTEND batch replays correctly for another batch: its
    # work must follow the batch's device tensors, not host lists read at capture.
    extend_graph_safe = False

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        """Prepare an eager forward."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate static metadata for graphs up to `max_bs` requests."""

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Point the metadata a graph will read at static storage, before capture."""

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        """Refresh static metadata for the padded batch about to be replayed."""

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,  # None with save_kv_cache=False: the caller stored K/V
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...

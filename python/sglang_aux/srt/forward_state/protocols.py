"""What a `ForwardBatch` carries from packages above this one, as protocols, so per-forward
state imports nothing above it: `layers.attention.AttentionBackend` and the draft fc's
projections (`MXFP8InputAccumulator`, `StreamedProjection`) satisfy them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch


class AttentionForward(Protocol):
    """What a layer calls on `ForwardBatch.attn_backend`."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,  # None with save_kv_cache=False: the caller stored K/V
        v: torch.Tensor | None,
        layer: Any,  # the calling RadixAttention
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor: ...


class AuxProjection(Protocol):
    """The draft fc's projection fed one aux slice at a time (`MXFP8InputAccumulator`,
    `StreamedProjection`); the caller reads the fc output with `result()`."""

    num_slices: int

    @property
    def num_accumulated(self) -> int: ...

    def accumulate(self, hidden: torch.Tensor) -> None: ...

    def result(self) -> torch.Tensor: ...

    def reset(self) -> None: ...

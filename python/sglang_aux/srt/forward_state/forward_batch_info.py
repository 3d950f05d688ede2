"""What one model forward sees: the mode, the token layout and views of the KV memory, and,
as protocols, what it carries from packages above this one (so per-forward state imports
nothing above it): `layers.attention.AttentionBackend` satisfies `AttentionForward`, the draft
fc's projections (`MXFP8InputAccumulator`, `StreamedProjection`) `AuxProjection`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests
    from sglang_aux.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool


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


class ForwardMode(IntEnum):
    EXTEND = auto()  # prefill: new tokens per request, causal over the cached prefix
    DECODE = auto()  # one token per request
    TARGET_VERIFY = auto()  # B tokens per request, causal over prefix and block
    DRAFT_BLOCK = auto()  # DFlash draft: B block queries (causality per layer: attn_type)
    # one forward of both: the running requests' step tokens (a fixed width each, first),
    # then arrivals' prefill tokens; an EXTEND batch whose logits rows are listed
    MIXED = auto()

    def is_extend(self) -> bool:
        """EXTEND, or MIXED (whose every request is an extend of its new tokens)."""
        return self in (ForwardMode.EXTEND, ForwardMode.MIXED)

    def is_mixed(self) -> bool:
        return self == ForwardMode.MIXED

    def is_cuda_graph(self) -> bool:
        """Modes whose token layout is fixed per request, so a graph can be captured."""
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_BLOCK)


class CaptureHiddenMode(IntEnum):
    NULL = auto()  # keep no hidden states
    FULL = auto()  # every token's final hidden state


@dataclass
class ForwardBatch:
    """Inputs of one forward. Token-major tensors are `[num_tokens]`, request-major `[bs]`.

    `seq_lens` counts every token of a request once this forward has run (prefix + new).
    The `extend_*` fields describe EXTEND batches only; a captured EXTEND graph pads its
    tokens past the live ones and its requests with `extend_seq_lens` 0.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # [num_tokens]
    req_pool_indices: torch.Tensor  # [bs]
    seq_lens: torch.Tensor  # [bs]
    seq_lens_cpu: torch.Tensor  # [bs], host copy for host-side loops
    out_cache_loc: torch.Tensor  # [num_tokens] KV slots this forward writes
    positions: torch.Tensor  # [num_tokens]
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: MHATokenToKVPool
    attn_backend: AttentionForward
    extend_prefix_lens_cpu: list[int] | None = None
    extend_seq_lens_cpu: list[int] | None = None
    # EXTEND on the device, `[bs]` each: cached tokens before this forward, new tokens, and
    # the first row of each request's new tokens. What kernels and graphs read.
    extend_prefix_lens: torch.Tensor | None = None
    extend_seq_lens: torch.Tensor | None = None
    extend_start_loc: torch.Tensor | None = None
    capture_hidden_mode: CaptureHiddenMode = CaptureHiddenMode.NULL
    # Graph-owned output storage. When set, the LM head writes `[num_tokens, vocab]` logits
    # here and the aux packer writes `[num_tokens, K * hidden]` here (see AuxHiddenStatePacker).
    next_token_logits_buffer: torch.Tensor | None = None
    aux_hidden_states_buffer: torch.Tensor | None = None
    # The draft fc's projection fed as aux states are produced (no packed aux output; the
    # caller reads the projection): a staged MXFP8 input (large eager forwards only) or a
    # streamed projection into a [num_tokens, H_draft] fp32 accumulator (any forward).
    aux_projection: AuxProjection | None = None
    # Set by the runner while a graph is captured; models keep graph-unsafe paths off then.
    is_capturing: bool = False
    # Some request samples (T > 0): the epilogue's sampling step runs too (runner/epilogue.py).
    has_sampling: bool = False
    # The graph (its index in the mode's GraphRunner) whose static storage holds this batch
    # (`ModelRunner.prepare`): its tensors are views the graph's prologue fills at replay.
    prepared_graph: int | None = None
    # MIXED: the leading requests that take a step (`mixed_step_width` tokens each, padded
    # requests of a graph included) and `[rows]` the token rows the LM head reads: every step
    # token, then each arrival's last token (a graph pads them with row 0).
    mixed_step_bs: int = 0
    mixed_step_width: int = 0
    logits_rows: torch.Tensor | None = None
    # A step whose LM head reads each request's tokens at block offsets 1..n only (a DFlash
    # draft block's proposals: `[bs * n, vocab]` logits); 0: every token's.
    logits_per_req: int = 0
    # A ragged step's requests (token-major, one entry per token): where each one's tokens
    # lie, filled by its prologue on the device; None for every other forward.
    ragged: RaggedRequests | None = None

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def tokens_per_req(self) -> int:
        """Tokens per request in a fixed-layout (graph) mode."""
        return self.num_tokens // max(self.batch_size, 1)

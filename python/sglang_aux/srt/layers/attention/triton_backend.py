"""Attention in Triton kernels over the paged KV pool: the GPU backend.

Semantics equal TorchNativeAttnBackend's for every mode; the kernels live in `triton_ops/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang_aux.srt.layers.attention.triton_ops import tiling
from sglang_aux.srt.layers.attention.triton_ops.decode_attention import (
    MERGE_MODES,
    MergeMode,
    SplitCounters,
    decode_attention_fwd,
)
from sglang_aux.srt.layers.attention.triton_ops.extend_attention import extend_attention_fwd
from sglang_aux.srt.layers.attention.triton_ops.tiling import check_head_dim

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch
    from sglang_aux.srt.forward_state.ragged_requests import RaggedRequests
    from sglang_aux.srt.layers.radix_attention import RadixAttention


@dataclass(frozen=True)
class ExtendMetadata:
    """Where each extend request's queries and keys lie (device tensors, `[bs]`): every request
    of an EXTEND batch, the arrivals (the requests after the step ones) of a MIXED batch."""

    forward_batch: ForwardBatch  # the batch this was built for
    req_pool_indices: torch.Tensor
    q_start: torch.Tensor  # first query row of each request, in the whole batch
    prefix_lens: torch.Tensor  # cached tokens before this forward
    extend_lens: torch.Tensor  # new tokens in this forward
    # Sizes the grid, from the host lists: the live batch's longest request eagerly; a
    # captured graph's lists hold its token bucket, so the grid covers any batch it replays.
    max_extend_len: int

    @classmethod
    def build(cls, fb: ForwardBatch) -> ExtendMetadata:
        if fb.extend_seq_lens_cpu is None:
            raise ValueError("an EXTEND batch needs extend_seq_lens_cpu")
        first = fb.mixed_step_bs if fb.forward_mode.is_mixed() else 0
        extend = fb.extend_seq_lens_cpu
        if fb.extend_start_loc is not None:
            q_start, prefix, ext = fb.extend_start_loc, fb.extend_prefix_lens, fb.extend_seq_lens
        else:  # a batch built by hand with host lists only
            if fb.extend_prefix_lens_cpu is None:
                raise ValueError("an EXTEND batch without extend_* device tensors needs "
                                 "extend_prefix_lens_cpu")
            as_tensor = lambda xs: torch.tensor(xs, dtype=torch.int32, device=fb.seq_lens.device)
            q_start = as_tensor([0, *accumulate(extend)][:-1])
            prefix, ext = as_tensor(fb.extend_prefix_lens_cpu), as_tensor(extend)
        return cls(fb, fb.req_pool_indices[first:], q_start[first:], prefix[first:],
                   ext[first:], max(extend[first:], default=0))


class TritonAttnBackend(AttentionBackend):
    """Paged attention in Triton for EXTEND, DECODE, TARGET_VERIFY, DRAFT_BLOCK and MIXED
    (the step rows through the fixed-layout kernel, the arrivals through the extend one).
    A ragged step (`ForwardBatch.ragged`: compact verify, one entry per token) runs the
    fixed-layout kernel over its request slots instead of its entries, so each request's keys
    are read once for all its tokens, as in a static verify step.

    A query at position p of a request with `seq_len` tokens sees key positions `j < seq_len`,
    `j <= p` too when the layer is causal, and `p - j <= layer.sliding_window_size` when it
    has a window (kernels skip key tiles before the window); EXTEND queries sit at
    `prefix_len + i`. Scores use `layer.scaling` with fp32 softmax accumulation; the output has
    q's dtype. Requires head_dim a power of two in [16, 256] and GQA (q heads a multiple of kv
    heads).

    NOTE: graph hooks are trivial on purpose. The fixed-layout kernels read
    `req_pool_indices`, `seq_lens` and `positions` straight from the ForwardBatch, whose
    tensors the graph runner keeps static and refreshes in place before each replay, and
    their grid and key split depend only on (bs, heads, tokens per request); a ragged step's
    request layout is device state its prologue writes inside the graph, and its grid
    depends on (token bucket, heads, verify width). So no metadata
    needs copying at replay and nothing in those paths syncs with the host. A captured
    EXTEND graph reads the batch's `extend_*` device tensors the same way; its grid covers
    the graph's token bucket, programs past a request's new tokens store nothing, and with a
    key split the padding rows merge to 0.

    `num_kv_splits` fixes the key split of every mode (None: enough splits to fill the
    device's SMs; tests force a value to cover the merge path). `decode_merge` picks how the
    fixed-layout modes combine key splits (`decode_attention.py`): "launch" (the default) runs
    a merge kernel after every split launch; "in_kernel" keeps contexts up to
    `min_split_keys` in one program that writes the output, and merges longer ones in the
    same launch. In-kernel merges share `SplitCounters`, so this backend's fixed-layout
    forwards must not run concurrently (they do not: every forward of a runner runs on its
    one stream). `single_pass` (a bench-only candidate, `tiling.SinglePassTile`) runs the
    fixed-layout modes with no key split at that tile. `merge_heads`: the query heads of a
    token one merge program combines (`merge_attn_states`).
    """

    extend_graph_safe = True

    def __init__(self, num_kv_splits: int | None = None, decode_merge: MergeMode = "launch",
                 min_split_keys: int = tiling.MIN_SPLIT_KEYS,
                 single_pass: tiling.SinglePassTile | None = None,
                 merge_heads: int = tiling.MERGE_HEADS):
        if num_kv_splits is not None and num_kv_splits < 1:
            raise ValueError(f"num_kv_splits must be >= 1, got {num_kv_splits}")
        if decode_merge not in MERGE_MODES:
            raise ValueError(f"decode_merge must be one of {MERGE_MODES}, got {decode_merge!r}")
        if min_split_keys < 1:
            raise ValueError(f"min_split_keys must be >= 1, got {min_split_keys}")
        self.num_kv_splits = num_kv_splits
        self.decode_merge = decode_merge
        self.min_split_keys = min_split_keys
        self.single_pass = single_pass
        if merge_heads < 1 or merge_heads & (merge_heads - 1):
            raise ValueError(f"merge_heads must be a power of two, got {merge_heads}")
        self.merge_heads = merge_heads
        self._split_counters = SplitCounters()
        self._extend: ExtendMetadata | None = None

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        self._extend = None
        if forward_batch.forward_mode.is_extend():
            self._extend = ExtendMetadata.build(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Nothing to allocate: graphs read the runner's static ForwardBatch tensors."""

    def init_forward_metadata_capture_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        self._check_graph_mode(forward_batch)

    def init_forward_metadata_replay_cuda_graph(self, forward_batch: ForwardBatch) -> None:
        self._check_graph_mode(forward_batch)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None, v: torch.Tensor | None,
                layer: RadixAttention, forward_batch: ForwardBatch,
                save_kv_cache: bool = True) -> torch.Tensor:
        """q `[T, H*D]`, k/v `[T, KVH*D]` -> `[T, H*D]` in q's dtype."""
        num_heads, num_kv_heads, head_dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.head_dim
        check_head_dim(head_dim)
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} q heads are not a multiple of {num_kv_heads} kv heads")
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv(layer.layer_id, forward_batch.out_cache_loc,
                        k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim))
        q = q.view(-1, num_heads, head_dim)  # [T, H, D]
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if q.shape[0] == 0:  # an empty batch: nothing to launch
            return out.view(0, num_heads * head_dim)
        k_buffer, v_buffer = pool.k_buffer[layer.layer_id], pool.v_buffer[layer.layer_id]
        req_to_token = forward_batch.req_to_token_pool.req_to_token
        mode = forward_batch.forward_mode
        if mode.is_extend():
            meta = self._extend_metadata(forward_batch)
            # MIXED: the arrivals' rows follow the step rows, which the fixed-layout kernel
            # reads; each kernel writes its own rows whole.
            t = forward_batch.mixed_step_bs * forward_batch.mixed_step_width
            extend_attention_fwd(q[t:], k_buffer, v_buffer, out[t:], req_to_token,
                                 meta.req_pool_indices, meta.q_start, meta.prefix_lens,
                                 meta.extend_lens, meta.max_extend_len, layer.scaling,
                                 layer.is_causal, layer.sliding_window_size,
                                 self.num_kv_splits, q_offset=t)
            if mode.is_mixed():
                n = forward_batch.mixed_step_bs
                self._fixed_layout(q[:t], k_buffer, v_buffer, out[:t], req_to_token,
                                   forward_batch.req_pool_indices[:n],
                                   forward_batch.seq_lens[:n], forward_batch.positions[:t],
                                   layer)
        else:
            bs = forward_batch.batch_size
            if q.shape[0] % bs:
                raise ValueError(f"{q.shape[0]} tokens do not split evenly over {bs} requests")
            ragged = forward_batch.ragged
            rows = forward_batch.req_pool_indices if ragged is None else ragged.request_rows
            self._fixed_layout(q, k_buffer, v_buffer, out, req_to_token, rows,
                               forward_batch.seq_lens, forward_batch.positions, layer, ragged)
        return out.view(-1, num_heads * head_dim)

    def _fixed_layout(self, q, k_buffer, v_buffer, out, req_to_token, req_pool_indices,
                      seq_lens, positions, layer: RadixAttention,
                      ragged: RaggedRequests | None = None) -> None:
        decode_attention_fwd(q, k_buffer, v_buffer, out, req_to_token, req_pool_indices,
                             seq_lens, positions, layer.scaling, layer.is_causal,
                             self.num_kv_splits, layer.sliding_window_size,
                             merge=self.decode_merge, counters=self._split_counters,
                             min_split_keys=self.min_split_keys, single_pass=self.single_pass,
                             ragged=ragged, merge_heads=self.merge_heads)

    def _extend_metadata(self, fb: ForwardBatch) -> ExtendMetadata:
        # A caller that skipped init_forward_metadata still gets this batch's layout, never
        # the previous batch's.
        if self._extend is None or self._extend.forward_batch is not fb:
            self._extend = ExtendMetadata.build(fb)
        return self._extend

    def _check_graph_mode(self, fb: ForwardBatch) -> None:
        self._extend = None
        if fb.forward_mode.is_extend():
            if fb.extend_start_loc is None:
                raise ValueError("a captured EXTEND batch needs its extend_* device tensors")
            self._extend = ExtendMetadata.build(fb)
        elif not fb.forward_mode.is_cuda_graph():
            raise ValueError(f"{fb.forward_mode.name} batches cannot be captured in a graph")

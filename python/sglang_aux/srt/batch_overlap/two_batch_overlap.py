"""Two-batch overlap: splitting one forward batch into two children at a request boundary.

The aux packer runs in the parent forward (it packs the merged hidden states), so children
never see the parent's aux buffer or staged projection; likewise the LM head writes
parent-owned logits. A parent
field this split does not know how to cut raises, so a new ForwardBatch field cannot leak
into a child unsliced.
"""

from __future__ import annotations

import dataclasses

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch

_TOKEN_FIELDS = {"input_ids", "out_cache_loc", "positions"}
_REQUEST_FIELDS = {"req_pool_indices", "seq_lens", "seq_lens_cpu"}
# EXTEND only (None otherwise)
_REQUEST_LIST_FIELDS = {"extend_prefix_lens_cpu", "extend_seq_lens_cpu", "extend_prefix_lens",
                        "extend_seq_lens"}
_SHARED_FIELDS = {"forward_mode", "req_to_token_pool", "token_to_kv_pool", "attn_backend",
                  "capture_hidden_mode", "is_capturing", "has_sampling",
                  "logits_per_req"}  # per request: each child keeps it
_MIXED_ONLY_FIELDS = {"mixed_step_bs", "mixed_step_width"}
_PARENT_ONLY_FIELDS = {"aux_hidden_states_buffer", "next_token_logits_buffer", "aux_projection",
                       "prepared_graph"}


def filter_batch(parent: ForwardBatch, *, start_req: int, end_req: int, start_token: int,
                 end_token: int) -> ForwardBatch:
    """The child holding requests `[start_req, end_req)` and tokens `[start_token, end_token)`."""
    if parent.forward_mode.is_mixed():
        raise ValueError("two-batch overlap does not split MIXED batches (their step rows "
                         "and logits rows are laid out for one forward)")
    child = {}
    for f in dataclasses.fields(parent):
        value = getattr(parent, f.name)
        if f.name == "batch_size":
            child[f.name] = end_req - start_req
        elif f.name in _TOKEN_FIELDS:
            child[f.name] = value[start_token:end_token]
        elif f.name == "extend_start_loc" and value is not None:
            child[f.name] = value[start_req:end_req] - start_token  # rows of the child's tokens
        elif f.name in _REQUEST_FIELDS or (f.name in _REQUEST_LIST_FIELDS and value is not None):
            child[f.name] = value[start_req:end_req]
        elif f.name in _SHARED_FIELDS:
            child[f.name] = value
        elif f.name in _MIXED_ONLY_FIELDS:
            child[f.name] = value  # unset (0): a MIXED parent raised above
        elif f.name in _PARENT_ONLY_FIELDS or value is None:
            child[f.name] = None
        else:
            raise ValueError(
                f"two-batch overlap cannot split ForwardBatch.{f.name} (set on the parent); "
                "teach filter_batch how to cut it"
            )
    return ForwardBatch(**child)


def split_batch(parent: ForwardBatch) -> tuple[ForwardBatch, ForwardBatch]:
    """Two children with half the requests each (the first gets the smaller half)."""
    if parent.batch_size < 2:
        raise ValueError(f"two-batch overlap needs at least 2 requests, got {parent.batch_size}")
    mid = parent.batch_size // 2
    if parent.extend_seq_lens_cpu is not None:
        mid_token = sum(parent.extend_seq_lens_cpu[:mid])
    else:
        mid_token = mid * parent.tokens_per_req
    n_req, n_tok = parent.batch_size, parent.num_tokens
    return (
        filter_batch(parent, start_req=0, end_req=mid, start_token=0, end_token=mid_token),
        filter_batch(parent, start_req=mid, end_req=n_req, start_token=mid_token, end_token=n_tok),
    )

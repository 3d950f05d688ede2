"""A decode step's inputs, derived on the device from its request rows.

The host sends one integer per request, its row (`req_pool_indices`, one pinned copy per
step); each row's kv_len and last token are device state the previous forward left
(`ReqToTokenPool.kv_lens`, `last_tokens`). From them a step of `width` tokens per request
gets positions `kv_len + [0, width)`, KV slots gathered from the request rows, lengths
`kv_len + width`, and input ids: the last token, then the block's other tokens (the owner's
static storage, e.g. DFlash's draft proposals) or `fill_token_id`. A graph runs it inside
the graph, before the model, so a replay needs only the rows copy; an eager step runs the
same function over fresh tensors (`ForwardLayout.complete`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch


@dataclass(frozen=True)
class StepPrologue:
    fill_token_id: int = 0
    # bs -> `[bs, >= width - 1]` tokens after each request's last one (a narrower step takes
    # the leading ones), in storage its owner keeps static (a graph reads it at replay);
    # None: `fill_token_id`
    block_tokens: Callable[[int], torch.Tensor] | None = None

    def __call__(self, fb: ForwardBatch) -> None:
        """Write `fb`'s input_ids, positions, out_cache_loc and seq_lens in place from its
        rows (`req_pool_indices`) and the pool's row state."""
        bs, width = fb.batch_size, fb.tokens_per_req
        pool = fb.req_to_token_pool
        rows = fb.req_pool_indices
        kv_lens, last = pool.kv_lens[rows], pool.last_tokens[rows]
        positions = fb.positions.view(bs, width)
        torch.add(kv_lens[:, None], torch.arange(width, device=rows.device), out=positions)
        slots = pool.req_to_token[rows[:, None], positions]
        fb.out_cache_loc.view(bs, width).copy_(slots)
        ids = fb.input_ids.view(bs, width)
        ids[:, 0] = last
        if width > 1:
            if self.block_tokens is None:
                ids[:, 1:] = self.fill_token_id
            else:
                ids[:, 1:] = self.block_tokens(bs)[:, : width - 1]
        torch.add(kv_lens, width, out=fb.seq_lens)

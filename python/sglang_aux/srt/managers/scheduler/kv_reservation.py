"""A request's row and KV slots, from admission to its end, with or without the prefix cache.

A request is given every KV slot it can ever need when it is admitted (one allocation, one row
write: `reserve_kv`), with one step's more under overlap, so a running batch never runs out of
slots mid-generation and a decode step allocates nothing; finishing or aborting gives the
whole reservation back.

With the prefix cache (`tree_cache`, SGLang's radix cache), admission first maps the longest
cached prefix of the prompt into the request's row and reserves only the rest (evicting
unlocked cached tokens when the pool is short); finishing or aborting hands the request's
written K/V to the cache instead of freeing it. Cached positions are safe to share because
every position below a request's kv_len holds final K/V for its token: the target's, and with
DFlash the draft context too (its prefill epilogue and verify commit write both for every
position they pass), and no forward writes below kv_len again. Under overlap a step still in
flight for a finished request writes only at or past its kv_len and reads cached slots that
later-launched work alone can reuse (stream order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req, map_cached_prefix, release_kv, reserve_kv
from sglang_aux.srt.mem_cache.radix_cache import RadixCache

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.model_runner import ModelRunner


class KvReservation:
    def __init__(self, runner: ModelRunner, limits: RequestLimits,
                 tree_cache: RadixCache | None):
        self.runner = runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.limits = limits
        self.tree_cache = tree_cache

    def take(self, req: Req) -> bool:
        """Give `req` a row holding its cached prefix (locked) and fresh slots for the rest of
        its reservation; False, taking nothing, when the pool is short even after eviction."""
        need, cache = self.limits.reservation(req), self.tree_cache
        if cache is None:
            if need > self.allocator.available_size():
                return False
            req.req_pool_idx = self.req_to_token_pool.alloc()
            reserve_kv(self.runner, req, need)
            return True
        # At most len - 1 tokens (as SGLang): the prefill must run the last prompt token to
        # yield the first output's logits.
        # Prompt logprobs need the logits of every position from start_len on: those
        # positions are prefilled, not taken from the cache (as SGLang).
        cap = len(req.origin_input_ids) - 1
        if req.logprob is not None:
            cap = min(cap, req.logprob.start_len)
        match = cache.match_prefix(req.origin_input_ids[:cap])
        cache.inc_lock_ref(match.last_node)  # before evicting: the match must stay
        short = need - match.slots.numel() - self.allocator.available_size()
        if short > cache.evictable_size():
            cache.dec_lock_ref(match.last_node)
            return False
        if short > 0:
            cache.evict(short)
        req.req_pool_idx = self.req_to_token_pool.alloc()
        req.last_node = match.last_node
        map_cached_prefix(self.runner, req, match.slots)
        reserve_kv(self.runner, req, need)
        return True

    def untake(self, req: Req) -> None:
        """Undo `take` for a request that stays waiting."""
        if self.tree_cache is not None:
            self.tree_cache.dec_lock_ref(req.last_node)
            req.last_node = None
        release_kv(self.runner, req, keep=req.cached_tokens)
        req.kv_len = req.cached_tokens = 0

    def release(self, req: Req) -> None:
        """Finished or aborted, between steps: the K/V of its first min(kv_len, seq_len)
        positions (written, for the tokens at those positions: a finish can drop accepted
        tokens past seq_len) goes to the cache; the other slots and the row are freed."""
        cache = self.tree_cache
        if cache is None:
            release_kv(self.runner, req)
            return
        n = min(req.kv_len, req.seq_len)
        tokens = (req.origin_input_ids + req.output_ids)[:n]
        slots = self.req_to_token_pool.req_to_token[req.req_pool_idx, :n].to(torch.int64)  # copy
        cached = cache.insert(tokens, slots)
        # `slots[:cached_tokens]` are the cache's own; up to `cached`, another request cached
        # the same tokens meanwhile, so ours are duplicates
        if cached > req.cached_tokens:
            self.allocator.free(slots[req.cached_tokens : cached])
        cache.dec_lock_ref(req.last_node)
        req.last_node = None
        release_kv(self.runner, req, keep=n)

    def flush_cache(self) -> int:
        """Free every cached KV slot (no request may hold any): the number freed."""
        return 0 if self.tree_cache is None else self.tree_cache.reset()

"""Continuous batching: admit waiting requests, prefill them, decode the running ones.

Each `step()` runs one prefill of newly admitted requests if any were admitted, else one
decode step of every running request. A request is given every KV slot it can ever need when
it is admitted (one allocation, one row write: `reserve_kv`), so a running batch never runs out
of slots mid-generation and a decode step allocates nothing; finishing or aborting gives the
whole reservation back.

With the prefix cache (`tree_cache`, SGLang's radix cache), admission first maps the longest
cached prefix of the prompt into the request's row and reserves only the rest (evicting
unlocked cached tokens when the pool is short); finishing or aborting hands the request's
written K/V to the cache instead of freeing it. Cached positions are safe to share because
every position below a request's kv_len holds final K/V for its token: the target's, and with
DFlash the draft context too (its prefill epilogue and verify commit write both for every
position they pass), and no forward writes below kv_len again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

import torch

from sglang_aux.srt.managers.schedule_batch import Req, map_cached_prefix, release_kv, reserve_kv
from sglang_aux.srt.managers.tokenizer import Tokenizer
from sglang_aux.srt.mem_cache.radix_cache import RadixCache

logger = logging.getLogger(__name__)


class Worker(Protocol):
    tokens_per_step: int  # most tokens one decode step can add to a request

    def prefill(self, reqs: list[Req]) -> list[list[int]]: ...  # rows and KV already reserved

    def decode(self, reqs: list[Req]) -> list[list[int]]: ...


class Scheduler:
    def __init__(self, worker: Worker, tokenizer: Tokenizer, *, max_running_requests: int,
                 context_len: int, eos_token_ids: set[int],
                 on_update: Callable[[Req], None] | None = None,
                 tree_cache: RadixCache | None = None):
        self.worker = worker
        self.runner = runner = worker.model_runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.tokenizer = tokenizer
        self.max_running_requests = max_running_requests
        self.context_len = context_len
        self.eos_token_ids = eos_token_ids
        self.on_update = on_update
        self.tree_cache = tree_cache
        self.cache_hit_tokens = 0  # prompt tokens admitted with their K/V already cached
        self.admitted_prompt_tokens = 0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.stats = {"prefill_steps": 0, "decode_steps": 0, "generated_tokens": 0}

    def validate(self, req: Req) -> None:
        """ValueError when the request can never run."""
        n = len(req.origin_input_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if n + self.worker.tokens_per_step > self.context_len:
            raise ValueError(f"the prompt has {n} tokens; the context holds {self.context_len}"
                             f" (less {self.worker.tokens_per_step} for a decode step)")
        if self._reservation(req) > self.allocator.size:
            raise ValueError(f"the request needs {self._reservation(req)} KV slots; the pool "
                             f"holds {self.allocator.size}")

    def add_request(self, req: Req) -> None:
        self.validate(req)
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _reservation(self, req: Req) -> int:
        # A step writes `tokens_per_step` positions from kv_len = seq_len - 1, and runs only
        # while fewer than max_new_tokens are out and seq_len + tokens_per_step - 1 is below
        # the context (see _finish_reason): every position stays below both bounds.
        need = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        return min(need + self.worker.tokens_per_step, self.context_len)

    def _admit(self) -> list[Req]:
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_running_requests:
            req = self.waiting[0]
            if req.sampling_params.max_new_tokens == 0:
                self.waiting.popleft()
                req.finished_reason = {"type": "length", "length": 0}
                self._notify(req)
                continue
            if not self._take_kv(req):
                break
            self.waiting.popleft()
            self.cache_hit_tokens += req.cached_tokens
            self.admitted_prompt_tokens += len(req.origin_input_ids)
            admitted.append(req)
        return admitted

    def _take_kv(self, req: Req) -> bool:
        """Give `req` a row holding its cached prefix (locked) and fresh slots for the rest of
        its reservation; False, taking nothing, when the pool is short even after eviction."""
        need, cache = self._reservation(req), self.tree_cache
        if cache is None:
            if need > self.allocator.available_size():
                return False
            req.req_pool_idx = self.req_to_token_pool.alloc()
            reserve_kv(self.runner, req, need)
            return True
        # At most len - 1 tokens (as SGLang): the prefill must run the last prompt token to
        # yield the first output's logits.
        match = cache.match_prefix(req.origin_input_ids[:-1])
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

    def abort(self, req: Req) -> None:
        """Drop `req` (waiting or running) and release its KV (`_release`); call between
        steps."""
        self.waiting = deque(r for r in self.waiting if r is not req)
        self.running = [r for r in self.running if r is not req]
        if req.req_pool_idx is not None:
            self._release(req)
        req.finished_reason = {"type": "abort"}

    def step(self) -> None:
        new = self._admit()
        if new:
            self.stats["prefill_steps"] += 1
            updated = self._process(new, self.worker.prefill(new))
            self.running += [r for r in new if not r.finished]
        elif self.running:
            self.stats["decode_steps"] += 1
            updated = self._process(self.running, self.worker.decode(self.running))
            self.running = [r for r in self.running if not r.finished]
        else:
            return
        # Notify once the running list is settled, so a listener never sees a finished
        # request still counted as running.
        for req in updated:
            self._notify(req)

    def _process(self, reqs: list[Req], new_tokens: list[list[int]]) -> list[Req]:
        for req, tokens in zip(reqs, new_tokens, strict=True):
            for tok in tokens:
                req.output_ids.append(tok)
                self.stats["generated_tokens"] += 1
                req.finished_reason = self._finish_reason(req, tok)
                if req.finished:
                    self._release(req)
                    break
        return reqs

    def _finish_reason(self, req: Req, tok: int) -> dict | None:
        p = req.sampling_params
        if (tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return {"type": "stop", "matched": tok}
        if p.stop:
            tail = self.tokenizer.decode(req.output_ids[-8 - max(map(len, p.stop)):])
            for s in p.stop:
                if s in tail:
                    return {"type": "stop", "matched": s}
        # the next step writes positions up to seq_len - 1 + tokens_per_step - 1
        at_context_end = req.seq_len + self.worker.tokens_per_step - 1 >= self.context_len
        if len(req.output_ids) >= p.max_new_tokens or at_context_end:
            return {"type": "length", "length": len(req.output_ids)}
        return None

    def _release(self, req: Req) -> None:
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

    def flush_cache(self) -> int | None:
        """Free every cached KV slot, only when idle (as SGLang): the number freed, or None
        while requests are waiting or running."""
        if self.has_work():
            return None
        return 0 if self.tree_cache is None else self.tree_cache.reset()

    def prefix_cache_info(self) -> dict:
        """The cache's sizes in tokens (one slot each) and its hits since start."""
        c = self.tree_cache
        return {
            "radix_cache_enabled": c is not None,
            "radix_cache_tokens": 0 if c is None else c.total_size(),
            "radix_cache_evictable_tokens": 0 if c is None else c.evictable_size(),
            "radix_cache_protected_tokens": 0 if c is None else c.protected_size(),
            "radix_cache_hit_tokens": self.cache_hit_tokens,
            "radix_cache_admitted_prompt_tokens": self.admitted_prompt_tokens,
        }

    def _notify(self, req: Req) -> None:
        if self.on_update is not None:
            self.on_update(req)

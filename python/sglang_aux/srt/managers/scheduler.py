"""Continuous batching: admit waiting requests, prefill them, decode the running ones. Each
`step()` launches one prefill of newly admitted requests if any were admitted, else one decode
step of every running request (with mixed steps, both in one forward: below), then reads the
tokens of launched steps: with overlap (SGLang's overlap scheduler) the previous step's, so the
host's bookkeeping of step n (appending tokens, stop checks, finishing, admitting) runs while
the device computes step n+1; without, the ones it just launched. A step's inputs come from the
rows' device state, so launching n+1 does not need n's tokens on the host; a request that n
finishes runs once more in n+1, and that row is dropped. A request is given every KV slot it
can ever need when it is admitted (one allocation, one row write: `reserve_kv`), with one
step's more under overlap, so a running batch never runs out of slots mid-generation and a
decode step allocates nothing; finishing or aborting gives the whole reservation back.

With the prefix cache (`tree_cache`, SGLang's radix cache), admission first maps the longest
cached prefix of the prompt into the request's row and reserves only the rest (evicting
unlocked cached tokens when the pool is short); finishing or aborting hands the request's
written K/V to the cache instead of freeing it. Cached positions are safe to share because
every position below a request's kv_len holds final K/V for its token: the target's, and with
DFlash the draft context too (its prefill epilogue and verify commit write both for every
position they pass), and no forward writes below kv_len again. Under overlap a step still in
flight for a finished request writes only at or past its kv_len and reads cached slots that
later-launched work alone can reuse (stream order).

With mixed steps (`--enable-mixed-chunk`, SGLang's flag) arrivals that fit a mixed forward
(`mixed_limits`) are not prefilled in a step of their own: one MIXED forward runs the running
batch's decode (or DFlash verify) step and their prefill (`Worker.mixed`), so a small model's
latency-bound forward is paid once for both. Both halves come back as steps of their own that
share one readback; an arrival too long for it is prefilled apart, as before, unless chunked
prefill is on: then it is chunked and each step's mixed forward carries its next chunk.

With chunked prefill (`--chunked-prefill-size N`, SGLang's flag) a prompt with more than N
uncached tokens is admitted alone (its row and whole reservation taken as usual) and becomes
`chunked`: each prefill turn runs its next N tokens (`Worker.prefill_chunk`: K/V and, with
DFlash, the draft context of those tokens, committed inside that forward, nothing sampled),
and the running batch's step runs between two chunks, so running requests keep decoding. Its
last chunk is an ordinary `prefill` over the cached-so-far prefix: it samples the first token
and the request joins the running batch. With mixed steps, while a running batch can step,
each chunk (at most min(N, the mixed token budget)) rides in its step's MIXED forward instead,
its last one sampling the first token (as SGLang). Nothing waiting is admitted meanwhile (one
chunked request at a time, as SGLang). Its kv_len counts every launched chunk, so an abort hands the
prefix cache only positions whose target and draft K/V a launched forward writes.

With structured output (`grammar_backend`), a request naming a grammar waits in
`grammar_queue` while a pool thread compiles it, and joins `waiting` with a matcher of its own
once compiled, so no step waits for a compile. The workers fill each step's token masks on the
host from the matchers, which must have seen every emitted token: a step with a grammar
request completes in the `step()` that launched it (no overlap lag for it; other steps keep
theirs), and grammar requests never ride in a mixed forward. Each emitted token advances the
request's matcher; one that accepted a stop token finishes the request (as SGLang).
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Protocol

import torch

from sglang_aux.srt.constrained.grammar_backend import GrammarBackend
from sglang_aux.srt.managers.finish_check import FinishCheck
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.prefill_delayer import PrefillDelayer
from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req, map_cached_prefix, release_kv, reserve_kv
from sglang_aux.srt.mem_cache.radix_cache import RadixCache

if TYPE_CHECKING:
    from sglang_aux.srt.model_executor.model_runner import ModelRunner
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# "1": scheduler_stats carries max_step_peak_bytes (CUDA)
STEP_PEAK_ENV = "SGLANG_AUX_RECORD_STEP_PEAK"
GRAMMAR_WAIT_S = 0.05  # an idle step's wait for a grammar compile (no busy loop meanwhile)


class Worker(Protocol):
    """What the scheduler drives: `ModelWorker` (managers/model_worker.py) or a speculative
    worker (speculative/dflash_worker.py), typed here so this layer never imports the one
    above it."""

    tokens_per_req: int  # most tokens one decode step can add to a request
    logprob_refusal: str | None  # why requests asking for logprobs are refused; None: served

    @property
    def model_runner(self) -> ModelRunner: ...  # the target's: pools, graph limits, device

    # per-request work once its row and KV are reserved; raising fails that request alone
    def admit(self, req: Req, eos_token_ids: set[int]) -> None: ...

    def prefill(self, reqs: list[Req]) -> PendingStep: ...  # rows and KV already reserved

    def decode(self, reqs: list[Req]) -> PendingStep: ...

    # the K/V (and draft context) of `req`'s next `num_tokens` prompt tokens: a chunk of a
    # chunked prefill that is not its last; nothing sampled, nothing read back
    def prefill_chunk(self, req: Req, num_tokens: int) -> None: ...

    # a decode step of `reqs` with the prefill of `arrivals` in one forward: (step, prefill);
    # with `chunk`, of the one chunked request's next `chunk` tokens, not its last: (step,)
    def mixed(self, reqs: list[Req], arrivals: list[Req],
              chunk: int | None = None) -> list[PendingStep]: ...


class Scheduler:
    def __init__(self, worker: Worker, tokenizer: Tokenizer, *, max_running_requests: int,
                 context_len: int, eos_token_ids: set[int],
                 on_update: Callable[[Req], None] | None = None, overlap: bool = False,
                 tree_cache: RadixCache | None = None,
                 prefill_delayer: PrefillDelayer | None = None,
                 prefill_graph_limits: tuple[int, int] | None = None,
                 mixed_limits: tuple[int, int, int] | None = None,
                 chunked_prefill_size: int | None = None,
                 grammar_backend: GrammarBackend | None = None):
        self.worker = worker
        self.runner = runner = worker.model_runner
        self.req_to_token_pool = runner.req_to_token_pool
        self.allocator = runner.token_to_kv_pool_allocator
        self.max_running_requests = max_running_requests
        self.context_len = context_len
        self.finish = FinishCheck(tokenizer, eos_token_ids, context_len, worker.tokens_per_req)
        self.limits = RequestLimits(context_len, worker.tokens_per_req, self.allocator.size,
                                    overlap, context_len * tokenizer.max_chars_per_token,
                                    worker.logprob_refusal)
        self.on_update = on_update
        self.overlap = overlap
        self.tree_cache = tree_cache
        self.prefill_delayer = prefill_delayer
        # (requests, tokens) one prefill graph takes; None: no prefill graphs
        self.prefill_graph_limits = prefill_graph_limits
        # set (`--enable-mixed-chunk`): (step requests, arrivals, arrival tokens) one mixed
        # forward takes; arrivals that fit ride in the running batch's step
        self.mixed_limits = mixed_limits
        # set: most new tokens one prefill step runs; a longer prompt is prefilled in chunks
        self.chunked_prefill_size = chunked_prefill_size
        self.chunked: Req | None = None  # admitted, mid chunked prefill, not running yet
        # set: requests may ask for structured output; they wait in `grammar_queue` until
        # their grammar is compiled (off this thread), then join `waiting`
        self.grammar_backend = grammar_backend
        self.grammar_queue: list[tuple[Req, Future]] = []
        self._decode_turn = False  # a chunk ran last: the running batch steps next
        self.cache_hit_tokens = 0  # prompt tokens admitted with their K/V already cached
        self.admitted_prompt_tokens = 0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        # launched, tokens not read (overlap): a prefill, a decode step, or both
        self.in_flight: list[PendingStep] = []
        self.stats = {"prefill_steps": 0, "decode_steps": 0, "generated_tokens": 0,
                      "prefill_requests": 0, "prefill_tokens": 0, "decode_batch_requests": 0,
                      "prefill_seconds": 0.0, "decode_seconds": 0.0,
                      "prefill_delayed_passes": 0,
                      "mixed_steps": 0, "mixed_requests": 0, "mixed_seconds": 0.0,
                      "chunked_prefill_steps": 0}
        # The allocator's largest peak above a step's start (CUDA; the host allocates as it
        # launches, so no sync is needed), on request: torch's memory_allocated and
        # max_memory_allocated each build and sort the allocator's whole stats dict, about
        # 0.1 ms of host time a call, and small models' steps are host-bound.
        self.record_step_peak = (self.runner.device.type == "cuda"
                                 and os.environ.get(STEP_PEAK_ENV, "0") == "1")
        if self.record_step_peak:
            self.stats["max_step_peak_bytes"] = 0

    @property
    def eos_token_ids(self) -> set[int]:
        return self.finish.eos_token_ids

    def validate(self, req: Req) -> None:
        """ValueError when the request can never run."""
        self.limits.validate(req)
        if req.sampling_params.grammar_key is not None and self.grammar_backend is None:
            raise ValueError("this engine serves no structured output (no grammar backend)")

    def add_request(self, req: Req) -> None:
        self.validate(req)
        key = req.sampling_params.grammar_key
        if key is None:
            self.waiting.append(req)
        else:
            self.grammar_queue.append((req, self.grammar_backend.compile(key)))

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight or self.chunked
                    or self.grammar_queue)

    def _take_compiled(self) -> None:
        """Requests whose grammar compiled join `waiting` with a matcher of their own, in
        arrival order; one whose grammar failed to compile fails alone. With nothing else to
        do, wait a moment for a compile first."""
        if not self.grammar_queue:
            return
        if not (self.waiting or self.running or self.in_flight or self.chunked):
            wait([f for _, f in self.grammar_queue], GRAMMAR_WAIT_S, FIRST_COMPLETED)
        pending = []
        for req, future in self.grammar_queue:
            if not future.done():
                pending.append((req, future))
                continue
            try:
                req.grammar = self.grammar_backend.new_grammar(future.result(), req.output_ids)
            except Exception as e:
                req.finished_reason = {"type": "abort", "message": f"grammar: {e}"}
                self._notify(req)
                continue
            self.waiting.append(req)
        self.grammar_queue = pending

    def _reservation(self, req: Req) -> int:
        return self.limits.reservation(req)

    def _admit(self, limits: tuple[int, int] | None, strict: bool = False) -> list[Req]:
        """Waiting requests for one prefill, in order, while rows and KV last; with `limits`
        (a prefill graph's), only as many requests and uncached tokens as one graph takes (a
        larger prefill runs eagerly, many times slower on a small model: the rest wait one
        step). `strict`: the first request must fit the token budget too (a mixed forward).
        With chunked prefill, no more than N uncached tokens; a first request with more
        becomes `chunked` instead (admitted, returned in no list; a mixed forward takes its
        chunks too)."""
        admitted, tokens = [], 0
        width, budget = limits or (None, None)
        n = self.chunked_prefill_size
        if n is not None:
            budget = n if budget is None else min(budget, n)
        while self.waiting and len(self.running) + len(admitted) < self.max_running_requests:
            if width is not None and len(admitted) == width:
                break
            req = self.waiting[0]
            if not self._take_kv(req):
                break
            uncached = len(req.origin_input_ids) - req.kv_len
            if self._next_chunk(req) is not None:
                if admitted:
                    self._untake_kv(req)
                    break
                self.waiting.popleft()
                if not self._admit_one(req):
                    continue
                self.cache_hit_tokens += req.cached_tokens
                self.admitted_prompt_tokens += len(req.origin_input_ids)
                self.chunked = req
                break
            if (admitted or strict) and budget is not None and tokens + uncached > budget:
                self._untake_kv(req)
                break
            self.waiting.popleft()
            if not self._admit_one(req):
                continue
            tokens += uncached
            self.cache_hit_tokens += req.cached_tokens
            self.admitted_prompt_tokens += len(req.origin_input_ids)
            admitted.append(req)
        return admitted

    def _admit_one(self, req: Req) -> bool:
        """The worker's per-request admission work; an error there is this request's alone:
        it fails (finish reason `abort` with the message), its row and KV go back and the
        prefix cache keeps what it holds, while the others are admitted and run."""
        try:
            self.worker.admit(req, self.finish.eos_token_ids)
        except Exception as e:
            logger.warning("request %s failed at admission: %r", req.rid, e)
            self._untake_kv(req)
            req.finished_reason = {"type": "abort", "message": f"admission failed: {e}"}
            self._notify(req)
            return False
        return True

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

    def _untake_kv(self, req: Req) -> None:
        """Undo `_take_kv` for a request that stays waiting."""
        if self.tree_cache is not None:
            self.tree_cache.dec_lock_ref(req.last_node)
            req.last_node = None
        release_kv(self.runner, req, keep=req.cached_tokens)
        req.kv_len = req.cached_tokens = 0

    def _next_chunk(self, req: Req) -> int | None:
        """Tokens of `req`'s next prefill step when it is a chunk that is not the last; None
        when the rest runs in one prefill. Prompt logprobs come from one prefill of the
        positions from their start on (`StepLogprobs`), so chunks stop there."""
        n, rest = self.chunked_prefill_size, len(req.origin_input_ids) - req.kv_len
        if n is None or rest <= n:
            return None
        stop = len(req.origin_input_ids) if req.logprob is None else req.logprob.start_len
        return min(n, stop - req.kv_len) if stop > req.kv_len else None

    def abort(self, req: Req) -> None:
        """Drop `req` (waiting, mid chunked prefill or running) and release its KV
        (`_release`); call between steps."""
        if req is self.chunked:
            self.chunked = None
        self.waiting = deque(r for r in self.waiting if r is not req)
        self.grammar_queue = [(r, f) for r, f in self.grammar_queue if r is not req]
        self.running = [r for r in self.running if r is not req]
        if req.req_pool_idx is not None:
            self._release(req)
        req.finished_reason = {"type": "abort"}

    def step(self) -> None:
        start = time.perf_counter()
        device = self.runner.device
        if self.record_step_peak:
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        self._take_compiled()
        prefill = self._prefill_now()
        new, launched = self._launch_mixed() if prefill else ([], [])
        kind = "mixed_seconds"
        if not launched:
            new, launched, prefilled = self._launch_apart(prefill)
            kind = "prefill_seconds" if prefilled and len(launched) <= 1 else "decode_seconds"
        self.running += new
        for step in launched:
            for r in step.reqs:
                r.pending_tokens += step.kv_growth
        # A grammar request's next masks need this step's tokens on the host: a step with
        # one completes now, without overlap's one-step lag (other steps keep it).
        lag = self.overlap and not any(r.grammar is not None for s in launched for r in s.reqs)
        done, self.in_flight = (self.in_flight, launched) if lag else (
            self.in_flight + launched, [])
        for step in done:
            self._complete(step)
        self.stats[kind] += time.perf_counter() - start
        if self.record_step_peak:
            peak = torch.cuda.max_memory_allocated(device) - base
            self.stats["max_step_peak_bytes"] = max(self.stats["max_step_peak_bytes"], peak)

    def _launch_mixed(self) -> tuple[list[Req], list[PendingStep]]:
        """Admitted arrivals and the one mixed forward that steps the running batch and
        prefills them; nothing when no arrival fits one (the caller prefills apart)."""
        if self.mixed_limits is None or not (self.waiting or self.chunked):
            return [], []
        max_step, width, budget = self.mixed_limits
        batch = [r for r in self.running if self._can_launch(r)]
        if not batch or len(batch) > max_step:
            return [], []
        # logprobs are computed by the prefill and decode steps apart (StepLogprobs); grammar
        # masks by the workers' prefill and decode steps
        pending = self.waiting if self.chunked is None else [self.chunked]
        if any(r.logprob is not None or r.grammar is not None for r in (*batch, *pending)):
            return [], []
        new = self._admit((width, budget), strict=True) if self.chunked is None else []
        if self.chunked is not None:
            return self._launch_mixed_chunk(batch, budget)
        if not new:
            return [], []
        self.stats["mixed_steps"] += 1
        self.stats["mixed_requests"] += len(new)
        self.stats["decode_batch_requests"] += len(batch)
        self.stats["prefill_requests"] += len(new)
        self.stats["prefill_tokens"] += sum(len(r.origin_input_ids) - r.kv_len for r in new)
        return new, self.worker.mixed(batch, new)

    def _launch_mixed_chunk(self, batch: list[Req], budget: int
                            ) -> tuple[list[Req], list[PendingStep]]:
        """One mixed forward of the running batch's step and the chunked request's next
        chunk, of at most min(N, `budget`) tokens; its last chunk samples its first token and
        the request joins the running batch."""
        req = self.chunked
        size = min(self.chunked_prefill_size, budget)
        rest = len(req.origin_input_ids) - req.kv_len
        self.stats["mixed_steps"] += 1
        self.stats["chunked_prefill_steps"] += 1
        self.stats["decode_batch_requests"] += len(batch)
        self.stats["prefill_tokens"] += min(size, rest)
        if rest > size:
            return [], self.worker.mixed(batch, [req], chunk=size)
        self.chunked = None
        self.stats["mixed_requests"] += 1
        self.stats["prefill_requests"] += 1
        return [req], self.worker.mixed(batch, [req])

    def _launch_apart(self, prefill: bool) -> tuple[list[Req], list[PendingStep], bool]:
        """A prefill step of admitted arrivals (or a chunk of the chunked request), or a
        decode step of the running batch; and whether a prefill ran."""
        new = self._admit(self.prefill_graph_limits) if prefill and self.chunked is None else []
        if prefill and self.chunked is not None:
            new, launched = self._launch_chunk()
            return new, launched, True
        self._decode_turn = False
        if new:
            self.stats["prefill_steps"] += 1
            self.stats["prefill_requests"] += len(new)
            self.stats["prefill_tokens"] += sum(len(r.origin_input_ids) - r.kv_len for r in new)
            return new, [self.worker.prefill(new)], True
        batch = [r for r in self.running if self._can_launch(r)]
        if self.running and not batch and not self.in_flight:
            raise RuntimeError(f"no step fits any of {len(self.running)} running requests")
        if not batch:
            return [], [], False
        self.stats["decode_steps"] += 1
        self.stats["decode_batch_requests"] += len(batch)
        return [], [self.worker.decode(batch)], False

    def _launch_chunk(self) -> tuple[list[Req], list[PendingStep]]:
        """The chunked request's next chunk; its last one is a prefill that samples its first
        token, and the request joins the running batch."""
        req, n = self.chunked, self._next_chunk(self.chunked)
        self.stats["prefill_steps"] += 1
        self.stats["chunked_prefill_steps"] += 1
        self.stats["prefill_tokens"] += n or len(req.origin_input_ids) - req.kv_len
        if n is not None:
            self.worker.prefill_chunk(req, n)
            self._decode_turn = True
            return [], []
        self.chunked = None
        self.stats["prefill_requests"] += 1
        return [req], [self.worker.prefill([req])]

    def _prefill_now(self) -> bool:
        if self.chunked is not None:
            return not (self._decode_turn and self.running)
        if not self.waiting:
            return False
        d = self.prefill_delayer
        if d is None or d.allow(len(self.waiting), len(self.running), self.max_running_requests):
            return True
        self.stats["prefill_delayed_passes"] += 1
        return False

    def _can_launch(self, req: Req) -> bool:
        """Whether a step fits what is known of `req`: its kv_len may have grown by the
        steps in flight, and the step's positions stay inside its slots and the context."""
        end = req.kv_len + req.pending_tokens + self.worker.tokens_per_req
        return end <= min(req.kv_reserved, self.context_len)

    def _complete(self, step: PendingStep) -> None:
        """Read a launched step's tokens, append them, finish requests, then notify."""
        live = []
        tokens_of = step.tokens()
        for req, tokens, logprobs in zip(step.reqs, tokens_of, step.output_logprobs(),
                                         strict=True):
            req.pending_tokens -= step.kv_growth
            if not req.finished:  # else it finished or was aborted after the launch
                live.append(req)
                self._append(req, tokens, logprobs)
        self.running = [r for r in self.running if not r.finished]
        # Notify once the running list is settled, so a listener never sees a finished
        # request still counted as running.
        for req in live:
            self._notify(req)

    def _append(self, req: Req, tokens: list[int], logprobs: list | None = None) -> None:
        if req.sampling_params.max_new_tokens == 0:
            # a prefill-only request (SGLang's cache_prefix): its prompt's K/V is cached,
            # the token its prefill sampled is dropped
            req.finished_reason = {"type": "length", "length": 0}
            self._release(req)
            return
        check_stop = self.finish.may_stop(req, tokens)
        for k, tok in enumerate(tokens):
            req.output_ids.append(tok)
            if logprobs is not None:
                req.output_logprobs.append(logprobs[k])
            self.stats["generated_tokens"] += 1
            grammar_end = self._advance_grammar(req, tok)
            req.finished_reason = self.finish.reason(req, tok, check_stop) or grammar_end
            if req.finished:
                self._release(req)
                break

    @staticmethod
    def _advance_grammar(req: Req, tok: int) -> dict | None:
        """Advance `req`'s grammar by its new token `tok`: a finish reason once the grammar
        has ended (it accepted a stop token, as SGLang finishes), else None. The token was
        chosen under the grammar's mask, so a refusal is a bug: the request fails loudly."""
        grammar = req.grammar
        if grammar is None:
            return None
        if not grammar.accept(tok):
            return {"type": "abort", "message": f"internal error: token {tok} breaks the "
                                                "request's grammar"}
        return {"type": "stop", "matched": tok} if grammar.terminated else None

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
        """Free every cached KV slot, only when no request waits or runs (as SGLang; a step
        still in flight then holds finished requests only, and work that reuses the slots
        launches after it): the number freed, else None."""
        if self.waiting or self.running or self.chunked:
            return None
        return 0 if self.tree_cache is None else self.tree_cache.reset()

    def _notify(self, req: Req) -> None:
        if self.on_update is not None:
            self.on_update(req)

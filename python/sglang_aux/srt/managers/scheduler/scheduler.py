"""Continuous batching: admit waiting requests, prefill them, decode the running ones.

Each `step()` launches one prefill of newly admitted requests if any were admitted, else one
decode step of every running request (with mixed steps, both in one forward: below), then
reads the tokens of launched steps (`OutputProcessor`): with overlap (SGLang's overlap
scheduler) the previous step's, so the host's bookkeeping of step n (appending tokens, stop
checks, finishing, admitting) runs while the device computes step n+1; without, the ones it
just launched. A step's inputs come from the rows' device state, so launching n+1 does not
need n's tokens on the host; a request that n finishes runs once more in n+1, and that row is
dropped. Admission reserves every KV slot a request can need (`KvReservation`, which also
explains the prefix cache); a request naming a grammar waits in `GrammarQueue` first.

With mixed steps (`--enable-mixed-chunk`, SGLang's flag; on by default on CUDA) arrivals that
fit a mixed forward (`mixed_limits`) are not prefilled in a step of their own: one MIXED forward
runs the running batch's decode (or DFlash verify) step and their prefill (`Worker.mixed`), so
a small model's latency-bound forward is paid once for both. Both halves come back as steps of
their own that share one readback; an arrival too long for it is prefilled apart, as before,
unless chunked prefill is on: then it is chunked and each step's mixed forward carries its next
chunk.

With chunked prefill (`--chunked-prefill-size N`, SGLang's flag) a prompt with more than N
uncached tokens is admitted alone (its row and whole reservation taken as usual) and becomes
`chunked`: each prefill turn runs its next N tokens (`Worker.prefill_chunk`: K/V and, with
DFlash, the draft context of those tokens, committed inside that forward, nothing sampled),
and the running batch's step runs between two chunks, so running requests keep decoding. Its
last chunk is an ordinary `prefill` over the cached-so-far prefix: it samples the first token
and the request joins the running batch. With mixed steps, while a running batch can step,
each chunk (at most min(N, the mixed token budget)) rides in its step's MIXED forward instead,
its last one sampling the first token (as SGLang); `ChunkPacer` owes the running batch decode
steps between those chunks so that it keeps its decode share (`--chunked-prefill-decode-share`).
Nothing waiting is admitted meanwhile (one chunked request at a time, as SGLang). Its kv_len
counts every launched chunk, so an abort hands the prefix cache only positions whose target
and draft K/V a launched forward writes.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable

import torch

from sglang_aux.srt.constrained.grammar_backend import GrammarBackend
from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.request_limits import RequestLimits
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.admission import Admission
from sglang_aux.srt.managers.scheduler.chunk_pacer import ChunkPacer
from sglang_aux.srt.managers.scheduler.finish_check import FinishCheck
from sglang_aux.srt.managers.scheduler.grammar_queue import GrammarQueue
from sglang_aux.srt.managers.scheduler.kv_reservation import KvReservation
from sglang_aux.srt.managers.scheduler.output_processor import OutputProcessor
from sglang_aux.srt.managers.scheduler.prefill_delayer import PrefillDelayer
from sglang_aux.srt.managers.scheduler.worker import Worker
from sglang_aux.srt.mem_cache.radix_cache import RadixCache
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

# "1": scheduler_stats carries max_step_peak_bytes (CUDA)
STEP_PEAK_ENV = "SGLANG_AUX_RECORD_STEP_PEAK"


class Scheduler:
    def __init__(self, worker: Worker, tokenizer: Tokenizer, *, max_running_requests: int,
                 context_len: int, eos_token_ids: set[int],
                 on_update: Callable[[Req], None] | None = None, overlap: bool = False,
                 tree_cache: RadixCache | None = None,
                 prefill_delayer: PrefillDelayer | None = None,
                 prefill_graph_limits: tuple[int, int] | None = None,
                 mixed_limits: tuple[int, int, int] | None = None,
                 chunked_prefill_size: int | None = None,
                 grammar_backend: GrammarBackend | None = None,
                 chunk_pacer: ChunkPacer | None = None):
        self.worker = worker
        self.runner = runner = worker.model_runner
        self.max_running_requests = max_running_requests
        self.context_len = context_len
        self.finish = FinishCheck(tokenizer, eos_token_ids, context_len, worker.tokens_per_req)
        self.limits = RequestLimits(context_len, worker.tokens_per_req,
                                    runner.token_to_kv_pool_allocator.size, overlap,
                                    context_len * tokenizer.max_chars_per_token,
                                    worker.logprob_refusal)
        self.kv = KvReservation(runner, self.limits, tree_cache)
        self.on_update = on_update
        self.overlap = overlap
        self.prefill_delayer = prefill_delayer
        # (requests, tokens) one prefill graph takes; None: no prefill graphs
        self.prefill_graph_limits = prefill_graph_limits
        # set (`--enable-mixed-chunk`): (step requests, arrivals, arrival tokens) one mixed
        # forward takes; arrivals that fit ride in the running batch's step
        self.mixed_limits = mixed_limits
        self.chunked_prefill_size = chunked_prefill_size  # as Admission's
        self.chunked: Req | None = None  # admitted, mid chunked prefill, not running yet
        # set: a chunk in a mixed step is sized so the running batch keeps its decode share
        self.chunk_pacer = chunk_pacer
        # set: requests may ask for structured output
        self.grammar_backend = grammar_backend
        self.grammar_queue = GrammarQueue(grammar_backend)
        # decode steps the running batch takes before the chunked request's next chunk: one
        # after a chunk step of its own, the pacer's count after a mixed one
        self._decode_owed = 0
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        # launched, tokens not read (overlap): a prefill, a decode step, or both
        self.in_flight: list[PendingStep] = []
        self._in_flight_kind: str | None = None  # the stats key of `in_flight`'s step
        self.stats = {"prefill_steps": 0, "decode_steps": 0, "generated_tokens": 0,
                      "prefill_requests": 0, "prefill_tokens": 0, "decode_batch_requests": 0,
                      # host seconds of the scheduler passes that completed each kind of
                      # step: with overlap a pass launches step n and waits for step n-1's
                      # tokens, so its time is mostly n-1's device time, charged to n-1
                      "prefill_seconds": 0.0, "decode_seconds": 0.0,
                      "prefill_delayed_passes": 0,
                      "mixed_steps": 0, "mixed_requests": 0, "mixed_seconds": 0.0,
                      "chunked_prefill_steps": 0,
                      # prefill steps (chunks included) launched while running requests could
                      # have stepped: each holds the running batch back one step
                      "prefill_interruptions": 0}
        self.admission = Admission(worker, self.kv, eos_token_ids,
                                   max_running_requests=max_running_requests,
                                   chunked_prefill_size=chunked_prefill_size,
                                   notify=self._notify)
        self.outputs = OutputProcessor(self.finish, self.kv, self.stats)
        # The allocator's largest peak above a step's start (CUDA; the host allocates as it
        # launches, so no sync is needed), on request: torch's memory_allocated and
        # max_memory_allocated each build and sort the allocator's whole stats dict, about
        # 0.1 ms of host time a call, and small models' steps are host-bound.
        self.record_step_peak = (runner.device.type == "cuda"
                                 and os.environ.get(STEP_PEAK_ENV, "0") == "1")
        if self.record_step_peak:
            self.stats["max_step_peak_bytes"] = 0

    @property
    def eos_token_ids(self) -> set[int]:
        return self.finish.eos_token_ids

    @property
    def tree_cache(self) -> RadixCache | None:
        return self.kv.tree_cache

    def validate(self, req: Req) -> None:
        """ValueError when the request can never run."""
        self.limits.validate(req)
        if req.sampling_params.grammar_key is not None and self.grammar_backend is None:
            raise ValueError("this engine serves no structured output (no grammar backend)")

    def add_request(self, req: Req) -> None:
        self.validate(req)
        if req.sampling_params.grammar_key is None:
            self.waiting.append(req)
        else:
            self.grammar_queue.add(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.in_flight or self.chunked
                    or self.grammar_queue)

    def _take_compiled(self) -> None:
        """Requests whose grammar compiled join `waiting`; one whose grammar failed to
        compile fails alone."""
        idle = not (self.waiting or self.running or self.in_flight or self.chunked)
        ready, failed = self.grammar_queue.take_compiled(idle)
        self.waiting.extend(ready)
        for req in failed:
            self._notify(req)

    def _admit(self, limits: tuple[int, int] | None, strict: bool = False) -> list[Req]:
        """`Admission.admit` from `waiting` (setting `chunked` when it admits one)."""
        new, chunked = self.admission.admit(self.waiting, len(self.running), limits, strict)
        if chunked is not None and self.chunked is None and self.chunk_pacer is not None:
            self.chunk_pacer.new_prompt()
        self.chunked = self.chunked or chunked
        return new

    def abort(self, req: Req) -> None:
        """Drop `req` (waiting, mid chunked prefill or running) and release its KV; call
        between steps."""
        if req is self.chunked:
            self.chunked = None
        self.waiting = deque(r for r in self.waiting if r is not req)
        self.grammar_queue.drop(req)
        self.running = [r for r in self.running if r is not req]
        if req.req_pool_idx is not None:
            self.kv.release(req)
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
        charged = self._in_flight_kind if lag and self._in_flight_kind else kind
        self._in_flight_kind = kind if lag and launched else None
        for step in done:
            self._complete(step)
        self.stats[charged] += time.perf_counter() - start
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
        req, pacer = self.chunked, self.chunk_pacer
        size = min(self.chunked_prefill_size, budget)
        if pacer is not None:
            size = pacer.chunk_tokens(size)
            pacer.start()
        rest = len(req.origin_input_ids) - req.kv_len
        self.stats["mixed_steps"] += 1
        self.stats["chunked_prefill_steps"] += 1
        self.stats["decode_batch_requests"] += len(batch)
        self.stats["prefill_tokens"] += min(size, rest)
        new: list[Req] = []
        if rest > size:
            launched = self.worker.mixed(batch, [req], chunk=size)
        else:
            self.chunked, new = None, [req]
            self.stats["mixed_requests"] += 1
            self.stats["prefill_requests"] += 1
            launched = self.worker.mixed(batch, [req])
        if pacer is not None:
            pacer.timed(launched[0], min(size, rest))
            self._decode_owed = pacer.decode_steps_owed() if not new else 0
        return new, launched

    def _launch_apart(self, prefill: bool) -> tuple[list[Req], list[PendingStep], bool]:
        """A prefill step of admitted arrivals (or a chunk of the chunked request), or a
        decode step of the running batch; and whether a prefill ran."""
        new = self._admit(self.prefill_graph_limits) if prefill and self.chunked is None else []
        batch = [r for r in self.running if self._can_launch(r)]
        if (new or (prefill and self.chunked is not None)) and batch:
            self.stats["prefill_interruptions"] += 1
        if prefill and self.chunked is not None:
            new, launched = self._launch_chunk()
            return new, launched, True
        self._decode_owed = max(self._decode_owed - 1, 0)
        if new:
            self.stats["prefill_steps"] += 1
            self.stats["prefill_requests"] += len(new)
            self.stats["prefill_tokens"] += sum(len(r.origin_input_ids) - r.kv_len for r in new)
            return new, [self.worker.prefill(new)], True
        if self.running and not batch and not self.in_flight:
            raise RuntimeError(f"no step fits any of {len(self.running)} running requests")
        if not batch:
            return [], [], False
        self.stats["decode_steps"] += 1
        self.stats["decode_batch_requests"] += len(batch)
        pacer = self.chunk_pacer
        if pacer is None or not pacer.time_decode():
            return [], [self.worker.decode(batch)], False
        pacer.start()
        step = self.worker.decode(batch)
        pacer.timed(step, 0)
        return [], [step], False

    def _launch_chunk(self) -> tuple[list[Req], list[PendingStep]]:
        """The chunked request's next chunk; its last one is a prefill that samples its first
        token, and the request joins the running batch."""
        req, n = self.chunked, self.admission.next_chunk(self.chunked)
        self.stats["prefill_steps"] += 1
        self.stats["chunked_prefill_steps"] += 1
        self.stats["prefill_tokens"] += n or len(req.origin_input_ids) - req.kv_len
        if n is not None:
            self.worker.prefill_chunk(req, n)
            self._decode_owed = 1
            return [], []
        self.chunked = None
        self.stats["prefill_requests"] += 1
        return [req], [self.worker.prefill([req])]

    def _prefill_now(self) -> bool:
        if self.chunked is not None:
            return not (self._decode_owed and self.running)
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
        live = self.outputs.apply(step)
        if self.chunk_pacer is not None:
            self.chunk_pacer.completed(step)
        self.running = [r for r in self.running if not r.finished]
        # Notify once the running list is settled, so a listener never sees a finished
        # request still counted as running.
        for req in live:
            self._notify(req)

    def flush_cache(self) -> int | None:
        """Free every cached KV slot, only when no request waits or runs (as SGLang; a step
        still in flight then holds finished requests only, and work that reuses the slots
        launches after it): the number freed, else None."""
        if self.waiting or self.running or self.chunked:
            return None
        return self.kv.flush_cache()

    def _notify(self, req: Req) -> None:
        if self.on_update is not None:
            self.on_update(req)

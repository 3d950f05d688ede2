"""Requests naming a grammar, while a pool thread compiles it (structured output).

A request naming a grammar waits here, not in the scheduler's `waiting`, so no step waits for
a compile; once compiled it joins `waiting` with a matcher of its own. The workers fill each
step's token masks on the host from the matchers, which must have seen every emitted token: a
step with a grammar request completes in the `step()` that launched it (no overlap lag for it;
other steps keep theirs), and grammar requests never ride in a mixed forward. Each emitted
token advances the request's matcher; one that accepted a stop token finishes the request (as
SGLang).
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait

from sglang_aux.srt.constrained.grammar_backend import GrammarBackend
from sglang_aux.srt.managers.schedule_batch import Req

GRAMMAR_WAIT_S = 0.05  # an idle step's wait for a grammar compile (no busy loop meanwhile)


class GrammarQueue:
    def __init__(self, backend: GrammarBackend | None):
        self.backend = backend
        self._compiling: list[tuple[Req, Future]] = []

    def __bool__(self) -> bool:
        return bool(self._compiling)

    def add(self, req: Req) -> None:
        self._compiling.append((req, self.backend.compile(req.sampling_params.grammar_key)))

    def drop(self, req: Req) -> None:
        self._compiling = [(r, f) for r, f in self._compiling if r is not req]

    def take_compiled(self, idle: bool) -> tuple[list[Req], list[Req]]:
        """(requests whose grammar compiled, each with a matcher of its own; requests whose
        grammar failed to compile, finished with the reason), in arrival order. `idle`:
        nothing else to do, so wait a moment for a compile first."""
        if not self._compiling:
            return [], []
        if idle:
            wait([f for _, f in self._compiling], GRAMMAR_WAIT_S, FIRST_COMPLETED)
        ready, failed, compiling = [], [], []
        for req, future in self._compiling:
            if not future.done():
                compiling.append((req, future))
                continue
            try:
                req.grammar = self.backend.new_grammar(future.result(), req.output_ids)
            except Exception as e:
                req.finished_reason = {"type": "abort", "message": f"grammar: {e}"}
                failed.append(req)
                continue
            ready.append(req)
        self._compiling = compiling
        return ready, failed

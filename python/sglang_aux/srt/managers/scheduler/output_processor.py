"""A launched step's tokens, applied to its requests: output ids and logprobs appended, stop
checks, grammars advanced, finished requests' KV released."""

from __future__ import annotations

from sglang_aux.srt.managers.pending_step import PendingStep
from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.finish_check import FinishCheck
from sglang_aux.srt.managers.scheduler.kv_reservation import KvReservation


class OutputProcessor:
    def __init__(self, finish: FinishCheck, kv: KvReservation, stats: dict):
        self.finish = finish
        self.kv = kv
        self.stats = stats  # the scheduler's: generated_tokens is counted here

    def apply(self, step: PendingStep) -> list[Req]:
        """Read `step`'s tokens and append them; the requests updated (those that had not
        finished or been aborted since the launch)."""
        live = []
        for req, tokens, logprobs in zip(step.reqs, step.tokens(), step.output_logprobs(),
                                         strict=True):
            req.pending_tokens -= step.kv_growth
            if not req.finished:
                live.append(req)
                self._append(req, tokens, logprobs)
        return live

    def _append(self, req: Req, tokens: list[int], logprobs: list | None = None) -> None:
        if req.sampling_params.max_new_tokens == 0:
            # a prefill-only request (SGLang's cache_prefix): its prompt's K/V is cached,
            # the token its prefill sampled is dropped
            req.finished_reason = {"type": "length", "length": 0}
            self.kv.release(req)
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
                self.kv.release(req)
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

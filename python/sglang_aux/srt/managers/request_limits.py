"""What a request may ask of one engine: the checks that need no scheduler state, so the HTTP
front end (another process) can reject bad input with the scheduler's own reasons."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_aux.srt.managers.schedule_batch import Req


@dataclass(frozen=True)
class RequestLimits:
    context_len: int
    tokens_per_req: int  # most tokens one decode step adds to a request
    kv_pool_size: int  # KV slots in the whole pool
    overlap: bool  # a request may run one step past its end before the host reads it
    # more characters than this cannot tokenize into the context: context_len times the
    # tokenizer's `max_chars_per_token`
    max_prompt_chars: int
    # why the worker returns no logprobs (SGLang's DSpark refuses return_logprob); None: it does
    logprob_refusal: str | None = None

    def reservation(self, req: Req) -> int:
        """The KV slots `req` is given at admission. A step writes `tokens_per_req`
        positions from kv_len = seq_len - 1, and runs only while fewer than max_new_tokens are
        out and seq_len + tokens_per_req - 1 is below the context (see FinishCheck.reason):
        every position stays below both bounds."""
        need = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        steps = 2 if self.overlap else 1
        return min(need + steps * self.tokens_per_req, self.context_len)

    def validate_text(self, text: str) -> None:
        """ValueError, before tokenizing, when `text` has more characters than the context's
        tokens could cover: a huge prompt is refused at once instead of tokenized whole."""
        if len(text) > self.max_prompt_chars:
            raise ValueError(f"the prompt has {len(text)} characters; the context holds "
                             f"{self.context_len} tokens, which cover at most "
                             f"{self.max_prompt_chars} characters with this tokenizer")

    def validate(self, req: Req) -> None:
        """ValueError when the request can never run."""
        n = len(req.origin_input_ids)
        if n == 0:
            raise ValueError("the prompt is empty")
        if req.logprob is not None and self.logprob_refusal is not None:
            raise ValueError(f"return_logprob is not supported: {self.logprob_refusal}")
        if n + self.tokens_per_req > self.context_len:
            raise ValueError(f"the prompt has {n} tokens; the context holds {self.context_len}"
                             f" (less {self.tokens_per_req} for a decode step)")
        if self.reservation(req) > self.kv_pool_size:
            raise ValueError(f"the request needs {self.reservation(req)} KV slots; the pool "
                             f"holds {self.kv_pool_size}")


"""The server's counters for /metrics (front end) and its output throughput (scheduler)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

THROUGHPUT_WINDOW = 40  # steps per throughput figure (SGLang's decode log interval)


@dataclass
class ServerMetrics:
    """Request counters, written from the front end's reader thread and its event loop."""

    requests_total: int = 0
    requests_finished: int = 0
    requests_failed: int = 0  # rejected as bad input, or failed in the scheduler
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec_verify_ct: int = 0
    spec_accepted_tokens: int = 0
    spec_verify_tokens: int = 0  # target tokens verify steps spent
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        with self._lock:
            for name, n in deltas.items():
                setattr(self, name, getattr(self, name) + n)

    def mean_accept_length(self) -> float:
        """Tokens per verify step over every finished speculative request (0: none)."""
        return self.spec_accepted_tokens / self.spec_verify_ct if self.spec_verify_ct else 0.0

    def verify_tokens_per_accepted(self) -> float:
        """Target tokens verified per emitted speculative token (0: none)."""
        return (self.spec_verify_tokens / self.spec_accepted_tokens
                if self.spec_accepted_tokens else 0.0)


@dataclass
class StepThroughput:
    """Output tokens/s over the latest THROUGHPUT_WINDOW scheduler steps."""

    last_gen_throughput: float = 0.0
    _tokens: int = 0
    _seconds: float = 0.0
    _steps: int = 0

    def record_step(self, tokens: int, seconds: float) -> None:
        """A scheduler step that emitted `tokens` output tokens in `seconds`."""
        if self._steps >= THROUGHPUT_WINDOW:
            self._tokens, self._seconds, self._steps = 0, 0.0, 0
        self._tokens += tokens
        self._seconds += seconds
        self._steps += 1
        self.last_gen_throughput = self._tokens / max(self._seconds, 1e-9)

"""The front end's request counters for /metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


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

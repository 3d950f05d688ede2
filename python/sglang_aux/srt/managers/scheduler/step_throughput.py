"""The scheduler process's output throughput, as /get_server_info reports it."""

from __future__ import annotations

from dataclasses import dataclass

THROUGHPUT_WINDOW = 40  # steps per throughput figure (SGLang's decode log interval)


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

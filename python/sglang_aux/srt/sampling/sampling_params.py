"""Per-request sampling parameters (SGLang's names and defaults)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sglang_aux.srt.sampling.param_ranges import check_int64_fields

MAX_NEW_TOKENS_LIMIT = 1 << 20
GREEDY_EPS = 1e-6


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> SamplingParams:
        """Validated params from a request dict; ValueError names the offending field."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        if d.get("stop") is None:
            d.pop("stop", None)
        params = cls(**d)
        params.verify()
        return params

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def verify(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        def is_num(x: object) -> bool:
            return isinstance(x, int | float) and not isinstance(x, bool)

        check(isinstance(self.max_new_tokens, int) and not isinstance(self.max_new_tokens, bool)
              and 0 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT,
              f"max_new_tokens must be an integer in [0, {MAX_NEW_TOKENS_LIMIT}], "
              f"got {self.max_new_tokens!r}")
        check(is_num(self.temperature) and 0.0 <= self.temperature <= 100.0,
              f"temperature must be a number in [0, 100], got {self.temperature!r}")
        check(is_num(self.top_p) and 0.0 < self.top_p <= 1.0,
              f"top_p must be a number in (0, 1], got {self.top_p!r}")
        check(isinstance(self.top_k, int) and not isinstance(self.top_k, bool)
              and (self.top_k == -1 or self.top_k >= 1),
              f"top_k must be -1 or a positive integer, got {self.top_k!r}")
        check(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
              f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        check(isinstance(self.stop_token_ids, list)
              and all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
              f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        check(isinstance(self.ignore_eos, bool),
              f"ignore_eos must be a boolean, got {self.ignore_eos!r}")
        check(self.seed is None or isinstance(self.seed, int),
              f"seed must be an integer, got {self.seed!r}")
        check_int64_fields(self)

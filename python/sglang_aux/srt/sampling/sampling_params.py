"""Per-request sampling parameters (SGLang 0.5.23's names and defaults).

Every field of SGLang's `SamplingParams` is known here: the implemented ones are fields of
the dataclass; the others (`UNSUPPORTED`) are accepted at their default (or null) and refused
by name otherwise, so a client that sends SGLang's whole parameter set at its defaults runs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from sglang_aux.srt.constrained.grammar_spec import GRAMMAR_FIELDS, GrammarKey, to_grammar
from sglang_aux.srt.sampling.param_ranges import check_int64_fields

MAX_NEW_TOKENS_LIMIT = 1 << 20
GREEDY_EPS = 1e-6
MAX_PENALTY = 2.0  # SGLang's bound on |frequency_penalty|, |presence_penalty|, repetition
MAX_N = 128  # parallel samples of one prompt
MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs; ours for every route

# SGLang's fields this server does not implement, with the value that means "off": they have
# no counterpart here (beam search, watermarks, custom logit processors), or are SGLang's
# internal fields (set by its own normalisation, never meant to come from a client).
UNSUPPORTED: dict[str, Any] = {
    "beam_width": None, "stream_interval": None, "logit_bias": None,
    "custom_params": None, "watermark": None,
    "stop_strs": None, "stop_regex_strs": None, "stop_str_max_len": 0,
    "stop_regex_max_len": 0, "is_normalized": False, "ebnf_full_assistant": False,
}


def _is_off(value: object, default: object) -> bool:
    """Null, the default, an empty container where the default is null, or (a batch's
    per-request values) a list of those."""
    if value is None or value == default:
        return True
    if isinstance(value, dict | list) and not value:
        return default is None
    return isinstance(value, list) and all(v is None or v == default for v in value)


def refuse_unsupported(d: dict, unsupported: dict[str, Any], what: str) -> None:
    """Drop the fields of `unsupported` that `d` gives switched off (`_is_off`); a ValueError
    naming the first one given otherwise."""
    for name, default in unsupported.items():
        if name in d and not _is_off(d.pop(name), default):
            raise ValueError(f"{what} {name!r} is not supported by this server (only its "
                             f"default, {default!r}, is accepted)")


def _str_list(value: object) -> object:
    return [value] if isinstance(value, str) else [] if value is None else value


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None  # SGLang spells it `sampling_seed`; both are accepted
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    n: int = 1
    stop_regex: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # structured output (`srt/constrained`): at most one of them
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    structural_tag: str | None = None

    @classmethod
    def from_dict(cls, d: dict | None) -> SamplingParams:
        """Validated params from a request dict; ValueError names the offending field. A
        null value means the field's default, as in SGLang."""
        d = {k: v for k, v in (d or {}).items() if v is not None}
        refuse_unsupported(d, UNSUPPORTED, "sampling parameter")
        if "sampling_seed" in d:
            if "seed" in d and d["seed"] != d["sampling_seed"]:
                raise ValueError("give at most one of seed and sampling_seed")
            d["seed"] = d.pop("sampling_seed")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        for name in ("stop", "stop_regex"):
            if name in d:
                d[name] = _str_list(d[name])
        if isinstance(d.get("stop_token_ids"), set | tuple):
            d["stop_token_ids"] = sorted(d["stop_token_ids"])
        params = cls(**d)
        params.verify()
        return params

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    @property
    def grammar_key(self) -> GrammarKey | None:
        """`(field, text)` of its grammar, None without one."""
        return next(((f, getattr(self, f)) for f in GRAMMAR_FIELDS
                     if getattr(self, f) is not None), None)

    @property
    def has_penalties(self) -> bool:
        return (self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.repetition_penalty != 1.0)

    @property
    def processes_logits(self) -> bool:
        """Whether its logits are processed before choosing (`PenaltyRows`, min-p)."""
        return self.has_penalties or self.min_new_tokens > 0 or self.min_p > 0.0

    def verify(self) -> None:
        def check(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(msg)

        def is_num(x: object) -> bool:
            return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)

        def is_int(x: object) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        check(is_int(self.max_new_tokens) and 0 <= self.max_new_tokens <= MAX_NEW_TOKENS_LIMIT,
              f"max_new_tokens must be an integer in [0, {MAX_NEW_TOKENS_LIMIT}], "
              f"got {self.max_new_tokens!r}")
        check(is_num(self.temperature) and 0.0 <= self.temperature <= 100.0,
              f"temperature must be a number in [0, 100], got {self.temperature!r}")
        check(is_num(self.top_p) and 0.0 < self.top_p <= 1.0,
              f"top_p must be a number in (0, 1], got {self.top_p!r}")
        check(is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1),
              f"top_k must be -1 or a positive integer, got {self.top_k!r}")
        check(is_num(self.min_p) and 0.0 <= self.min_p <= 1.0,
              f"min_p must be a number in [0, 1], got {self.min_p!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            check(is_num(value) and -MAX_PENALTY <= value <= MAX_PENALTY,
                  f"{name} must be a number in [-{MAX_PENALTY}, {MAX_PENALTY}], got {value!r}")
        check(is_num(self.repetition_penalty) and 0.0 < self.repetition_penalty <= MAX_PENALTY,
              f"repetition_penalty must be a number in (0, {MAX_PENALTY}], "
              f"got {self.repetition_penalty!r}")
        check(is_int(self.min_new_tokens) and 0 <= self.min_new_tokens,
              f"min_new_tokens must be a non-negative integer, got {self.min_new_tokens!r}")
        if is_int(self.max_new_tokens):
            check(self.min_new_tokens <= self.max_new_tokens,
                  f"min_new_tokens must be at most max_new_tokens ({self.max_new_tokens}), "
                  f"got {self.min_new_tokens!r}")
        # the HTTP routes serve n > 1 as n requests (`serving_base.submit_samples`)
        check(self.n == 1, f"n must be 1 for one request (the HTTP routes take n in [1, "
                           f"{MAX_N}] and run one request per sample), got {self.n!r}")
        check(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop),
              f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        check(isinstance(self.stop_regex, list)
              and all(isinstance(s, str) and s for s in self.stop_regex),
              f"stop_regex must be a non-empty string or a list of them, got {self.stop_regex!r}")
        for pattern in self.stop_regex:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"stop_regex {pattern!r} is not a valid regex: {e}") from None
        check(isinstance(self.stop_token_ids, list)
              and all(is_int(t) and t >= 0 for t in self.stop_token_ids),
              f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        for name in ("ignore_eos", "no_stop_trim", "skip_special_tokens",
                     "spaces_between_special_tokens"):
            check(isinstance(getattr(self, name), bool),
                  f"{name} must be a boolean, got {getattr(self, name)!r}")
        check(self.seed is None or is_int(self.seed),
              f"seed must be an integer, got {self.seed!r}")
        check_int64_fields(self)
        self._verify_grammar()

    def _verify_grammar(self) -> None:
        given = [f for f in GRAMMAR_FIELDS if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(f"give at most one of {', '.join(GRAMMAR_FIELDS)}; got "
                             f"{', '.join(given)}")
        if given and not isinstance(getattr(self, given[0]), str):
            raise ValueError(f"{given[0]} must be a string, got {getattr(self, given[0])!r}")
        if given:
            to_grammar(self.grammar_key)

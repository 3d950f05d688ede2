"""What a speculative step costs on the device, in milliseconds: the draft forward per batch
size and the verify forward per token count, over requests that hold almost no context; and
what each request's context of `context` tokens adds to either (its attention); and, for a
static server whose draft computes only the proposals a narrower step verifies, the draft
forward per batch size at one proposal a request (`draft_one_ms`: between one and all
`draft_proposals`, its cost is interpolated in the proposals). Measured by the server at
start-up (`speculative/step_cost_probe.py`), or read from `--speculative-step-costs FILE`: a
JSON object `{"draft_ms": {bs: ms}, "verify_ms": {tokens: ms}, "context": tokens,
"draft_context_ms": ms, "verify_context_ms": ms, "draft_one_ms": {bs: ms},
"draft_proposals": n, "source": ...}` (the keys after verify_ms optional: 0 or none), bare or
as the `step_costs` field of `benchmark/spec_decode/bench_dflash_step.py --out`'s report.

A step pads to the smallest measured size that holds it, as it pads to a captured graph; past
the largest, the cost grows in proportion. The context's share grows with the requests, not
with the tokens each verifies: a request's keys are read once for all its tokens.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path


def _padded_cost(costs: dict[int, float], n: int) -> float:
    sizes = sorted(costs)
    if n > sizes[-1]:
        return costs[sizes[-1]] * n / sizes[-1]
    return costs[sizes[bisect.bisect_left(sizes, n)]]


@dataclass(frozen=True)
class StepCosts:
    draft_ms: dict[int, float]  # draft forward (DRAFT_BLOCK) per batch size
    verify_ms: dict[int, float]  # verify forward (TARGET_VERIFY) per token count
    context: int = 0  # tokens of context per request the *_context_ms were measured at
    draft_context_ms: float = 0.0  # what one request's context adds to the draft forward
    verify_context_ms: float = 0.0  # ... and to the verify forward
    # the draft forward per batch size computing one proposal's logits a request, where
    # draft_ms computes `draft_proposals` (empty: a draft whose cost is its block's)
    draft_one_ms: dict[int, float] = field(default_factory=dict)
    draft_proposals: int = 0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name, costs in (("draft_ms", self.draft_ms), ("verify_ms", self.verify_ms)):
            if not costs or not all(isinstance(k, int) and k >= 1 for k in costs) or not all(
                    isinstance(v, int | float) and 0 < v < math.inf for v in costs.values()):
                raise ValueError(f"step costs {self.source}: '{name}' must map sizes >= 1 to "
                                 f"finite positive milliseconds, got {costs!r:.80}")
        for name in ("context", "draft_context_ms", "verify_context_ms"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise ValueError(f"step costs {self.source}: '{name}' must be a finite "
                                 f"number >= 0, got {value!r:.80}")
        if self.draft_one_ms and (sorted(self.draft_one_ms) != sorted(self.draft_ms)
                                  or self.draft_proposals < 2 or not all(
                                      isinstance(v, int | float) and 0 < v < math.inf
                                      for v in self.draft_one_ms.values())):
            raise ValueError(f"step costs {self.source}: 'draft_one_ms' must give finite "
                             f"positive milliseconds at draft_ms's batch sizes, with "
                             f"'draft_proposals' >= 2, got {self.draft_one_ms!r:.80} and "
                             f"{self.draft_proposals!r}")

    def draft(self, bs: int, proposals: int | None = None) -> float:
        """The draft forward of `bs` requests computing `proposals` logits rows a request
        (None: all; interpolated between one and all where `draft_one_ms` is measured)."""
        full = _padded_cost(self.draft_ms, bs)
        if not self.draft_one_ms or proposals is None or proposals >= self.draft_proposals:
            return full
        one = _padded_cost(self.draft_one_ms, bs)
        return one + (full - one) * (max(proposals, 1) - 1) / (self.draft_proposals - 1)

    def verify(self, num_tokens: int) -> float:
        return _padded_cost(self.verify_ms, num_tokens)

    def context_cost(self, bs: int, drafted: bool) -> float:
        """What `bs` requests' contexts add to a step (`drafted`: its draft forward too)."""
        return bs * (self.verify_context_ms + (self.draft_context_ms if drafted else 0.0))

    def to_json(self) -> dict:
        return {"draft_ms": {str(k): v for k, v in sorted(self.draft_ms.items())},
                "verify_ms": {str(k): v for k, v in sorted(self.verify_ms.items())},
                "context": self.context, "draft_context_ms": self.draft_context_ms,
                "verify_context_ms": self.verify_context_ms,
                "draft_one_ms": {str(k): v for k, v in sorted(self.draft_one_ms.items())},
                "draft_proposals": self.draft_proposals, "source": self.source}

    @classmethod
    def load(cls, path: str) -> StepCosts:
        """The costs in `path`; a ValueError, one line naming the file, when it does not
        parse."""
        try:
            doc = json.loads(Path(path).read_text())
            doc = doc.get("step_costs", doc)
            draft, verify = ({int(k): v for k, v in doc[name].items()}
                             for name in ("draft_ms", "verify_ms"))
            context = {k: doc.get(k, 0) for k in ("context", "draft_context_ms",
                                                  "verify_context_ms", "draft_proposals")}
            context["draft_one_ms"] = {int(k): v for k, v in
                                       (doc.get("draft_one_ms") or {}).items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}".replace("\n", " ")
            raise ValueError(f"step costs {path}: not a JSON object with 'draft_ms' and "
                             f"'verify_ms' (bare or under 'step_costs') ({reason})") from None
        return cls(draft, verify, **context,
                   source=f"{path} ({doc.get('source') or 'no source given'})")

"""What a speculative step costs on the device, in milliseconds: the draft forward per batch
size and the verify forward per token count, over requests that hold almost no context; and
what each request's context of `context` tokens adds to either (its attention). Measured by
the server at start-up (`speculative/step_cost_probe.py`), or read from
`--speculative-step-costs FILE`: a JSON object `{"draft_ms": {bs: ms}, "verify_ms": {tokens:
ms}, "context": tokens, "draft_context_ms": ms, "verify_context_ms": ms, "source": ...}` (the
context keys optional: 0), bare or as the `step_costs` field of
`benchmark/spec_decode/bench_dflash_step.py --out`'s report.

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

    def draft(self, bs: int) -> float:
        return _padded_cost(self.draft_ms, bs)

    def verify(self, num_tokens: int) -> float:
        return _padded_cost(self.verify_ms, num_tokens)

    def context_cost(self, bs: int, drafted: bool) -> float:
        """What `bs` requests' contexts add to a step (`drafted`: its draft forward too)."""
        return bs * (self.verify_context_ms + (self.draft_context_ms if drafted else 0.0))

    def to_json(self) -> dict:
        return {"draft_ms": {str(k): v for k, v in sorted(self.draft_ms.items())},
                "verify_ms": {str(k): v for k, v in sorted(self.verify_ms.items())},
                "context": self.context, "draft_context_ms": self.draft_context_ms,
                "verify_context_ms": self.verify_context_ms, "source": self.source}

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
                                                  "verify_context_ms")}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}".replace("\n", " ")
            raise ValueError(f"step costs {path}: not a JSON object with 'draft_ms' and "
                             f"'verify_ms' (bare or under 'step_costs') ({reason})") from None
        return cls(draft, verify, **context,
                   source=f"{path} ({doc.get('source') or 'no source given'})")

"""What a speculative step costs on the device: the draft forward per batch size and the ragged
verify forward per token count, in milliseconds. Measured by the server at start-up
(`speculative/step_cost_probe.py`), or read from `--speculative-step-costs FILE`: a JSON
object `{"draft_ms": {bs: ms}, "verify_ms": {tokens: ms}, "source": ...}`, bare or as the
`step_costs` field of `benchmark/spec_decode/bench_dflash_step.py --out`'s report.

A step pads to the smallest measured size that holds it, as it pads to a captured graph; past
the largest, the cost grows in proportion.
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
    verify_ms: dict[int, float]  # verify forward (TARGET_VERIFY, ragged) per token count
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for name, costs in (("draft_ms", self.draft_ms), ("verify_ms", self.verify_ms)):
            if not costs or not all(isinstance(k, int) and k >= 1 for k in costs) or not all(
                    isinstance(v, int | float) and 0 < v < math.inf for v in costs.values()):
                raise ValueError(f"step costs {self.source}: '{name}' must map sizes >= 1 to "
                                 f"finite positive milliseconds, got {costs!r:.80}")

    def draft(self, bs: int) -> float:
        return _padded_cost(self.draft_ms, bs)

    def verify(self, num_tokens: int) -> float:
        return _padded_cost(self.verify_ms, num_tokens)

    def to_json(self) -> dict:
        return {"draft_ms": {str(k): v for k, v in sorted(self.draft_ms.items())},
                "verify_ms": {str(k): v for k, v in sorted(self.verify_ms.items())},
                "source": self.source}

    @classmethod
    def load(cls, path: str) -> StepCosts:
        """The costs in `path`; a ValueError, one line naming the file, when it does not
        parse."""
        try:
            doc = json.loads(Path(path).read_text())
            doc = doc.get("step_costs", doc)
            draft, verify = ({int(k): v for k, v in doc[name].items()}
                             for name in ("draft_ms", "verify_ms"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            reason = f"{type(e).__name__}: {e}".replace("\n", " ")
            raise ValueError(f"step costs {path}: not a JSON object with 'draft_ms' and "
                             f"'verify_ms' (bare or under 'step_costs') ({reason})") from None
        return cls(draft, verify, source=f"{path} ({doc.get('source') or 'no source given'})")

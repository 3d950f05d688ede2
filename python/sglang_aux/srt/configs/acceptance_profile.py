"""A draft's acceptance profile (`--speculative-acceptance-profile`, and what
`benchmark/spec_decode/bench_dflash_step.py` forces): a JSON object whose `accept_histogram`
gives P(accepted proposals = a) for a = 0..W-1 at full verify width W, with where it came from
(`benchmark/spec_decode/profiles/`). A draft trained here carries its own, measured on held-out
prompts (`train_dflash --eval` writes DRAFT_PROFILE in its folder); the flag's value `draft`
names that one, and a server given no value uses it when the draft has one (`none`: not)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

DRAFT_PROFILE = "acceptance_profile.json"  # in a draft's folder
FROM_DRAFT = "draft"  # --speculative-acceptance-profile's value for the draft's own
NO_PROFILE = "none"  # ... for no profile, though the draft has one


def default_profile_path(value: str | None, draft_dir: str) -> str | None:
    """The profile a server uses for `--speculative-acceptance-profile VALUE`: given no value,
    the draft folder's own when it has one (its acceptance measured by its trainer), else
    none; NO_PROFILE: none; otherwise `resolve_profile_path`."""
    if value == NO_PROFILE:
        return None
    if value is None:
        path = Path(draft_dir) / DRAFT_PROFILE
        return str(path) if draft_dir and path.is_file() else None
    return resolve_profile_path(value, draft_dir)


def resolve_profile_path(value: str, draft_dir: str) -> str:
    """The file `--speculative-acceptance-profile VALUE` names: the draft folder's own profile
    for FROM_DRAFT (a ValueError, one line, when the draft has none), else VALUE."""
    if value != FROM_DRAFT:
        return value
    path = Path(draft_dir) / DRAFT_PROFILE
    if not path.is_file():
        raise ValueError(f"--speculative-acceptance-profile {FROM_DRAFT}: the draft {draft_dir} "
                         f"has no {DRAFT_PROFILE} (train_dflash --eval writes it)")
    return str(path)


@dataclass(frozen=True)
class AcceptanceProfile:
    path: str
    probs: list[float]  # P(accepted proposals = a), a = 0..W-1, summing to 1

    @classmethod
    def load(cls, path: str, verify_width: int | None = None) -> AcceptanceProfile:
        """The profile at `path`, for a draft of `verify_width` (None: the file's own); a
        ValueError, one line naming the file, when it does not parse or does not fit."""
        try:
            doc = json.loads(Path(path).read_text())
            hist = doc["accept_histogram"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            reason = f"{type(e).__name__}: {e}".replace("\n", " ")
            raise ValueError(f"acceptance profile {path}: not a JSON object with "
                             f"'accept_histogram' ({reason})") from None
        width = verify_width or doc.get("verify_width") or (
            len(hist) if isinstance(hist, list) else 0)
        if doc.get("verify_width", width) != width:
            raise ValueError(f"acceptance profile {path}: made for verify width "
                             f"{doc['verify_width']}, the draft verifies {width}")
        if (not isinstance(hist, list) or not hist or len(hist) != width
                or not all(isinstance(x, int | float) and 0 <= x < math.inf for x in hist)
                or sum(hist) <= 0):
            raise ValueError(f"acceptance profile {path}: 'accept_histogram' must be {width} "
                             f"finite non-negative numbers, not all 0 (P(accepted = a) for "
                             f"a = 0..{width - 1}, the verify width), got {hist!r:.80}")
        total = sum(hist)
        return cls(str(path), [x / total for x in hist])

    def truncated(self, width: int) -> AcceptanceProfile:
        """The profile of a verify `width` <= W tokens wide: the same draft's proposals, the
        last `W - width` never verified (accepting width - 1 or more all count as width - 1)."""
        if not 1 <= width <= len(self.probs):
            raise ValueError(f"acceptance profile {self.path}: width {width} is not within "
                             f"1..{len(self.probs)}, the profile's verify width")
        return AcceptanceProfile(self.path, [*self.probs[: width - 1],
                                             sum(self.probs[width - 1:])])

    @property
    def verify_width(self) -> int:
        return len(self.probs)

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a full-width verify step emits (accepted + 1)."""
        return 1 + sum(a * p for a, p in enumerate(self.probs))

    @staticmethod
    def write(path: str | Path, counts: list[int], source: str, **extra) -> None:
        """A profile file from accept counts (`counts[a]`: verify steps that accepted a
        proposals, a = 0..W-1), with where they came from."""
        if not counts or sum(counts) <= 0:
            raise ValueError(f"an acceptance profile needs verify steps, got counts {counts}")
        Path(path).write_text(json.dumps({"accept_histogram": list(counts),
                                          "verify_width": len(counts), "source": source,
                                          **extra}, indent=1))

    def conditional_rates(self) -> list[float]:
        """P(accepted > k | accepted >= k) for proposal k = 0..W-2: the acceptance of each
        proposal given the ones before it were accepted."""
        survival = [sum(self.probs[k:]) for k in range(len(self.probs))]
        return [survival[k + 1] / survival[k] if survival[k] > 0 else 0.0
                for k in range(len(self.probs) - 1)]

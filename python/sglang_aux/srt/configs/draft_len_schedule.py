"""How many tokens each request verifies at each running batch size
(`--speculative-draft-len-schedule`, or derived by `speculative/draft_len_planner.py`).

A schedule is a list of `bs:width` steps, batch sizes ascending from 1: a step of bs running
requests verifies at most `width` tokens per request, the width of the last step at or below
bs. Width 1 is plain decoding (the anchor alone, no draft forward); the draft's verify width W
is the most. Static verify captures its verify graphs at every width a captured batch size
runs (`capture_sizes.step_widths`); compact verify's ragged graphs take any width.
TensorRT-LLM's `draft_len_schedule` maps the same thing the other way round (each
key is the largest batch size of its draft length, which counts proposals: our width - 1).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

FLAG = "--speculative-draft-len-schedule"


@dataclass(frozen=True)
class DraftLenSchedule:
    batch_sizes: tuple[int, ...]  # ascending, from 1: where each width starts
    widths: tuple[int, ...]  # verify tokens per request, >= 1

    def __post_init__(self) -> None:
        bs, widths = self.batch_sizes, self.widths
        if not bs or len(bs) != len(widths):
            raise ValueError(f"{FLAG}: one width per batch size, got {bs} and {widths}")
        if bs[0] != 1:
            raise ValueError(f"{FLAG} {self}: the first batch size must be 1 (each width "
                             f"holds from its batch size up), got {bs[0]}")
        if list(bs) != sorted(set(bs)):
            raise ValueError(f"{FLAG} {self}: batch sizes must be ascending without "
                             f"duplicates")
        if min(widths) < 1:
            raise ValueError(f"{FLAG} {self}: widths must be >= 1 (1: plain decoding)")

    @classmethod
    def parse(cls, text: str) -> DraftLenSchedule:
        """`"1:16,8:8,32:4,64:1"`; ValueError, one line naming the flag and `text`."""
        try:
            pairs = [tuple(int(x) for x in part.split(":")) for part in text.split(",")]
            if any(len(p) != 2 for p in pairs):
                raise ValueError
        except ValueError:
            raise ValueError(f"{FLAG} {text!r}: expected BS:WIDTH pairs separated by commas, "
                             "e.g. 1:16,8:8,32:4,64:1") from None
        return cls(tuple(b for b, _ in pairs), tuple(w for _, w in pairs))

    @classmethod
    def uniform(cls, width: int) -> DraftLenSchedule:
        return cls((1,), (width,))

    @classmethod
    def of_widths(cls, widths: dict[int, int]) -> DraftLenSchedule:
        """The schedule giving each batch size of `widths` (which must hold 1) its width,
        steps merged where the width does not change."""
        bs, ws = [], []
        for b in sorted(widths):
            if not ws or widths[b] != ws[-1]:
                bs.append(b)
                ws.append(widths[b])
        return cls(tuple(bs), tuple(ws))

    def width(self, bs: int) -> int:
        """The verify width of a step of `bs` requests."""
        return self.widths[bisect.bisect_right(self.batch_sizes, bs) - 1]

    @property
    def max_width(self) -> int:
        return max(self.widths)

    @property
    def min_width(self) -> int:
        return min(self.widths)

    def check(self, verify_width: int) -> None:
        """ValueError, one line, unless every width is at most `verify_width`."""
        if self.max_width > verify_width:
            raise ValueError(f"{FLAG} {self}: width {self.max_width} exceeds the draft's verify "
                             f"width {verify_width}")

    def __str__(self) -> str:
        return ",".join(f"{b}:{w}" for b, w in zip(self.batch_sizes, self.widths, strict=True))

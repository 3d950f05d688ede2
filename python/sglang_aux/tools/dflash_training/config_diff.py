"""Where two nested configs first differ: what a checkpoint of another run (`--resume`) or a
draft of another shape (`--init-from`) is refused with."""

from __future__ import annotations

from typing import Any


def first_difference(theirs: dict, ours: dict, prefix: str = ""
                     ) -> tuple[str, Any, Any] | None:
    """(dotted key, their value, our value) of the first key, sorted and nested ones dotted,
    whose values differ (a missing key reads None); None when none does."""
    for key in sorted(theirs.keys() | ours.keys()):
        a, b = theirs.get(key), ours.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            if (diff := first_difference(a, b, f"{prefix}{key}.")) is not None:
                return diff
        elif a != b:
            return f"{prefix}{key}", a, b
    return None

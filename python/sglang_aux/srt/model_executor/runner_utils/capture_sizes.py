"""Which batch sizes a decode graph runner captures."""

from __future__ import annotations

# SGLang's default lists, before the cut at the maximum batch size.
_SPECULATIVE_BS = [
    *range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, 1025, 16)
]
_DECODE_BS = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 1025, 16)]


def get_capture_bs(
    *, max_bs: int, speculative: bool, override: list[int] | None = None
) -> list[int]:
    """Sorted sizes to capture: `override` as given, else the default list cut at `max_bs`
    with `max_bs` itself always included."""
    if max_bs < 1:
        raise ValueError(f"max capture batch size must be >= 1, got {max_bs}")
    if override is not None:
        if any(bs < 1 for bs in override):
            raise ValueError(f"capture batch sizes must be >= 1, got {override}")
        return sorted(set(override))
    base = _SPECULATIVE_BS if speculative else _DECODE_BS
    return sorted({bs for bs in base if bs <= max_bs} | {max_bs})

"""The range every integer sampling field must fit: each travels to the device in an int64
column (`SamplingRows`), so a value outside int64 is refused with its request at admission,
naming the field, instead of surfacing inside a scheduler step. Seeds are range-checked, not
folded into 64 bits (vLLM bounds its `seed` the same way): a seed means one stream of draws."""

from __future__ import annotations

import dataclasses

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1


def check_int64(name: str, value: int) -> None:
    """ValueError naming `name` when the integer `value` does not fit int64."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"{name} must be an integer in [-2**63, 2**63 - 1], got {value}")


def check_int64_fields(params: object) -> None:
    """`check_int64` on every integer (or list of integers) field of the dataclass `params`,
    whatever fields it grows: a new integer field is covered without a new check."""
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                check_int64(f.name, v)

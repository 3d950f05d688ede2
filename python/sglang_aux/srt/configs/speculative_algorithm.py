"""Speculative decoding algorithms and the properties the runtime branches on."""

from __future__ import annotations

from enum import Enum


class SpeculativeAlgorithm(Enum):
    NONE = "NONE"
    EAGLE3 = "EAGLE3"
    DFLASH = "DFLASH"
    DSPARK = "DSPARK"

    @classmethod
    def from_string(cls, name: str | None) -> SpeculativeAlgorithm:
        if name is None:
            return cls.NONE
        try:
            return cls[name.upper()]
        except KeyError:
            choices = ", ".join(a.value for a in cls)
            raise ValueError(
                f"unknown speculative algorithm {name!r}; choose from {choices}"
            ) from None

    def is_none(self) -> bool:
        return self is SpeculativeAlgorithm.NONE

    def is_dflash_family(self) -> bool:
        """DFlash and DSpark: aux states are consumed within the step that produced them."""
        return self in (SpeculativeAlgorithm.DFLASH, SpeculativeAlgorithm.DSPARK)

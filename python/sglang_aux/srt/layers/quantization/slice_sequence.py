"""The contract both aux projections keep: K slices `[T, H]` arrive in order, the projection is
read once, `reset()` starts the next forward.

Checks run on Python ints and dtypes only, so a capture adds no host sync under CUDA graph
capture or `torch.compile(fullgraph=True)`.
"""

from __future__ import annotations

import torch


class SliceSequence:
    def __init__(self, num_tokens: int, hidden_size: int, num_slices: int,
                 dtype: torch.dtype) -> None:
        self.num_tokens = num_tokens
        self.hidden_size = hidden_size
        self.num_slices = num_slices
        self.dtype = dtype  # the aux slices' dtype
        self._count = 0
        self._consumed = False

    @property
    def num_accumulated(self) -> int:
        return self._count

    def reset(self) -> None:
        """Starts a new forward: the next slice is slice 0 again."""
        self._count = 0
        self._consumed = False

    def _next_columns(self, hidden: torch.Tensor) -> tuple[int, int]:
        """Checks `hidden` as the next slice; returns its columns `[lo, hi)` of the concat."""
        if self._count == self.num_slices:
            raise RuntimeError(f"accumulate: all {self.num_slices} slices already received; "
                               "call reset() before the next forward")
        if hidden.dtype != self.dtype:
            raise ValueError(f"accumulate: expected dtype {self.dtype}, got {hidden.dtype}")
        expected = (self.num_tokens, self.hidden_size)
        if tuple(hidden.shape) != expected:
            raise ValueError(f"accumulate: slice {self._count} must be {self.num_tokens} rows "
                             f"of width (hidden size) {self.hidden_size}: [T, H] = {expected}, "
                             f"got {tuple(hidden.shape)}")
        lo = self._count * self.hidden_size
        return lo, lo + self.hidden_size

    def _slice_done(self) -> bool:
        """Counts the slice just accumulated; True after the last one."""
        self._count += 1
        return self._count == self.num_slices

    def _consume(self) -> None:
        if self._count != self.num_slices:
            raise RuntimeError(f"result: only {self._count} of {self.num_slices} slices "
                               "accumulated")
        if self._consumed:
            raise RuntimeError("result: already read for this forward; call reset() first")
        self._consumed = True

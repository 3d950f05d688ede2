"""Capturing the target's auxiliary hidden states for a speculative draft.

Three paths; the model taps each state once (`capture`) into whichever sink it was given. The
list path (`AuxHiddenStateList`) keeps one tensor per captured layer and concatenates at the
end: the result is a fresh tensor, which inside a CUDA graph stays pinned in the graph pool for
the graph's lifetime. The packed path (`AuxHiddenStatePacker`) writes every capture straight
into its column block of one `[tokens, K * hidden]` tensor, which a decode graph runner can own
once for all captured sizes (`ForwardBatch.aux_hidden_states_buffer`). The projected path
(`ProjectedAuxCapture`) hands every capture to the draft fc's projection as it arrives
(`ForwardBatch.aux_projection`): a staged MXFP8 input, or a streamed projection that adds
`W_i a_i` into a `[tokens, H_draft]` fp32 accumulator, so no `[tokens, K * hidden]` exists.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from sglang_aux.srt.forward_state.forward_batch_info import AuxProjection

if TYPE_CHECKING:
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardBatch


class AuxHiddenStateList(list):
    """The list path: one tensor per capture, concatenated by `pack_aux_hidden_states`."""

    def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
        # Later layers may update the captured storage in place; clone unless the caller
        # hands over a tensor nobody else writes.
        self.append(hidden if owned else hidden.clone())


class AuxHiddenStatePacker:
    """Writes K captures into the column blocks of one packed `[..., K * F]` tensor.

    With `out` given, the packed tensor is the caller's storage (a row slice of a graph
    runner's shared buffer); its shape and dtype must equal `(*capture.shape[:-1], K * F)`
    and the capture dtype. Without `out`, the packer allocates on the first capture.
    """

    def __init__(self, num_captures: int, out: torch.Tensor | None = None):
        if num_captures <= 0:
            raise ValueError(f"num_captures must be positive, got {num_captures}")
        self.num_captures = num_captures
        self.out = out
        self._packed: torch.Tensor | None = None
        self._width = 0
        self._count = 0

    @classmethod
    def for_batch(cls, forward_batch: ForwardBatch, num_captures: int) -> AuxHiddenStatePacker:
        """A packer writing into the batch's rows of the shared buffer (None where the runner
        has none or the forward is larger than its rows: the packer then allocates)."""
        return cls(num_captures, out=forward_batch.aux_hidden_states_buffer)

    def slot(self, like: torch.Tensor) -> torch.Tensor:
        """The next capture's column block `[..., i*F:(i+1)*F]`, shaped and typed like `like`."""
        if self._count >= self.num_captures:
            raise RuntimeError(
                f"capture {self._count + 1} exceeds the {self.num_captures} expected"
            )
        if self._packed is None:
            self._width = like.shape[-1]
            shape = (*like.shape[:-1], self.num_captures * self._width)
            if self.out is None:
                self._packed = torch.empty(shape, dtype=like.dtype, device=like.device)
            elif tuple(self.out.shape) != shape or self.out.dtype != like.dtype:
                raise ValueError(
                    f"aux buffer {tuple(self.out.shape)} {self.out.dtype} does not fit packed "
                    f"aux states {shape} {like.dtype}"
                )
            else:
                self._packed = self.out
        elif like.shape[:-1] != self._packed.shape[:-1] or like.shape[-1] != self._width:
            raise ValueError(
                f"capture {tuple(like.shape)} does not match earlier captures "
                f"{(*self._packed.shape[:-1], self._width)}"
            )
        start = self._count * self._width
        self._count += 1
        return self._packed[..., start : start + self._width]

    def append(self, hidden: torch.Tensor) -> None:
        self.slot(hidden).copy_(hidden)

    def extend(self, hiddens: Iterable[torch.Tensor]) -> None:
        for hidden in hiddens:
            self.append(hidden)

    def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
        # Copying into the packed block already detaches the capture from later in-place
        # updates, so `owned` needs no extra clone here.
        del owned
        self.append(hidden)

    def __len__(self) -> int:
        return self._count

    def finalize(self) -> torch.Tensor:
        """The packed `[..., K * F]` tensor; the caller's storage when `out` was given."""
        if self._count != self.num_captures or self._packed is None:
            raise RuntimeError(f"got {self._count} aux captures, expected {self.num_captures}")
        return self._packed


class ProjectedAuxCapture:
    """Captures go straight into the draft fc's projection (staged or streamed).

    Each capture is consumed as it arrives (quantized into the staged input, or projected into
    the streamed accumulator), so the model can drop the tensor right after; there is no packed
    output (`finish_aux_hidden_states` gives None) and the caller reads the projection it owns.
    """

    def __init__(self, projection: AuxProjection):
        self.projection = projection

    def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
        del owned  # both projections read the capture before returning
        self.projection.accumulate(hidden)

    def __len__(self) -> int:
        return self.projection.num_accumulated


AuxHiddenStates = AuxHiddenStateList | AuxHiddenStatePacker | ProjectedAuxCapture


def pack_aux_hidden_states(x: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """`[..., K * F]` from a packed tensor (as is), one capture, or a list of captures."""
    if isinstance(x, torch.Tensor):
        return x
    if len(x) == 1:
        return x[0]
    return torch.cat(list(x), dim=-1)


def finish_aux_hidden_states(aux: AuxHiddenStates) -> torch.Tensor | None:
    """The packed result of a capture path (None for a projection: its owner reads it)."""
    if isinstance(aux, ProjectedAuxCapture):
        if len(aux) != aux.projection.num_slices:
            raise RuntimeError(
                f"got {len(aux)} aux captures, expected {aux.projection.num_slices}"
            )
        return None
    if isinstance(aux, AuxHiddenStatePacker):
        return aux.finalize()
    return pack_aux_hidden_states(aux)


@runtime_checkable
class SupportsSharedAuxHiddenStates(Protocol):
    """A model whose aux captures can land in a runner-owned buffer: the packed width
    `K * hidden` (0 when nothing is captured)."""

    def get_packed_aux_hidden_size(self) -> int: ...


@runtime_checkable
class SupportsPackedAuxHiddenStates(Protocol):
    """SGLang 0.5.23's spelling of the same opt-in."""

    def get_aux_hidden_states_width(self) -> int: ...


def shared_aux_hidden_states_width(model: object) -> int:
    """The packed aux width of a model that opts in under either spelling, else 0. A model
    implementing both must report one width."""
    widths = {}
    if isinstance(model, SupportsSharedAuxHiddenStates):
        widths["get_packed_aux_hidden_size"] = model.get_packed_aux_hidden_size()
    if isinstance(model, SupportsPackedAuxHiddenStates):
        widths["get_aux_hidden_states_width"] = model.get_aux_hidden_states_width()
    if len(set(widths.values())) > 1:
        raise ValueError(f"{type(model).__name__} reports two aux widths: {widths}")
    return next(iter(widths.values()), 0)

"""Who gets a shared aux buffer, at SGLang's path (its unit tests for the buffer import
`resolve_aux_hidden_states_width` from here)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from sglang_aux.srt.layers.aux_hidden_states import shared_aux_hidden_states_width

if TYPE_CHECKING:
    from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm


def resolve_aux_hidden_states_width(
    *, model: nn.Module, spec_algorithm: SpeculativeAlgorithm, is_draft_worker: bool
) -> int:
    """Width of the runner-owned aux storage, 0 for none.

    Only a DFlash-family target shares: its aux states are consumed (written into the draft
    KV cache) before the next target forward. EAGLE3 keeps its hidden states across steps,
    drafts capture nothing, and a model that does not opt in keeps the list path. Pipeline
    stages are excluded by the model itself (its packed width is 0 there). A model opts in
    with `get_packed_aux_hidden_size()` or SGLang 0.5.23's `get_aux_hidden_states_width()`.
    """
    if not spec_algorithm.is_dflash_family() or is_draft_worker:
        return 0
    return shared_aux_hidden_states_width(model)

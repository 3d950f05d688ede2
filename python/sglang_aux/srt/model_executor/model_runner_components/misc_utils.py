"""Small decisions the model runner delegates, kept apart so they are testable alone."""

from __future__ import annotations

from torch import nn

from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm
from sglang_aux.srt.layers.aux_hidden_states import shared_aux_hidden_states_width


def resolve_aux_hidden_states_width(
    *, model: nn.Module, spec_algorithm: SpeculativeAlgorithm, is_draft_worker: bool
) -> int:
    """Width of the runner-owned aux buffer, 0 for no shared buffer.

    Only a DFlash-family target shares: its aux states are consumed (written into the draft
    KV cache) before the next target forward. EAGLE3 keeps its hidden states across steps,
    drafts capture nothing, and a model that does not opt in keeps the list path. Pipeline
    stages are excluded by the model itself (its packed width is 0 there). A model opts in
    with `get_packed_aux_hidden_size()` or SGLang 0.5.23's `get_aux_hidden_states_width()`.
    """
    if not spec_algorithm.is_dflash_family() or is_draft_worker:
        return 0
    return shared_aux_hidden_states_width(model)

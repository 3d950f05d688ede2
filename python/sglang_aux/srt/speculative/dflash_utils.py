"""DFlash draft configuration: which target layers feed the draft, block size, mask token."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


def build_target_layer_ids(num_target_layers: int, num_aux_layers: int) -> list[int]:
    """Target layers whose aux states the draft reads, spread evenly over the middle of the
    stack: one layer gives the middle one; more span [1, L-3] (the first layer is still close
    to the embedding and the last few specialise to the LM head). Stacks too shallow for that
    span spread over all layers."""
    if num_aux_layers < 1 or num_aux_layers > num_target_layers:
        raise ValueError(
            f"cannot pick {num_aux_layers} aux layers from a {num_target_layers}-layer target"
        )
    if num_aux_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end - start + 1 < num_aux_layers:
        start, end = 0, num_target_layers - 1
    span = end - start
    return [round(start + i * span / (num_aux_layers - 1)) for i in range(num_aux_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    target_layer_ids: list[int]
    block_size: int
    mask_token_id: int
    target_hidden_size: int

    @classmethod
    def from_hf_config(cls, config: SimpleNamespace) -> DFlashConfig:
        """From a draft's config.json (`dflash_config` block); ValueError names what is off."""
        raw = getattr(config, "dflash_config", None)
        if not isinstance(raw, dict):
            raise ValueError("draft config.json has no 'dflash_config' object")
        missing = [k for k in ("target_layer_ids", "block_size", "mask_token_id") if k not in raw]
        if missing:
            raise ValueError(f"dflash_config lacks {', '.join(missing)}")
        ids = list(raw["target_layer_ids"])
        if not ids or len(set(ids)) != len(ids) or any(i < 0 for i in ids):
            raise ValueError(f"dflash_config.target_layer_ids must be distinct, got {ids}")
        if raw["block_size"] < 2:
            raise ValueError(f"dflash_config.block_size must be >= 2, got {raw['block_size']}")
        return cls(
            target_layer_ids=ids,
            block_size=int(raw["block_size"]),
            mask_token_id=int(raw["mask_token_id"]),
            target_hidden_size=int(raw.get("target_hidden_size", config.hidden_size)),
        )

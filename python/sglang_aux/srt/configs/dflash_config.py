"""DFlash draft configuration: which target layers feed the draft, its block's size, mask token,
and each draft layer's attention pattern.

`draft_block_size` (the checkpoint's `block_size`) is the tokens per request of one draft
forward, `[anchor, MASK x (draft_block_size - 1)]`. A DFlash request verifies that block
(verify width = draft block size = proposals + 1); a DSpark draft's block has one row per
proposal (`DSparkConfig.num_proposals`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import SimpleNamespace

from sglang_aux.srt.configs.decoder_config import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    AttentionType,
    LayerAttention,
    layer_types_of,
)

logger = logging.getLogger(__name__)

DEFAULT_DRAFT_BLOCK_SIZE = 16  # SGLang's and the z-lab drafts' default
DEFAULT_MASK_TOKEN = "<|MASK|>"


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


def dflash_field(config: SimpleNamespace, key: str):
    """A DFlash setting: the `dflash_config` object's value first, then the top level's (the
    layouts SGLang, z-lab and SpecForge write); None when neither has it."""
    raw = getattr(config, "dflash_config", None) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"dflash_config must be an object, got {raw!r}")
    value = raw.get(key)
    return getattr(config, key, None) if value is None else value


@dataclass(frozen=True)
class DFlashConfig:
    target_layer_ids: list[int]
    draft_block_size: int  # checkpoint key `block_size`
    mask_token_id: int
    target_hidden_size: int
    # a draft trained over a draft vocabulary: its file in the draft's folder (`train_dflash
    # --train-over-token-map`), read with the draft unless --speculative-token-map names another
    token_map: str | None = None

    @classmethod
    def from_hf_config(cls, config: SimpleNamespace, *, num_target_layers: int | None = None,
                       token_to_id: Callable[[str], int | None] | None = None) -> DFlashConfig:
        """From a draft's config.json; ValueError names what is off or missing.

        `num_target_layers` (the target's layer count) spreads the default target layers when
        the config lists none; `token_to_id` (the target tokenizer's) resolves a `mask_token`
        string when the config has no `mask_token_id`.
        """
        ids = dflash_field(config, "target_layer_ids")
        declared = dflash_field(config, "num_target_layers")
        if num_target_layers is not None and declared not in (None, num_target_layers):
            logger.warning("draft config says num_target_layers=%s, the target has %d layers",
                           declared, num_target_layers)
        if ids is None:
            if num_target_layers is None:
                raise ValueError("the draft config lists no target_layer_ids: the default "
                                 "spread needs the target's layer count")
            ids = build_target_layer_ids(num_target_layers, config.num_hidden_layers)
        ids = [int(i) for i in ids]
        if not ids or len(set(ids)) != len(ids) or any(i < 0 for i in ids):
            raise ValueError(f"dflash target_layer_ids must be distinct and >= 0, got {ids}")
        if num_target_layers is not None and max(ids) >= num_target_layers:
            raise ValueError(f"dflash target_layer_ids {ids} out of range for a "
                             f"{num_target_layers}-layer target")
        draft_block_size = int(dflash_field(config, "block_size") or DEFAULT_DRAFT_BLOCK_SIZE)
        if draft_block_size < 2:
            raise ValueError(f"dflash block_size must be >= 2, got {draft_block_size}")
        return cls(
            target_layer_ids=ids,
            draft_block_size=draft_block_size,
            mask_token_id=_mask_token_id(config, token_to_id),
            target_hidden_size=int(dflash_field(config, "target_hidden_size")
                                   or config.hidden_size),
            token_map=dflash_field(config, "token_map"),
        )

    def as_dflash_config(self) -> dict:
        """The resolved settings as a complete `dflash_config` object, in the checkpoint's
        keys."""
        keys = asdict(self)
        keys["block_size"] = keys.pop("draft_block_size")
        return keys


def _mask_token_id(config: SimpleNamespace, token_to_id: Callable[[str], int | None] | None
                   ) -> int:
    token_id = dflash_field(config, "mask_token_id")
    if token_id is not None:
        return int(token_id)
    token = dflash_field(config, "mask_token") or DEFAULT_MASK_TOKEN
    resolved = token_to_id(token) if token_to_id is not None else None
    if resolved is None:
        raise ValueError(f"the draft config has no mask_token_id and mask token {token!r} is "
                         "not in the tokenizer")
    return resolved


def dflash_layer_attention(config: SimpleNamespace) -> list[LayerAttention]:
    """Each draft layer's attention over cached context + block, as SGLang's DFlashDraftModel
    reads `layer_types`: `full_attention` sees the whole context and the whole block
    (bidirectional); `sliding_attention` is causal inside the block and sees the query and
    the `sliding_window - 1` positions before it (`use_sliding_window` is not consulted). An
    explicit `is_causal` sets every layer's causality. No `layer_types`: all full.

    A bidirectional layer's window bounds keys on the left only; with a window smaller than
    the block, references disagree on the right side, so that case is refused.
    """
    types = layer_types_of(config) or [FULL_ATTENTION] * config.num_hidden_layers
    is_causal = getattr(config, "is_causal", None)
    if is_causal is not None and not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be true, false or absent, got {is_causal!r}")
    window = getattr(config, "sliding_window", None)
    if SLIDING_ATTENTION in types and window is None:
        raise ValueError(f"DFlash draft layer_types {types} has {SLIDING_ATTENTION} layers "
                         "but the config has no sliding_window")
    draft_block_size = int(dflash_field(config, "block_size") or DEFAULT_DRAFT_BLOCK_SIZE)
    out = []
    for layer_type in types:
        causal = layer_type == SLIDING_ATTENTION if is_causal is None else is_causal
        attn_type = AttentionType.DECODER if causal else AttentionType.ENCODER_ONLY
        if layer_type == FULL_ATTENTION:
            out.append(LayerAttention(attn_type=attn_type))
            continue
        if not causal and window < draft_block_size:
            raise ValueError(f"a bidirectional sliding layer with sliding_window {window} "
                             f"below block_size {draft_block_size} is not supported")
        out.append(LayerAttention.sliding(window, attn_type))
    return out

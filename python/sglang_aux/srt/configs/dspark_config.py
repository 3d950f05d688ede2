"""DSpark draft configuration: the DFlash draft's keys plus the Markov and confidence heads.

Read as SGLang reads a DSpark draft's config.json: `markov_rank`, `markov_head_type`,
`enable_confidence_head` and `confidence_head_with_markov` from the `dspark_config` object
first, then the top level; `num_proposals` (SGLang's gamma: proposals per step, one per draft
block row, so a request's verify width is num_proposals + 1) is the checkpoint's `block_size`
from `dspark_config`, `dflash_config` or the top level, else 7 (SGLang's default).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

DEFAULT_DSPARK_PROPOSALS = 7
MIN_PROPOSALS = 2  # the DFlash backbone's smallest block
MARKOV_HEAD_TYPES = ("vanilla",)  # SGLang's "gated" and "rnn" heads are not implemented
# The speculators project trains slot j to predict anchor + j (slot 0 masked); SGLang's
# layout trains slot k to predict anchor + k + 1. Reading one as the other drafts every token
# one position early, so such checkpoints are refused, as SGLang refuses them.
SPECULATORS_DSPARK = "dspark"


def dspark_config_keys(markov_rank: int) -> dict:
    """The keys a DSpark draft's config.json adds to a DFlash draft's, as SGLang's published
    drafts write them: a vanilla Markov head of rank `markov_rank` and a confidence head that
    reads it."""
    return {"architectures": ["DSparkDraftModel"], "markov_rank": markov_rank,
            "markov_head_type": MARKOV_HEAD_TYPES[0], "enable_confidence_head": True,
            "confidence_head_with_markov": True}


def dspark_field(config: SimpleNamespace, key: str):
    """A DSpark setting: `dspark_config`'s value, then `dflash_config`'s, then the top
    level's; None when none has it."""
    for section in ("dspark_config", "dflash_config"):
        raw = getattr(config, section, None) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{section} must be an object, got {raw!r}")
        if raw.get(key) is not None:
            return raw[key]
    return getattr(config, key, None)


def _flag(config: SimpleNamespace, key: str, default: bool) -> bool:
    value = dspark_field(config, key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"DSpark {key} must be true or false, got {value!r}")
    return value


@dataclass(frozen=True)
class DSparkConfig:
    markov_rank: int  # r of markov_w1 `[V, r]` and markov_w2 `[V, r]`
    num_proposals: int  # draft block rows = proposals per step (checkpoint key `block_size`)
    confidence_head: bool
    confidence_with_markov: bool  # the head reads [hidden; markov_w1[previous token]]

    @classmethod
    def from_hf_config(cls, config: SimpleNamespace) -> DSparkConfig:
        """ValueError naming the field that is missing or unsupported."""
        if getattr(config, "speculators_model_type", None) == SPECULATORS_DSPARK:
            raise ValueError("this DSpark checkpoint uses the speculators layout (slot j "
                             "predicts anchor + j); only SGLang's layout (slot k predicts "
                             "anchor + k + 1) is supported")
        rank = dspark_field(config, "markov_rank")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
            raise ValueError(f"a DSpark draft needs markov_rank > 0 (its Markov head), got "
                             f"{rank!r}; a draft without one is a DFlash draft")
        head_type = dspark_field(config, "markov_head_type")
        if head_type is None:
            raise ValueError("the DSpark config sets markov_rank but no markov_head_type")
        if str(head_type).lower() not in MARKOV_HEAD_TYPES:
            raise ValueError(f"DSpark markov_head_type {head_type!r} is not supported "
                             f"(supported: {', '.join(MARKOV_HEAD_TYPES)})")
        n = dspark_field(config, "block_size")
        n = DEFAULT_DSPARK_PROPOSALS if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or n < MIN_PROPOSALS:
            raise ValueError(f"DSpark block_size (proposals per step) must be an integer >= "
                             f"{MIN_PROPOSALS}, got {n!r}")
        return cls(markov_rank=rank, num_proposals=n,
                   confidence_head=_flag(config, "enable_confidence_head", True),
                   confidence_with_markov=_flag(config, "confidence_head_with_markov", True))

"""A checkpoint's RoPE settings, read as transformers reads them, and the inverse frequencies
they define.

Sources, newest first: `rope_parameters` (transformers 5.x: `{"rope_type", "rope_theta", ...}`),
the legacy `rope_scaling` (`"type"` or `"rope_type"`) with a top-level `rope_theta`, and a
top-level `original_max_position_embeddings`, which takes priority for llama3/yarn as in
transformers. Every key is either used or refused: a type we do not compute, a key a type
does not define, or two sources that disagree is a ValueError naming it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

DEFAULT_THETA = 10000.0  # transformers' default for Llama and Qwen3 configs
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0  # the YaRN paper's defaults, as transformers uses
COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta", "partial_rotary_factor"})
# per type: (required keys, optional keys); `original_max_position_embeddings` defaults to
# `max_position_embeddings` where transformers fills it in
TYPE_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "default": (frozenset(), frozenset()),
    "linear": (frozenset({"factor"}), frozenset()),
    "dynamic": (frozenset({"factor"}), frozenset()),
    "llama3": (frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
               frozenset({"original_max_position_embeddings"})),
    "yarn": (frozenset(), frozenset({"factor", "original_max_position_embeddings",
                                     "attention_factor", "beta_fast", "beta_slow", "mscale",
                                     "mscale_all_dim", "truncate"})),
}


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str
    theta: float
    max_position_embeddings: int
    params: dict = field(default_factory=dict)  # the type's own keys, validated

    @classmethod
    def from_hf_config(cls, config: SimpleNamespace) -> RopeScaling:
        raw = _rope_dict(config)
        rope_type = raw.get("rope_type", raw.get("type", "default"))
        if rope_type not in TYPE_KEYS:
            raise ValueError(f"rope type {rope_type!r} is not supported; supported: "
                             f"{', '.join(TYPE_KEYS)}")
        required, optional = TYPE_KEYS[rope_type]
        params = {k: v for k, v in raw.items() if k not in COMMON_KEYS}
        unknown = sorted(set(params) - required - optional)
        if unknown:
            raise ValueError(f"rope type {rope_type!r} does not use {', '.join(unknown)}")
        missing = sorted(required - set(params))
        if missing:
            raise ValueError(f"rope type {rope_type!r} needs {', '.join(missing)}")
        if raw.get("partial_rotary_factor", 1.0) != 1.0:
            raise ValueError(f"partial_rotary_factor {raw['partial_rotary_factor']} is not "
                             "supported (rotary embedding over the whole head only)")
        max_pos = getattr(config, "max_position_embeddings", None) or 2048
        top_original = getattr(config, "original_max_position_embeddings", None)
        if rope_type in ("llama3", "yarn"):
            if top_original is not None:
                params["original_max_position_embeddings"] = top_original
            params.setdefault("original_max_position_embeddings", max_pos)
        elif top_original is not None:
            raise ValueError(f"original_max_position_embeddings is set but rope type "
                             f"{rope_type!r} does not use it")
        return cls(rope_type, float(raw["rope_theta"]), max_pos, params)

    @property
    def attention_factor(self) -> float:
        """The factor cos and sin are scaled by (YaRN's attention temperature; 1 otherwise)."""
        if self.rope_type != "yarn":
            return 1.0
        p = self.params
        if p.get("attention_factor") is not None:
            return float(p["attention_factor"])
        factor = self._yarn_factor()
        if p.get("mscale") and p.get("mscale_all_dim"):
            return _yarn_mscale(factor, p["mscale"]) / _yarn_mscale(factor, p["mscale_all_dim"])
        return _yarn_mscale(factor)

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """`[head_dim / 2]` float32 inverse frequencies."""
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        base = self.theta ** exponents
        p = self.params
        if self.rope_type == "linear":
            return 1.0 / base / p["factor"]
        if self.rope_type == "llama3":
            return _llama3(1.0 / base, p)
        if self.rope_type == "yarn":
            return self._yarn(base, head_dim)
        # "dynamic" (NTK) changes the base only past max_position_embeddings, which the
        # runtime never reaches (the context length is capped there): the default frequencies.
        return 1.0 / base

    def _yarn_factor(self) -> float:
        p = self.params
        if p.get("factor") is None:
            return self.max_position_embeddings / p["original_max_position_embeddings"]
        return float(p["factor"])

    def _yarn(self, base: torch.Tensor, head_dim: int) -> torch.Tensor:
        """Extrapolated frequencies for the fast dimensions, interpolated (/ factor) for the
        slow ones, with a linear ramp between the two correction dimensions."""
        p = self.params
        original = p["original_max_position_embeddings"]

        def correction_dim(rotations: float) -> float:
            return (head_dim * math.log(original / (rotations * 2 * math.pi))
                    / (2 * math.log(self.theta)))

        low = correction_dim(p.get("beta_fast") or YARN_BETA_FAST)
        high = correction_dim(p.get("beta_slow") or YARN_BETA_SLOW)
        if p.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001  # a zero-width ramp would divide by zero
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low))
        extrapolation = 1 - ramp.clamp(0, 1)
        interpolated = 1.0 / (self._yarn_factor() * base)
        return interpolated * (1 - extrapolation) + (1.0 / base) * extrapolation


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _llama3(inv_freq: torch.Tensor, p: dict) -> torch.Tensor:
    """Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend
    between `original / low_freq_factor` and `original / high_freq_factor`."""
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < original / high) & ~(wavelen > original / low)
    return torch.where(medium, blended, scaled)


def _rope_dict(config: SimpleNamespace) -> dict:
    """The one RoPE dict of `config`, with `rope_theta` filled in."""
    new = getattr(config, "rope_parameters", None)
    legacy = getattr(config, "rope_scaling", None)
    if new and legacy and new != legacy:
        raise ValueError(f"rope_parameters {new} and rope_scaling {legacy} disagree")
    raw = dict(new or legacy or {})
    if any(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"per-layer-type rope_parameters ({', '.join(raw)}) are not supported")
    top = getattr(config, "rope_theta", None)
    if top is not None and raw.get("rope_theta") not in (None, top):
        raise ValueError(f"rope_theta {top} disagrees with the rope parameters' "
                         f"rope_theta {raw['rope_theta']}")
    raw["rope_theta"] = raw.get("rope_theta") or top or DEFAULT_THETA
    return raw

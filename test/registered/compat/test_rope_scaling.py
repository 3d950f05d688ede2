"""RoPE settings as transformers reads them: our inverse frequencies and cos/sin factor equal
transformers' own rotary embedding's (`LlamaRotaryEmbedding`, built from a transformers config)
bit for bit for every supported type, and every field we do not compute is refused by name,
never ignored (rope types, keys, window fields transformers' Llama ignores, sliding layers
without a window, unknown layer types, bidirectional targets, MLP biases, activations)."""

import sys
from types import SimpleNamespace

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from sglang_aux.srt.configs.decoder_config import check_decoder_config
from sglang_aux.srt.configs.presets import PRESETS
from sglang_aux.srt.layers.rope_scaling import RopeScaling
from sglang_aux.srt.models.registry import get_model_class
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=30, suite="default")

HEAD_DIM = 64
BASE = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2,
        "max_position_embeddings": 4096}
ROPES = [
    {"rope_type": "default", "rope_theta": 1e6},
    {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
    {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
    {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "rope_theta": 1e6, "factor": 8.0,
     "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": 16, "beta_slow": 2,
     "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": False,
     "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "attention_factor": 1.3,
     "original_max_position_embeddings": 1024},
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: "-".join(map(str, r.values()))[:40])
def test_inv_freq_and_attention_factor_equal_transformers(rope):
    hf_config = transformers.LlamaConfig(**BASE, rope_parameters=dict(rope))
    hf = LlamaRotaryEmbedding(hf_config)
    ours = RopeScaling.from_hf_config(SimpleNamespace(**BASE, rope_parameters=dict(rope)))
    assert torch.equal(ours.inv_freq(HEAD_DIM), hf.inv_freq)
    assert ours.attention_factor == hf.attention_scaling


def test_legacy_fields_read_like_transformers():
    legacy = {**BASE, "rope_theta": 5e5, "original_max_position_embeddings": 256,
              "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}
    hf = LlamaRotaryEmbedding(transformers.LlamaConfig(**legacy))
    ours = RopeScaling.from_hf_config(SimpleNamespace(**legacy))
    # the top-level original_max_position_embeddings wins, as in transformers
    assert ours.params["original_max_position_embeddings"] == 256
    assert torch.equal(ours.inv_freq(HEAD_DIM), hf.inv_freq)
    bare = RopeScaling.from_hf_config(SimpleNamespace(**BASE))
    assert (bare.rope_type, bare.theta) == ("default", 10000.0)


@pytest.mark.parametrize("fields, words", [
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0]}}, "'longrope'"),
    ({"rope_parameters": {"rope_type": "default", "factor": 2.0}}, "does not use factor"),
    ({"rope_parameters": {"rope_type": "linear"}}, "needs factor"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}}, "high_freq_factor"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
     "disagrees"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0},
      "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "disagree"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "per-layer-type"),
    ({"original_max_position_embeddings": 64}, "does not use it"),
])
def test_unsupported_rope_fields_are_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        RopeScaling.from_hf_config(SimpleNamespace(**BASE, **fields))


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3", "tiny-k3", "tiny-llama-dflash"])
def test_every_model_reads_rope_parameters(preset):
    """Llama, Qwen3, the Kimi-K3-style target and the DFlash draft share one RoPE reading."""
    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
            "original_max_position_embeddings": 256}
    raw = {**PRESETS[preset], "rope_theta": None, "rope_parameters": rope}
    model = get_model_class(raw["architectures"][0])(SimpleNamespace(**raw))
    head_dim = raw["head_dim"]
    hf = LlamaRotaryEmbedding(transformers.LlamaConfig(
        hidden_size=raw["hidden_size"], num_attention_heads=raw["hidden_size"] // head_dim,
        max_position_embeddings=raw["max_position_embeddings"], rope_parameters=dict(rope)))
    positions = torch.arange(raw["max_position_embeddings"])
    expected = torch.outer(positions.float(), hf.inv_freq).cos() * hf.attention_scaling
    caches = [m.cos_sin_cache for m in model.modules() if hasattr(m, "cos_sin_cache")]
    assert len(caches) == raw["num_hidden_layers"]
    for cache in caches:
        assert torch.equal(cache[:, : head_dim // 2], expected)


def _qwen3(**kw) -> SimpleNamespace:
    """A Qwen3 config as transformers derives it (layer_types from the window fields)."""
    config = transformers.Qwen3Config(**BASE, max_window_layers=1, **kw)
    return SimpleNamespace(**config.to_dict())


def _llama(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{**transformers.LlamaConfig(**BASE).to_dict(), **kw})


def _edited(config: SimpleNamespace, **kw) -> SimpleNamespace:
    """A config.json transformers would not write (its validation refuses some)."""
    return SimpleNamespace(**{**vars(config), **kw})


def _build(config: SimpleNamespace):
    return get_model_class(config.architectures[0])(config)


def test_decoder_fields_accepted_as_transformers_writes_them():
    accepted = [_qwen3(), _qwen3(use_sliding_window=True, sliding_window=64),
                _qwen3(use_sliding_window=True, sliding_window=64,
                       layer_types=["full_attention"] * 2), _llama()]
    for config in accepted:
        config.architectures = [f"{config.model_type.capitalize()}ForCausalLM"]
        assert check_decoder_config(config) is None  # raises when a field is refused
        _build(config)  # the attention pattern is read (or refused) as the layers are made


@pytest.mark.parametrize("config, words", [
    # transformers' Llama ignores window fields: refused rather than served either way
    (_llama(layer_types=["sliding_attention", "full_attention"], sliding_window=64),
     "computes full attention"),
    (_llama(use_sliding_window=True, sliding_window=64), "use_sliding_window True"),
    (_llama(sliding_window=64), "sliding_window 64"),
    # transformers nulls the window without use_sliding_window, then fails on such a config
    (_qwen3(sliding_window=64, layer_types=["sliding_attention", "full_attention"]),
     "no window"),
    (_edited(_qwen3(), layer_types=["full_attention"]), "each of the 2 layers"),
    (_edited(_qwen3(), layer_types=["chunked_attention", "full_attention"]),
     "chunked_attention"),
    (_edited(_qwen3(), is_causal=False), "bidirectional target"),
    (_edited(_qwen3(), use_sliding_window=True, sliding_window=0,
             layer_types=["sliding_attention", "full_attention"]), "positive integer"),
])
def test_unsupported_attention_fields_are_refused(config, words):
    config.architectures = [f"{config.model_type.capitalize()}ForCausalLM"]
    with pytest.raises(ValueError, match=words):
        _build(config)


@pytest.mark.parametrize("config, words", [
    (SimpleNamespace(**BASE, mlp_bias=True), "mlp_bias"),
    (SimpleNamespace(**BASE, hidden_act="gelu"), "gelu"),
])
def test_unsupported_decoder_fields_are_refused(config, words):
    with pytest.raises(ValueError, match=words):
        check_decoder_config(config)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""A DFlash draft folder in the published layout (SGLang's `DFlashDraftModel`, the z-lab
`*-DFlash-b16` drafts, SpecForge): settings at the top level or in `dflash_config`, no
`target_layer_ids` (the default spread), a `mask_token` string, tensor names with or without
`model.`, an embedding and LM head that the target's replace, `layer_types` with sliding
layers (read as SGLang reads them). It loads beside a target saved by transformers, and DFlash
greedy equals target-only greedy."""

import json
import logging
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from sglang_aux.srt.configs.decoder_config import FULL_CONTEXT, AttentionType
from sglang_aux.srt.configs.dflash_config import DFlashConfig, dflash_layer_attention
from sglang_aux.srt.configs.presets import BYTE_VOCAB
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.radix_attention import RadixAttention
from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.srt.models.weight_utils import checkpoint_tensors, init_random_weights
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import HF_TINY, save_hf_model

register_cpu_ci(est_time=100, suite="default")

TARGET_LAYERS = 6
DRAFT_LAYERS = 2
BLOCK = 4
MASK = "<|mask|>"  # in the byte-level tokenizer, id BYTE_VOCAB + 3
PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 ="]
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
COMMON = dict(device="cpu", max_total_tokens=2048, cuda_graph_bs_decode=[1, 2, 4])
PUBLISHED_CONFIG = {  # the fields a z-lab / SpecForge draft config carries
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    **{k: HF_TINY[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_attention_heads", "num_key_value_heads",
                               "max_position_embeddings")},
    "num_hidden_layers": DRAFT_LAYERS,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "rope_theta": 1e6,
    "rope_scaling": None,
    "attention_bias": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": DRAFT_LAYERS,
    "layer_types": ["full_attention"] * DRAFT_LAYERS,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "block_size": BLOCK,
    "num_target_layers": 36,  # stale: only warns
    "dflash_config": {"mask_token": MASK},
}
DEFAULT_IDS = [1, 3]  # spread over [1, T-3] = [1, 3] for 2 draft layers


def write_draft(folder, config: dict, *, prefix: str = "", fc_in_layers: int | None = None):
    """`config` as config.json; random draft weights named as published (`prefix` + name),
    plus an embedding and an LM head a draft must ignore; `fc_in_layers` makes the fc read
    that many aux states."""
    folder.mkdir(parents=True)
    resolved = {**PUBLISHED_CONFIG, "dflash_config": {
        "target_layer_ids": list(range(fc_in_layers or DRAFT_LAYERS)), "block_size": BLOCK,
        "mask_token_id": 0, "target_hidden_size": config["hidden_size"]}}
    model = DFlashDraftModel(SimpleNamespace(**resolved))
    init_random_weights(model, seed=1)
    tensors = {prefix + k: v.contiguous() for k, v in checkpoint_tensors(model).items()}
    h = config["hidden_size"]
    tensors[prefix + "embed_tokens.weight"] = torch.zeros(config["vocab_size"], h)
    tensors["lm_head.weight"] = torch.zeros(config["vocab_size"], h)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return str(folder)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    out = tmp_path_factory.mktemp("target")
    save_hf_model("LlamaForCausalLM", out, num_hidden_layers=TARGET_LAYERS,
                  rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return str(out)


@pytest.fixture(scope="module")
def target_only(target):
    return Engine(model_path=target, **COMMON).generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("prefix", ["", "model."])
def test_published_draft_loads_and_is_lossless(target, target_only, tmp_path, caplog, prefix):
    draft = write_draft(tmp_path / "draft", PUBLISHED_CONFIG, prefix=prefix)
    with caplog.at_level(logging.WARNING):
        engine = Engine(model_path=target, speculative_algorithm="DFLASH",
                        speculative_draft_model_path=draft, **COMMON)
    assert "num_target_layers=36" in caplog.text
    worker = engine.worker
    assert worker.verify_width == BLOCK
    assert worker.mask_token_id == engine.tokenizer.token_to_id(MASK) == BYTE_VOCAB + 3
    assert worker.draft_runner.model.dflash_config.target_layer_ids == DEFAULT_IDS
    outs = engine.generate(PROMPTS, GREEDY)
    for ref, out in zip(target_only, outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        assert out["meta_info"]["spec_verify_ct"] > 0


def test_wrong_fc_shape_names_both_shapes(target, tmp_path):
    draft = write_draft(tmp_path / "draft", PUBLISHED_CONFIG, fc_in_layers=3)
    with pytest.raises(ValueError, match=r"fc.weight.*\(64, 192\).*\(64, 128\)"):
        Engine(model_path=target, speculative_algorithm="DFLASH",
               speculative_draft_model_path=draft, **COMMON)


def test_mask_token_outside_target_vocab_is_refused(target, tmp_path):
    vocab = HF_TINY["vocab_size"]
    config = {**PUBLISHED_CONFIG, "dflash_config": {"mask_token_id": vocab}}
    draft = write_draft(tmp_path / "draft", config)
    with pytest.raises(ValueError, match=rf"mask_token_id {vocab} is outside .*\[0, {vocab}\)"):
        Engine(model_path=target, speculative_algorithm="DFLASH",
               speculative_draft_model_path=draft, **COMMON)


def _config(**fields) -> SimpleNamespace:
    return SimpleNamespace(**{**PUBLISHED_CONFIG, **fields})


def test_settings_read_from_dflash_config_first_then_top_level():
    both = _config(block_size=8, mask_token_id=5, target_layer_ids=[0, 1],
                   dflash_config={"block_size": 4, "target_layer_ids": [2, 4]})
    dc = DFlashConfig.from_hf_config(both, num_target_layers=TARGET_LAYERS)
    assert (dc.draft_block_size, dc.target_layer_ids, dc.mask_token_id) == (4, [2, 4], 5)
    bare = _config(block_size=None, dflash_config={"mask_token_id": 7})
    assert DFlashConfig.from_hf_config(bare, num_target_layers=36).draft_block_size == 16
    one_layer = _config(num_hidden_layers=1, dflash_config={"mask_token_id": 7})
    assert DFlashConfig.from_hf_config(one_layer, num_target_layers=36).target_layer_ids == [18]
    spread = _config(num_hidden_layers=5, dflash_config={"mask_token_id": 7})
    ids = DFlashConfig.from_hf_config(spread, num_target_layers=36).target_layer_ids
    assert ids == [1, 9, 17, 25, 33]  # the z-lab Qwen3-8B draft's ids


@pytest.mark.parametrize("fields, words", [
    ({"dflash_config": {}}, "'<|MASK|>' is not in the tokenizer"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [1, 1]}}, "distinct"),
    ({"dflash_config": {"mask_token_id": 1, "target_layer_ids": [9]}}, "out of range"),
    ({"dflash_config": {"mask_token_id": 1}, "block_size": 1}, "block_size"),
])
def test_bad_draft_configs_are_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        DFlashConfig.from_hf_config(_config(**fields), num_target_layers=TARGET_LAYERS,
                                    token_to_id=lambda token: None)


SLIDING_DRAFT = {**PUBLISHED_CONFIG, "use_sliding_window": True, "sliding_window": 8,
                 "layer_types": ["sliding_attention", "full_attention"]}
DECODER, ENCODER_ONLY = AttentionType.DECODER, AttentionType.ENCODER_ONLY


def _draft_attention(model) -> list[tuple[int, AttentionType]]:
    return [(m.sliding_window_size, m.attn_type) for m in model.modules()
            if isinstance(m, RadixAttention)]


def test_sliding_draft_layers_load_and_are_lossless(target, target_only, tmp_path):
    """`layer_types` as the published sliding-window drafts write them, read as SGLang reads
    them: the sliding layer is causal and sees the query and the 7 positions before it, the
    full layer sees all context and the whole block. Prompts and outputs run past the window;
    DFlash greedy still equals target-only greedy."""
    draft = write_draft(tmp_path / "draft", SLIDING_DRAFT)
    engine = Engine(model_path=target, speculative_algorithm="DFLASH",
                    speculative_draft_model_path=draft, **COMMON)
    model = engine.worker.draft_runner.model
    assert _draft_attention(model) == [(7, DECODER), (FULL_CONTEXT, ENCODER_ONLY)]
    outs = engine.generate(PROMPTS, GREEDY)
    for ref, out in zip(target_only, outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        assert out["meta_info"]["spec_verify_ct"] > 0


@pytest.mark.parametrize("fields, expected", [
    ({"layer_types": None}, [(FULL_CONTEXT, ENCODER_ONLY)] * 2),  # none: all full, as SGLang
    ({**SLIDING_DRAFT, "use_sliding_window": False}, [(7, DECODER), (FULL_CONTEXT, ENCODER_ONLY)]),
    ({**SLIDING_DRAFT, "is_causal": True}, [(7, DECODER), (FULL_CONTEXT, DECODER)]),
    ({**SLIDING_DRAFT, "is_causal": False}, [(7, ENCODER_ONLY), (FULL_CONTEXT, ENCODER_ONLY)]),
])
def test_draft_layer_attention_follows_sglang(fields, expected):
    layers = dflash_layer_attention(_config(**fields))
    assert [(a.sliding_window_size, a.attn_type) for a in layers] == expected


@pytest.mark.parametrize("fields, words", [
    ({"layer_types": ["sliding_attention", "full_attention"]}, "no sliding_window"),
    ({"layer_types": ["sliding_attention"]}, "each of the 2 layers"),
    ({"layer_types": ["linear_attention", "full_attention"]}, "linear_attention"),
    ({**SLIDING_DRAFT, "is_causal": False, "sliding_window": BLOCK - 1}, "below block_size"),
    ({**SLIDING_DRAFT, "is_causal": "no"}, "is_causal"),
])
def test_unsupported_draft_layer_attention_is_refused(fields, words):
    with pytest.raises(ValueError, match=words):
        dflash_layer_attention(_config(**fields))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""The DSpark draft (`DSparkDraftModel`): the tiny presets save and load through the real
loader; SGLang's published layout (`Qwen3DSparkModel`, heads' settings at the top level,
block size 7) loads; a checkpoint without a Markov head, or without an enabled confidence
head, is refused naming what it lacks; the confidence is sigmoid(proj([h; w1[prev]]) / T) in
fp32."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_aux.srt.configs.dspark_config import DEFAULT_DSPARK_PROPOSALS, DSparkConfig
from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.presets import (
    PRESETS,
    TINY_DSPARK_PROPOSALS,
    TINY_MARKOV_RANK,
    TINY_VOCAB,
)
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.srt.model_loader.preset_checkpoint import write_checkpoint
from sglang_aux.srt.models.dflash import DFlashDraftModel
from sglang_aux.srt.models.dspark import DSparkDraftModel, Qwen3DSparkModel
from sglang_aux.srt.models.weight_utils import checkpoint_tensors, init_random_weights
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="default")

DSPARK_PRESETS = ["tiny-llama-dspark", "tiny-qwen3-dspark", "tiny-k3-dspark"]
HEAD_NAMES = ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
              "confidence_head.proj.weight", "confidence_head.proj.bias")


def _load(folder) -> torch.nn.Module:
    return get_model(ModelConfig.from_pretrained(folder), "cpu")


def _rewrite(folder: Path, *, drop=(), config_updates=None, prefix="") -> Path:
    """The checkpoint at `folder` with tensors `drop`ped, names prefixed, config updated."""
    tensors = {prefix + k: v for k, v in load_file(folder / "model.safetensors").items()
               if k not in drop}
    save_file(tensors, str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **(config_updates or {})}))
    return folder


@pytest.mark.parametrize("preset", DSPARK_PRESETS)
def test_preset_saves_and_loads_every_tensor(preset, tmp_path):
    folder = write_checkpoint(preset, tmp_path / preset, seed=3)
    model = _load(folder)
    assert type(model) is DSparkDraftModel and model.num_proposals == TINY_DSPARK_PROPOSALS
    assert model.dflash_config.draft_block_size == TINY_DSPARK_PROPOSALS
    h = PRESETS[preset]["hidden_size"]
    assert model.markov_head.markov_w1.weight.shape == (TINY_VOCAB, TINY_MARKOV_RANK)
    assert model.markov_head.markov_w2.weight.shape == (TINY_VOCAB, TINY_MARKOV_RANK)
    assert model.confidence_head.proj.weight.shape == (1, h + TINY_MARKOV_RANK)
    saved = load_file(folder / "model.safetensors")
    assert set(HEAD_NAMES) <= set(saved)
    loaded = checkpoint_tensors(model)
    assert set(loaded) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_published_sglang_layout_loads(tmp_path):
    """The keys SGLang's published DSpark drafts carry: `Qwen3DSparkModel`, markov and
    confidence settings at the top level, `block_size` 7 at the top level, `dflash_config`
    with the mask token and target layers; tensors may carry `model.`, and an embedding and
    LM head of the draft's own are skipped."""
    folder = write_checkpoint("tiny-qwen3-dspark", tmp_path / "d", seed=1)
    config = json.loads((folder / "config.json").read_text())
    dc = config.pop("dflash_config")
    saved = load_file(folder / "model.safetensors")
    saved["embed_tokens.weight"] = torch.zeros(TINY_VOCAB, 64)
    saved["lm_head.weight"] = torch.zeros(TINY_VOCAB, 64)
    save_file(saved, str(folder / "model.safetensors"))
    _rewrite(folder, prefix="model.", config_updates={
        **config, "architectures": ["Qwen3DSparkModel"], "block_size": DEFAULT_DSPARK_PROPOSALS,
        "dflash_config": {"mask_token_id": dc["mask_token_id"],
                          "target_layer_ids": dc["target_layer_ids"]}})
    model = _load(folder)
    assert type(model) is Qwen3DSparkModel
    assert model.num_proposals == model.dflash_config.draft_block_size == DEFAULT_DSPARK_PROPOSALS
    assert model.dflash_config.mask_token_id == dc["mask_token_id"]
    assert model.dflash_config.target_layer_ids == dc["target_layer_ids"]
    assert torch.equal(model.markov_head.markov_w1.weight,
                       saved["markov_head.markov_w1.weight"])


def test_settings_under_dspark_config_win():
    config = SimpleNamespace(markov_rank=4, markov_head_type="vanilla", block_size=5,
                             dspark_config={"markov_rank": 8, "block_size": 7,
                                            "enable_confidence_head": False})
    dc = DSparkConfig.from_hf_config(config)
    assert (dc.markov_rank, dc.num_proposals, dc.confidence_head) == (8, 7, False)
    # no block size anywhere: SGLang's default proposal count
    assert DSparkConfig.from_hf_config(
        SimpleNamespace(markov_rank=4, markov_head_type="vanilla")
    ).num_proposals == DEFAULT_DSPARK_PROPOSALS


def test_dflash_checkpoint_is_refused_naming_the_markov_head(tmp_path):
    """A DFlash draft whose config was turned into a DSpark one still lacks the head."""
    folder = write_checkpoint("tiny-llama-dflash", tmp_path / "dflash")
    _rewrite(folder, config_updates={"architectures": ["DSparkDraftModel"], "markov_rank": 16,
                                     "markov_head_type": "vanilla"})
    with pytest.raises(ValueError, match=r"no Markov head \(lacks markov_head\.markov_w1\."
                                         r"weight, markov_head\.markov_w2\.weight\)"):
        _load(folder)


def test_checkpoint_missing_one_markov_tensor_is_refused(tmp_path):
    folder = _rewrite(write_checkpoint("tiny-llama-dspark", tmp_path / "d"),
                      drop={"markov_head.markov_w2.weight"})
    with pytest.raises(ValueError, match=r"lacks markov_head\.markov_w2\.weight\)"):
        _load(folder)


@pytest.mark.parametrize("fields,message", [
    ({"markov_rank": 0}, "markov_rank > 0"),
    ({"markov_rank": None}, "markov_rank > 0"),
    ({"markov_head_type": None}, "no markov_head_type"),
    ({"markov_head_type": "gated"}, "'gated' is not supported"),
    ({"enable_confidence_head": "yes"}, "enable_confidence_head must be true or false"),
    ({"speculators_model_type": "dspark"}, "speculators layout"),
    ({"dflash_config": {"block_size": 1}},
     r"block_size \(proposals per step\) must be an integer >= 2"),
])
def test_bad_config_is_refused(fields, message):
    config = SimpleNamespace(**{**PRESETS["tiny-llama-dspark"], **fields})
    with pytest.raises(ValueError, match=message):
        DSparkDraftModel(config)


def test_missing_confidence_head_is_refused_unless_disabled(tmp_path):
    drop = {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    folder = _rewrite(write_checkpoint("tiny-llama-dspark", tmp_path / "d"), drop=drop)
    with pytest.raises(ValueError, match=r"enables the confidence head but the checkpoint "
                                         r"lacks confidence_head\.proj\.weight, "
                                         r"confidence_head\.proj\.bias"):
        _load(folder)
    _rewrite(folder, config_updates={"enable_confidence_head": False})
    model = _load(folder)
    assert model.confidence_head is None
    with pytest.raises(RuntimeError, match="no confidence head"):
        model.confidence(torch.zeros(1, 64), torch.zeros(1, dtype=torch.int64))


def test_disabled_confidence_head_skips_its_tensors(tmp_path):
    folder = _rewrite(write_checkpoint("tiny-llama-dspark", tmp_path / "d"),
                      config_updates={"enable_confidence_head": False})
    assert _load(folder).confidence_head is None


def test_confidence_is_fp32_sigmoid_of_hidden_and_markov_embedding():
    config = SimpleNamespace(**{**PRESETS["tiny-llama-dspark"], "torch_dtype": "bfloat16"})
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = DSparkDraftModel(config)
    finally:
        torch.set_default_dtype(torch.float32)
    init_random_weights(model, seed=2)
    assert model.confidence_head.proj.weight.dtype == torch.float32
    hidden = torch.randn(5, 64, dtype=torch.bfloat16)
    prev = torch.tensor([0, 7, 300, 7, 41])
    conf = model.confidence(hidden, prev)
    assert conf.dtype == torch.float32 and conf.shape == (5,)
    features = torch.cat([hidden.float(), model.markov_head.markov_w1.weight[prev].float()], -1)
    proj = model.confidence_head.proj
    raw = features @ proj.weight[0] + proj.bias[0]
    torch.testing.assert_close(conf, torch.sigmoid(raw))
    model.confidence_head.temperature.fill_(2.5)
    torch.testing.assert_close(model.confidence(hidden, prev), torch.sigmoid(raw / 2.5))


def test_confidence_without_markov_input_reads_hidden_only():
    config = SimpleNamespace(**{**PRESETS["tiny-llama-dspark"],
                                "confidence_head_with_markov": False})
    model = DSparkDraftModel(config)
    assert model.confidence_head.proj.weight.shape == (1, 64)
    hidden = torch.randn(3, 64)
    a = model.confidence(hidden, torch.tensor([1, 2, 3]))
    b = model.confidence(hidden, torch.tensor([9, 9, 9]))
    assert torch.equal(a, b)


def test_backbone_is_the_dflash_draft():
    """Without its heads a DSpark draft is a DFlash draft: same parameters under the same
    names, so a DFlash draft's block logits are the DSpark draft's base logits."""
    dspark = DSparkDraftModel(SimpleNamespace(**PRESETS["tiny-llama-dspark"]))
    dflash = DFlashDraftModel(SimpleNamespace(**PRESETS["tiny-llama-dflash"]))
    backbone = {k for k in checkpoint_tensors(dspark) if k not in HEAD_NAMES}
    assert backbone == set(checkpoint_tensors(dflash))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

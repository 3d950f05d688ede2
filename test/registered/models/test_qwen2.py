"""Qwen2 (`Qwen2ForCausalLM`) against transformers on a tiny random checkpoint transformers
saved itself: exact greedy tokens and close logits in fp32, the biases it carries, rope 1e6
read from `rope_parameters`, the shared aux buffer opt-in, and lossless DFlash over it."""

import json
import sys
from pathlib import Path

import pytest
import torch

from sglang_aux.srt.configs.presets import MASK_TOKEN_ID
from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.aux_hidden_states import SupportsSharedAuxHiddenStates
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)
from sglang_aux.srt.models.qwen2 import Qwen2ForCausalLM
from sglang_aux.srt.models.weight_utils import init_random_weights
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import QWEN2_ROPE_BASE, save_tiny_qwen2
from sglang_aux.test.runtime_utils import prefill, release
from sglang_aux.tools.dflash_training.export import draft_config, new_draft, write_draft

register_cpu_ci(est_time=15, suite="default")

transformers = pytest.importorskip("transformers", reason="compares with transformers (test extra)")

PROMPTS = [[72, 105, 32, 116, 104, 101, 114, 101, 33], [3, 141, 59, 26, 53, 200, 7], [90]]
NEW_TOKENS = 16
# The same fp32 math in another order (paged vs dense attention, other kernels).
LOGIT_TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return Path(save_tiny_qwen2(tmp_path_factory.mktemp("ckpt") / "tiny-qwen2"))


@pytest.fixture(scope="module")
def device():
    return "cpu"


@pytest.fixture(scope="module")
def hf(folder, device):
    return transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32).eval().to(device)


@pytest.fixture(scope="module")
def engine(folder, device):
    return Engine(model_path=str(folder), dtype="float32", device=device, max_total_tokens=2048,
                  max_running_requests=4)


def test_checkpoint_is_transformers_own(folder):
    """The subject is what transformers 5 writes: no top-level rope_theta, biases on q/k/v."""
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and "rope_theta" not in cfg
    assert cfg["rope_parameters"]["rope_theta"] == QWEN2_ROPE_BASE


def test_model_structure(engine, hf):
    model = engine.worker.model_runner.model
    assert isinstance(model, Qwen2ForCausalLM)
    attn = model.model.layers[0].self_attn
    assert attn.o_proj.bias is None
    for proj in ("q_proj", "k_proj", "v_proj"):  # loaded from the checkpoint, not zero
        ours = attn.qkv_proj.shard_param(proj, "bias")
        assert ours is not None and ours.abs().max() > 0.1
        assert torch.equal(ours, getattr(hf.model.layers[0].self_attn, proj).bias.to(ours))
    assert not torch.equal(model.lm_head_weight, model.model.embed_tokens.weight)  # untied


def test_greedy_tokens_equal_transformers(engine, hf, device):
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    outs = engine.generate(input_ids=PROMPTS, sampling_params=params)
    for ids, out in zip(PROMPTS, outs, strict=True):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids], device=device), max_new_tokens=NEW_TOKENS,
                              do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out["output_ids"] == ref[0, len(ids):].tolist(), ids
        assert len(set(out["output_ids"])) > 3  # a model that moves, not one repeated token


def test_prefill_logits_close_to_transformers(engine, hf, device):
    runner = engine.worker.model_runner
    reqs, out = prefill(runner, PROMPTS)
    release(runner, reqs)
    for i, ids in enumerate(PROMPTS):
        with torch.no_grad():
            ref = hf(torch.tensor([ids], device=device)).logits[0, -1]
        torch.testing.assert_close(out.next_token_logits[i], ref, **LOGIT_TOL)


def test_opts_in_to_the_shared_aux_buffer(engine):
    model = engine.worker.model_runner.model
    assert isinstance(model, SupportsSharedAuxHiddenStates)
    model.set_dflash_layers_to_capture([0, 2])
    try:
        width = resolve_aux_hidden_states_width(
            model=model, spec_algorithm=SpeculativeAlgorithm.DFLASH, is_draft_worker=False)
        assert width == model.get_aux_hidden_states_width() == 2 * 64
    finally:
        model.set_dflash_layers_to_capture([])


def test_dflash_is_lossless_over_the_shared_buffer(folder, engine, device, tmp_path):
    """A random block-8 draft reading three Qwen2 layers: greedy DFlash gives the target-only
    tokens, with the target's verify forwards writing the shared aux buffer."""
    target_cfg = json.loads((folder / "config.json").read_text())
    config = draft_config(target_cfg, num_layers=1, num_aux_layers=3, block_size=8,
                          mask_token_id=MASK_TOKEN_ID)
    draft = new_draft(config, torch.device("cpu"), seed=0)
    init_random_weights(draft, seed=1)
    write_draft(draft, config, tmp_path / "draft", card="random draft\n")
    spec = Engine(model_path=str(folder), dtype="float32", device=device, max_total_tokens=4096,
                  max_running_requests=4, speculative_algorithm="DFLASH",
                  speculative_draft_model_path=str(tmp_path / "draft"))
    assert spec.worker.target_runner.get_aux_hidden_states_width() == 3 * 64
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    ref = engine.generate(input_ids=PROMPTS, sampling_params=params)
    outs = spec.generate(input_ids=PROMPTS, sampling_params=params)
    for r, s in zip(ref, outs, strict=True):
        assert s["output_ids"] == r["output_ids"]
        assert s["meta_info"]["spec_verify_ct"] > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

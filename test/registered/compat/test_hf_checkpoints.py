"""Checkpoints written by transformers' own `save_pretrained` (5.x: `rope_parameters`, `dtype`,
no top-level `rope_theta`), loaded by the Engine: greedy tokens equal transformers' greedy
tokens exactly and last-token logits agree to fp32 noise, for every RoPE type Llama and Qwen3
checkpoints use, legacy `rope_theta` / `rope_scaling`, `head_dim` != hidden / heads, and
`attention_bias` (q/k/v and o_proj biases)."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import edit_config, hf_greedy, hf_last_logits, save_hf_model
from sglang_aux.test.runtime_utils import make_runner, prefill

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 ="]
MAX_NEW = 16
LONG_PROMPT = list(range(3, 200, 2))  # 99 positions: rope differences grow with position
LOGITS_ATOL = 1e-4  # fp32 op-order noise; ignoring rope_theta 1e6 costs ~1e-3 (issue 12)
ROPE_1E6 = {"rope_type": "default", "rope_theta": 1e6}
CASES = {
    "llama-rope-1e6": ("LlamaForCausalLM", {"rope_parameters": ROPE_1E6}),
    "qwen3-rope-1e6-head-dim-32": ("Qwen3ForCausalLM",
                                   {"rope_parameters": ROPE_1E6, "head_dim": 32}),
    "llama-linear": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}}),
    "llama-dynamic": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}}),
    "llama-llama3": ("LlamaForCausalLM", {"rope_parameters": {
        "rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
    "qwen3-yarn": ("Qwen3ForCausalLM", {"rope_parameters": {
        "rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "llama-attention-bias": ("LlamaForCausalLM",
                             {"rope_parameters": ROPE_1E6, "attention_bias": True}),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("hf")


def _assert_matches_hf(hf_model, path: str) -> None:
    engine = Engine(model_path=path, device="cpu", max_total_tokens=2048,
                    cuda_graph_bs_decode=[1, 2, 4])
    ids = [engine.tokenizer.encode(p) for p in PROMPTS]
    outs = engine.generate(input_ids=ids, sampling_params={
        "temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
    for prompt, out in zip(ids, outs, strict=True):
        assert out["output_ids"] == hf_greedy(hf_model, prompt, MAX_NEW)
    runner = make_runner(path, max_total_tokens=512)
    ours = prefill(runner, [LONG_PROMPT])[1].next_token_logits[0]
    torch.testing.assert_close(ours, hf_last_logits(hf_model, LONG_PROMPT),
                               atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_transformers_checkpoint_greedy_equals_transformers(root, case):
    architecture, overrides = CASES[case]
    out = root / case
    hf_model = save_hf_model(architecture, out, **overrides)
    config = edit_config(out)  # as written
    assert "rope_theta" not in config and config["rope_parameters"]["rope_theta"]
    assert config["dtype"] == "float32" and config["tie_word_embeddings"] is False
    _assert_matches_hf(hf_model, str(out))


def test_legacy_rope_theta_and_rope_scaling(root):
    """Configs older transformers wrote: top-level `rope_theta`, `rope_scaling` with "type"."""
    out = root / "legacy"
    hf_model = save_hf_model("LlamaForCausalLM", out, rope_parameters={
        "rope_type": "linear", "rope_theta": 5e5, "factor": 2.0})
    edit_config(out, rope_parameters=None, rope_theta=5e5,
                rope_scaling={"type": "linear", "factor": 2.0}, dtype=None,
                torch_dtype="float32")
    _assert_matches_hf(hf_model, str(out))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

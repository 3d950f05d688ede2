"""Sliding windows as transformers applies them: tiny Qwen3 and Qwen2 checkpoints written by
transformers' own `save_pretrained`, with full and sliding layers mixed, served by the Engine
(decode graphs on the CPU eager-replay backend) on prompts longer than the window: greedy
tokens equal transformers' exactly, in fp32. Also the older Qwen2 form (`use_sliding_window`
+ `max_window_layers`, no `layer_types`), which transformers derives the same layers from.
transformers' Llama has no sliding windows (its window fields are refused: test_rope_scaling).
"""

import sys

import pytest
import torch
import transformers

from sglang_aux.srt.configs.decoder_config import FULL_CONTEXT, AttentionType
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.layers.radix_attention import RadixAttention
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.hf_checkpoints import edit_config, hf_greedy, hf_last_logits, save_hf_model
from sglang_aux.test.runtime_utils import make_runner, prefill

register_cpu_ci(est_time=60, suite="default")

WINDOW = 6
MAX_NEW = 12
# longer than the window before decoding starts, and the decode passes it further
PROMPTS = [list(range(5, 45)), list(range(60, 67)), [3, 9, 27, 81, 30, 90, 17, 51, 40]]
LONG_PROMPT = list(range(3, 200, 2))
LOGITS_ATOL = 1e-4  # fp32 op-order noise
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
SLIDING = {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 0,
           "layer_types": LAYER_TYPES, "rope_parameters": {"rope_type": "default",
                                                           "rope_theta": 1e6}}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("sliding")


def _engine_greedy(path: str) -> list[list[int]]:
    engine = Engine(model_path=path, device="cpu", max_total_tokens=2048,
                    cuda_graph_bs_decode=[1, 2, 4])
    assert engine.worker.model_runner.step_graphs is not None  # decode runs the graph path
    outs = engine.generate(input_ids=PROMPTS, sampling_params={
        "temperature": 0, "max_new_tokens": MAX_NEW, "ignore_eos": True})
    return [out["output_ids"] for out in outs]


def _windows(path: str) -> list[tuple[int, AttentionType]]:
    runner = make_runner(path, max_total_tokens=512)
    return [(m.sliding_window_size, m.attn_type) for m in runner.model.modules()
            if isinstance(m, RadixAttention)]


def _assert_matches_hf(hf_model, path: str) -> None:
    expected = [hf_greedy(hf_model, prompt, MAX_NEW) for prompt in PROMPTS]
    assert _engine_greedy(path) == expected
    runner = make_runner(path, max_total_tokens=512)
    ours = prefill(runner, [LONG_PROMPT])[1].next_token_logits[0]
    torch.testing.assert_close(ours, hf_last_logits(hf_model, LONG_PROMPT),
                               atol=LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize("architecture", ["Qwen3ForCausalLM", "Qwen2ForCausalLM"])
def test_mixed_sliding_layers_greedy_equals_transformers(root, architecture):
    out = root / architecture
    hf_model = save_hf_model(architecture, out, **SLIDING)
    config = edit_config(out)  # as written
    assert config["layer_types"] == LAYER_TYPES and config["sliding_window"] == WINDOW
    decoder = AttentionType.DECODER
    assert _windows(str(out)) == [(WINDOW - 1, decoder) if t == "sliding_attention"
                                  else (FULL_CONTEXT, decoder) for t in LAYER_TYPES]
    _assert_matches_hf(hf_model, str(out))
    # The window matters here: the same weights with every layer full give other logits.
    full = transformers.AutoModelForCausalLM.from_pretrained(
        out, use_sliding_window=False, layer_types=["full_attention"] * len(LAYER_TYPES))
    gap = (hf_last_logits(full, LONG_PROMPT) - hf_last_logits(hf_model, LONG_PROMPT)).abs()
    assert gap.max() > 100 * LOGITS_ATOL


def test_qwen2_window_from_max_window_layers(root):
    """An older Qwen2 config: no `layer_types`; layers from `max_window_layers` on slide."""
    out = root / "qwen2-legacy"
    hf_model = save_hf_model("Qwen2ForCausalLM", out, **{**SLIDING, "max_window_layers": 2,
                                                         "layer_types": None})
    assert hf_model.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    edit_config(out, layer_types=None)
    assert [w for w, _ in _windows(str(out))] == [FULL_CONTEXT] * 2 + [WINDOW - 1] * 2
    _assert_matches_hf(hf_model, str(out))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

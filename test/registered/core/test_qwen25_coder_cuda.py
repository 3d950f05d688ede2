"""The real Qwen2.5-Coder-1.5B-Instruct on the H200, once its GGUF is staged
(scripts/device/stage_qwen2_gguf.sh) or its part packages are installed: the built-in name
imports it, and it knows a fact, adds, and ends its chat turn at <|im_end|>."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_loader import builtin
from sglang_aux.test.ci.ci_register import register_cuda_ci

register_cuda_ci(est_time=300, suite="default")

NAME = "qwen2.5-coder-1.5b-instruct"
IM_END = 151645

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
try:
    builtin.resolve_model_path(NAME)  # imports on first use (about two minutes)
except FileNotFoundError as e:
    pytest.skip(f"{NAME} is not staged: {e}", allow_module_level=True)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(model_path=NAME, device="cuda", max_total_tokens=8192, context_length=2048,
                  max_running_requests=4)


def test_config_is_the_real_model(engine):
    c = engine.model_config.hf_config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
            c.num_key_value_heads, c.intermediate_size, c.vocab_size) == (
        28, 1536, 12, 2, 8960, 151936)
    assert c.rope_theta == 1e6 and not c.tie_word_embeddings
    assert engine.model_config.dtype == torch.bfloat16


def test_builtin_name_serves_real_text(engine):
    raw, chat = engine.generate(
        ["The capital of France is",
         "<|im_start|>user\nWhat is 12 + 30? Reply with the number only.<|im_end|>\n"
         "<|im_start|>assistant\n"],
        {"temperature": 0, "max_new_tokens": 24})
    assert "Paris" in raw["text"]
    assert "42" in chat["text"] and chat["meta_info"]["finish_reason"]["matched"] == IM_END


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

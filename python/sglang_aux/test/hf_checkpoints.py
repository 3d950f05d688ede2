"""Tiny random checkpoints written by transformers itself (`save_pretrained`), for tests that
hold our models to the ecosystem's: its config keys (`rope_parameters`, `layer_types`), its
weight names, its tensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_aux.srt.managers.tokenizer import BYTE_TOKENIZER_CONFIG, byte_level_tokenizer
from sglang_aux.srt.model_loader.weight_utils import init_random_weights
from sglang_aux.tools.presets import BYTE_VOCAB, TINY_VOCAB

QWEN2_ROPE_BASE = 1e6
BIAS_STD = 0.5  # transformers zero-inits biases: random ones make a dropped bias visible


def save_tiny_qwen2(out: str | Path, seed: int = 0) -> str:
    """A 3-layer `Qwen2ForCausalLM` (hidden 64, 4 / 2 heads, untied head, rope 1e6) in fp32,
    with our byte-level tokenizer; returns the folder."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out)
    if (out / "config.json").is_file():
        return str(out)
    config = Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, rope_theta=QWEN2_ROPE_BASE,
                         tie_word_embeddings=False, eos_token_id=BYTE_VOCAB)  # <|endoftext|>
    model = Qwen2ForCausalLM(config).float()
    init_random_weights(model, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * BIAS_STD)
    model.save_pretrained(out)
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(BYTE_TOKENIZER_CONFIG, indent=2) + "\n")
    return str(out)

"""Tiny random checkpoints written by transformers itself (`save_pretrained`), with the tiny
presets' byte-level tokenizer beside them, and transformers' own greedy decoding of them: the
ecosystem's artefacts that conformance tests hold the runtime to."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sglang_aux.srt.configs.presets import BYTE_VOCAB, TINY_VOCAB
from sglang_aux.srt.model_loader.tokenizer import BYTE_TOKENIZER_CONFIG, byte_level_tokenizer

HF_TINY = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    # transformers' 0.02 gives near-uniform logits; wider weights give clear argmaxes
    "initializer_range": 0.2,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
BIAS_STD = 0.5  # transformers zero-inits biases; random ones show that they are applied
QWEN2_ROPE_BASE = 1e6


def save_hf_model(architecture: str, out: Path, seed: int = 0, **config_overrides):
    """`LlamaForCausalLM`, `Qwen2ForCausalLM` or `Qwen3ForCausalLM` with random weights, saved by
    `save_pretrained` into `out` (fp32); returns the in-memory transformers model."""
    import transformers

    kind = architecture.removesuffix("ForCausalLM")
    config = getattr(transformers, f"{kind}Config")(**{**HF_TINY, **config_overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, BIAS_STD)
    model.save_pretrained(out)
    write_byte_tokenizer(out)
    return model


def save_tiny_qwen2(out: str | Path, seed: int = 0) -> str:
    """A 3-layer `Qwen2ForCausalLM` (q/k/v biases, untied head, rope 1e6), saved once into
    `out`; returns the folder."""
    out = Path(out)
    if not (out / "config.json").is_file():
        save_hf_model("Qwen2ForCausalLM", out, seed, num_hidden_layers=3,
                      max_position_embeddings=1024, rope_theta=QWEN2_ROPE_BASE,
                      eos_token_id=BYTE_VOCAB)  # <|endoftext|>
    return str(out)


def write_byte_tokenizer(out: Path) -> None:
    byte_level_tokenizer().save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(BYTE_TOKENIZER_CONFIG) + "\n")


def edit_config(folder: Path, **changes) -> dict:
    """Rewrite `folder/config.json` with keys set (None values remove the key)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2) + "\n")
    return config


@torch.no_grad()
def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy tokens by transformers, recomputing the whole sequence each step (no eos)."""
    ids = torch.tensor([prompt_ids])
    for _ in range(max_new_tokens):
        nxt = model(ids).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids[0, len(prompt_ids):].tolist()


@torch.no_grad()
def hf_last_logits(model, prompt_ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([prompt_ids])).logits[0, -1]

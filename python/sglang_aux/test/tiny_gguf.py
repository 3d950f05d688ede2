"""A tiny `qwen2` GGUF file written with the `gguf` package's GGUFWriter, shaped like
Qwen2.5-Coder's Q4_K_M release: Q4_K and Q6_K weight matrices (raw blocks: the `gguf` package
cannot quantize to K-quants, so block bytes are random with scales that keep weights small),
F32 norms and q/k/v biases, an untied output, and a byte-level BPE vocabulary trained here
with Qwen2's pre-tokenizer, with ChatML specials and padding tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from sglang_aux.srt.model_loader.gguf_tokenizer import pre_tokenizer_for

QK_K = 256  # values per K-quant block
Q4_K_BYTES, Q6_K_BYTES = 144, 210  # bytes per block: f16 d, f16 dmin, 12 scale bytes, 128 qs;
# 128 ql, 64 qh, 16 int8 scales, f16 d
HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 256, 512, 2, 4, 2
CONTEXT, ROPE_BASE, EPS = 2048, 1e6, 1e-6
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # llama.cpp type CONTROL (3)
USER_DEFINED = ["<tool_call>", "</tool_call>"]  # type 4
NUM_PAD = 21  # "[PADn]" entries of type UNUSED (5) filling the vocabulary, as Qwen's file has
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")
BPE_VOCAB = 420
CORPUS = [
    "Natalia sold 48 clips in April and half as many in May. How many did she sell?",
    "It's 12 + 30 = 42; they'll say I'm right, won't they?\n\nAnswer: 42",
    "def area(r):\n    return 3.14159 * r ** 2  # the circle's area\n",
    "The capital of France is Paris. The capital of Italy is Rome.\r\n",
    "    indented   text\twith tabs, café and naïve words, 1,234,567 dollars.",
]


def _tokenizer_entries() -> tuple[list[str], list[int], list[str]]:
    """(tokens, llama.cpp token types, merges "a b") of a BPE trained on CORPUS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer_for("qwen2")[1]
    tok.train_from_iterator(CORPUS * 4, trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    model = json.loads(tok.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    n = len(tokens) + len(SPECIALS) + len(USER_DEFINED)
    pads = [f"[PAD{n + i}]" for i in range(NUM_PAD)]
    types = [1] * len(tokens) + [3] * len(SPECIALS) + [4] * len(USER_DEFINED) + [5] * NUM_PAD
    return tokens + SPECIALS + USER_DEFINED + pads, types, merges


def _k_blocks(rng: np.random.Generator, rows: int, cols: int, block_bytes: int) -> np.ndarray:
    """Random blocks `[rows, cols / 256 * block_bytes]` whose f16 scales give |w| < ~0.15."""
    blocks = rng.integers(0, 256, (rows * cols // QK_K, block_bytes), dtype=np.uint8)
    if block_bytes == Q4_K_BYTES:  # w = d * sc * q - dmin * m, sc and m 6-bit, q 4-bit
        d = rng.uniform(5e-5, 1.5e-4, len(blocks))
        blocks[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
        blocks[:, 2:4] = (d * 7.5).astype(np.float16).view(np.uint8).reshape(-1, 2)
    else:  # Q6_K: w = d * sc * (q - 32), sc int8, q 6-bit
        d = rng.uniform(1e-5, 3e-5, len(blocks))
        blocks[:, -2:] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_tiny_qwen2_gguf(path: str | Path, seed: int = 0) -> Path:
    import gguf

    q4, q6 = gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K
    rng = np.random.default_rng(seed)
    tokens, types, merges = _tokenizer_entries()
    head_dim = HIDDEN // HEADS
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def quant(name: str, rows: int, cols: int, qtype) -> None:
        nbytes = Q4_K_BYTES if qtype == q4 else Q6_K_BYTES
        w.add_tensor(name, _k_blocks(rng, rows, cols, nbytes), raw_dtype=qtype)

    def f32(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    quant("token_embd.weight", len(tokens), HIDDEN, q6)
    for i in range(LAYERS):
        b = f"blk.{i}."
        f32(b + "attn_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN))
        for proj, rows, qtype in (("attn_q", HEADS, q4), ("attn_k", KV_HEADS, q4),
                                  ("attn_v", KV_HEADS, q6)):
            quant(b + proj + ".weight", rows * head_dim, HIDDEN, qtype)
            f32(b + proj + ".bias", 0.3 * rng.standard_normal(rows * head_dim))
        quant(b + "attn_output.weight", HIDDEN, HIDDEN, q4)
        f32(b + "ffn_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN))
        quant(b + "ffn_gate.weight", INTERMEDIATE, HIDDEN, q4)
        quant(b + "ffn_up.weight", INTERMEDIATE, HIDDEN, q4)
        quant(b + "ffn_down.weight", HIDDEN, INTERMEDIATE, q6)
    f32("output_norm.weight", 1 + 0.1 * rng.standard_normal(HIDDEN))
    quant("output.weight", len(tokens), HIDDEN, q6)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)

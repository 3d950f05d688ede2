"""The byte-level BPE tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes, as a
`tokenizers` Tokenizer plus the tokenizer_config.json transformers and we read."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from sglang_aux.srt.model_loader.gguf_reader import GGUFImportError, meta

# Qwen2's split (as its tokenizer.json and llama.cpp's "qwen2" pre-tokenizer have it): GPT-2's
# pattern with single digits and letters joined to one leading non-letter.
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool) -> pre_tokenizers.ByteLevel:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


# `tokenizer.ggml.pre` -> (normalizer, pre-tokenizer). "smollm": every digit on its own, then
# GPT-2's byte-level split (llama.cpp splits on \p{N} first for it; HF's SmolLM2 tokenizer.json
# has the same Digits(individual_digits) step before ByteLevel). "qwen2": NFC, as Qwen's own
# tokenizer.json, then its split and the byte mapping without GPT-2's regex.
_PRE_TOKENIZERS = {
    "gpt2": lambda: (None, _byte_level(True)),
    "smollm": lambda: (None, pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), _byte_level(True)])),
    "qwen2": lambda: (normalizers.NFC(), pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"), _byte_level(False)])),
}
_TOKENIZER_CLASSES = {"qwen2": "Qwen2Tokenizer"}  # else GPT-2's byte-level BPE class
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


def pre_tokenizer_for(pre: str) -> tuple[normalizers.Normalizer | None,
                                         pre_tokenizers.PreTokenizer]:
    """(normalizer, pre-tokenizer) for a `tokenizer.ggml.pre` name."""
    if pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(f"GGUF pre-tokenizer {pre!r} is not supported "
                              f"({', '.join(_PRE_TOKENIZERS)})")
    return _PRE_TOKENIZERS[pre]()


def build_tokenizer(reader) -> tuple[HFTokenizer, dict]:
    """The byte-level BPE tokenizer and tokenizer_config.json the metadata describes."""
    kind = meta(reader, "tokenizer.ggml.model")
    pre = meta(reader, "tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
        raise GGUFImportError(
            f"GGUF tokenizer {kind!r} with pre-tokenizer {pre!r} is not supported "
            f"(byte-level BPE 'gpt2' with {', '.join(_PRE_TOKENIZERS)})"
        )
    tokens = meta(reader, "tokenizer.ggml.tokens")
    types = meta(reader, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta(reader, "tokenizer.ggml.merges")]
    tok = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    normalizer, tok.pre_tokenizer = pre_tokenizer_for(pre)
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True) if ty == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types, strict=True) if ty == _USER_DEFINED])

    def token(key: str) -> str | None:
        i = meta(reader, f"tokenizer.ggml.{key}_token_id", None)
        return None if i is None else tokens[i]

    arch = meta(reader, "general.architecture")
    config = {
        "tokenizer_class": _TOKENIZER_CLASSES.get(pre, "GPT2Tokenizer"),
        "bos_token": token("bos"), "eos_token": token("eos"),
        "pad_token": token("padding"), "unk_token": token("unknown"),
        "add_bos_token": bool(meta(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta(reader, "tokenizer.ggml.add_eos_token", False)),
        "model_max_length": meta(reader, f"{arch}.context_length", None),
        "clean_up_tokenization_spaces": False,
        "chat_template": meta(reader, "tokenizer.chat_template", None),
    }
    return tok, config

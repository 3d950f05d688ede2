"""Text <-> token ids for a model folder (`tokenizer.json` + `tokenizer_config.json`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
# characters a normalizer (NFC composing Hangul jamo, ...) may merge into one, at most
NORMALIZED_CHARS_PER_CHAR = 4


def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet backwards: printable Latin-1 bytes spell themselves, the
    other bytes take the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable},
            **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_OF = _byte_of_char()
BYTE_TOKENIZER_CONFIG = {"eos_token": SPECIAL_TOKENS[0], "bos_token": None, "add_bos_token": False}


def byte_level_tokenizer() -> _HFTokenizer:
    """The tiny presets' tokenizer: 256 byte tokens (ids 0..255), then the special tokens;
    no merges."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = _HFTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


class Tokenizer:
    def __init__(self, tokenizer: _HFTokenizer, config: dict):
        self._tok = tokenizer
        cfg = config
        self.chat_template: str | None = cfg.get("chat_template")
        self.bos_token_id = self._id_of(cfg.get("bos_token"))
        self.eos_token_id = self._id_of(cfg.get("eos_token"))
        self.add_bos_token = bool(cfg.get("add_bos_token", False))

    @classmethod
    def from_dir(cls, model_path: str | Path) -> Tokenizer:
        path = Path(model_path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{model_path} has no tokenizer.json")
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
        return cls(_HFTokenizer.from_file(str(path / "tokenizer.json")), cfg)

    @classmethod
    def byte_level(cls) -> Tokenizer:
        return cls(byte_level_tokenizer(), BYTE_TOKENIZER_CONFIG)

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary or special token, None when absent."""
        return self._tok.token_to_id(token)

    @functools.cached_property
    def max_chars_per_token(self) -> int:
        """The most characters of input text one token can stand for: its longest vocabulary
        entry (a byte-level entry spells each byte as one character, so bytes bound
        characters), times a slack when a normalizer (NFC, ...) may merge characters first."""
        longest = max(map(len, self._tok.get_vocab(with_added_tokens=True)), default=1)
        return longest * (1 if self._tok.normalizer is None else NORMALIZED_CHARS_PER_CHAR)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        # encode_batch releases the GIL while it tokenizes (encode holds it), so a server's
        # event loop tokenizing a long prompt does not stall the thread that launches steps
        ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """One token as text, special tokens included (a piece of a multi-byte character
        decodes to U+FFFD)."""
        return self._tok.decode([token_id], skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> list[int]:
        """One token's UTF-8 bytes (OpenAI's `bytes`): exact for a byte-level vocabulary,
        where a piece of a multi-byte character has no text of its own; else its text's."""
        piece = self._tok.id_to_token(token_id)
        if (isinstance(self._tok.decoder, decoders.ByteLevel) and piece is not None
                and token_id not in self._added_ids and all(c in _BYTE_OF for c in piece)):
            return [_BYTE_OF[c] for c in piece]
        return list(self.token_text(token_id).encode())

    def vocab_bytes(self) -> list[bytes]:
        """Every token's bytes by id (`token_bytes`), b"" for added and special tokens: what
        a grammar matches against (`GrammarBackend`), which never matches those."""
        added = self._added_ids
        return [b"" if i in added else bytes(self.token_bytes(i)) for i in range(self.vocab_size)]

    @functools.cached_property
    def _added_ids(self) -> frozenset[int]:
        return frozenset(self._tok.get_added_tokens_decoder())

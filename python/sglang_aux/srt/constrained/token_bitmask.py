"""Token bitmasks: which tokens a grammar allows next, one bit per token.

xgrammar's layout: row r, bit `t % 32` of int32 word `t // 32` is set when token t is allowed.
The host fills a batch's masks (`RequestGrammar`); one copy takes them to the device, where
`apply_token_bitmask` sets the other tokens' logits to -inf. A row of a request without a
grammar is all ones and leaves its logits as they are.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32
ALLOW_ALL = -1  # an int32 with every bit set


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allow_all(rows: int, vocab_size: int) -> torch.Tensor:
    """A host bitmask `[rows, words]` that allows every token. Pageable: xgrammar fills only
    tensors whose DLPack device is the CPU, which a pinned one may not report."""
    return torch.full((rows, bitmask_words(vocab_size)), ALLOW_ALL, dtype=torch.int32)


def is_allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    """Whether host row `row` of `bitmask` allows `token` (ids past the mask are not)."""
    word, bit = divmod(token, BITS_PER_WORD)
    return word < bitmask.shape[1] and bool((int(bitmask[row, word]) >> bit) & 1)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: the logits `[rows, vocab]` of tokens `bitmask` `[rows, words]` (int32, on
    the logits' device) disallows become -inf. No host sync (capturable)."""
    rows, vocab = logits.shape
    if bitmask.shape != (rows, bitmask_words(vocab)) or bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32 {(rows, bitmask_words(vocab))} for logits "
                         f"{tuple(logits.shape)}, got {bitmask.dtype} {tuple(bitmask.shape)}")
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=logits.device)
    allowed = ((bitmask[:, :, None] >> shifts) & 1).view(rows, -1)[:, :vocab]
    return logits.masked_fill_(allowed == 0, float("-inf"))

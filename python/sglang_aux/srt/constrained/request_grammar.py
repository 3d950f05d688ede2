"""One request's place in its grammar: an xgrammar `GrammarMatcher` and the masks it fills.

The scheduler advances it by every token a request emits (`accept`); a request whose matcher
has accepted a stop token is finished (as SGLang). A step's masks are filled on the host from
the state the emitted tokens left: one row per request, or for a DFlash verify one row per
block position, filled by walking the matcher along the block's drafts and rolling it back.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_aux.srt.constrained.token_bitmask import allow_all, is_allowed


class RequestGrammar:
    def __init__(self, matcher: Any):
        self._matcher = matcher  # xgrammar.GrammarMatcher

    def accept(self, token: int) -> bool:
        """Advance by an emitted token; False (state unchanged) when the grammar forbids it."""
        return self._matcher.accept_token(token)

    @property
    def terminated(self) -> bool:
        """It accepted a stop token: nothing may follow."""
        return self._matcher.is_terminated()

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """The tokens allowed next into host row `row` of `bitmask`."""
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def fill_block(self, bitmask: torch.Tensor, row: int, drafts: list[int]) -> None:
        """Rows `row + j` (j = 0 .. len(drafts)): the tokens allowed after the block's first j
        drafts. Past a draft the grammar forbids (or a stop token) the rows stay as they are:
        verification rejects that draft, so no token is chosen from them. The matcher ends
        where it started."""
        self.fill(bitmask, row)
        walked = 0
        for j, token in enumerate(drafts, 1):
            # the row just filled says whether the grammar takes the draft (asking the
            # matcher to accept a forbidden special token logs a warning)
            if not is_allowed(bitmask, row + j - 1, token) or not self.accept(token):
                break
            walked += 1
            if self.terminated:
                break
            self.fill(bitmask, row + j)
        if walked:
            self._matcher.rollback(walked)


def batch_bitmask(grammars: list[RequestGrammar | None], vocab_size: int,
                  drafts: list[list[int]] | None = None) -> torch.Tensor | None:
    """Host masks of a step, None when no request has a grammar: `[n, words]`, or with
    `drafts` (each request's block drafts, B-1 each) `[n * B, words]`, block-major."""
    if all(g is None for g in grammars):
        return None
    block = 1 if drafts is None else len(drafts[0]) + 1
    bitmask = allow_all(len(grammars) * block, vocab_size)
    for i, g in enumerate(grammars):
        if g is None:
            continue
        if drafts is None:
            g.fill(bitmask, i)
        else:
            g.fill_block(bitmask, i * block, drafts[i])
    return bitmask

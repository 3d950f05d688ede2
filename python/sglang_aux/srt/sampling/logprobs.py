"""Token log probabilities a request asks for (SGLang's `return_logprob` family).

Values are of the target's raw distribution: the log-softmax of its logits, before
temperature, top-k and top-p (SGLang's greedy path, and its sampling path with
SGLANG_RETURN_ORIGINAL_LOGPROB; OpenAI's and vLLM's default), clamped to float32's lowest
finite value so that JSON can carry them. One position's values are `1 + 2 * top_n + m`
float64 columns: the chosen token's logprob, the top-n logprobs, their token ids (exact as
floats: ids stay far below 2**53), and the logprobs of the `m` requested token ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLOAT32_MIN = torch.finfo(torch.float32).min

# One position: (logprob or None, token id, top-n [(logprob, id)] or None, requested ids'
# [(logprob, id)] or None). None: SGLang's first prompt entry, which has no logits before it.
PositionLogprobs = tuple[float | None, int, list[tuple[float, int]] | None,
                         list[tuple[float, int]] | None]


@dataclass(frozen=True)
class LogprobParams:
    # prompt tokens from this index on get entries (the first one None, as SGLang); the
    # prompt's length: none
    start_len: int
    top_n: int = 0
    token_ids: tuple[int, ...] | None = None
    return_text: bool = False  # SGLang's return_text_in_logprobs: each entry's token text


def num_columns(top_n: int, num_ids: int) -> int:
    return 1 + 2 * top_n + num_ids


def position_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top_n: int,
                      token_ids: torch.Tensor | None) -> torch.Tensor:
    """`[n, num_columns]` float64 for logits rows `[n, vocab]`, the tokens chosen after them
    `[n]` and the requested ids `[n, m]` (or None)."""
    lp = torch.log_softmax(logits.float(), dim=-1).clamp_min_(FLOAT32_MIN)
    parts = [lp.gather(1, tokens.view(-1, 1).long())]
    if top_n:
        values, ids = lp.topk(top_n, dim=-1)
        parts += [values, ids.float()]
    if token_ids is not None:
        parts.append(lp.gather(1, token_ids))
    return torch.cat([p.double() for p in parts], dim=1)


def unpack_position(values: list[float], token_id: int, params: LogprobParams,
                    top_n: int) -> PositionLogprobs:
    """One position's entry from its `num_columns(top_n, m)` values, trimmed to what the
    request asked for (a step's layout takes the batch's largest top_n and m)."""
    n = params.top_n
    top = None
    if n:
        top = [(values[1 + k], int(values[1 + top_n + k])) for k in range(n)]
    ids = None
    if params.token_ids is not None:
        base = 1 + 2 * top_n
        ids = [(values[base + k], t) for k, t in enumerate(params.token_ids)]
    return values[0], token_id, top, ids


def logprob_params(fields: dict | None, prompt_len: int, vocab_size: int
                   ) -> LogprobParams | None:
    """From SGLang's native fields (`return_logprob`, `logprob_start_len`,
    `top_logprobs_num`, `token_ids_logprob`, `return_text_in_logprobs`; null means the
    default): None unless `return_logprob`. ValueError names a bad field."""
    f = {k: v for k, v in (fields or {}).items() if v is not None}
    on = f.get("return_logprob", False)
    if not isinstance(on, bool):
        raise ValueError(f"return_logprob must be a boolean, got {on!r}")
    if not on:
        return None
    start = f.get("logprob_start_len", -1)
    if not _is_int(start) or not -1 <= start <= prompt_len:
        raise ValueError(f"logprob_start_len must be -1 or an integer in [0, {prompt_len}] "
                         f"(the prompt's length), got {start!r}")
    top_n = f.get("top_logprobs_num", 0)
    if not _is_int(top_n) or not 0 <= top_n <= vocab_size:
        raise ValueError(f"top_logprobs_num must be an integer in [0, {vocab_size}], "
                         f"got {top_n!r}")
    ids = f.get("token_ids_logprob") or None
    if ids is not None and not (isinstance(ids, list)
                                and all(_is_int(t) and 0 <= t < vocab_size for t in ids)):
        raise ValueError(f"token_ids_logprob must be a list of token ids in [0, {vocab_size}), "
                         f"got {ids!r}")
    text = f.get("return_text_in_logprobs", False)
    if not isinstance(text, bool):
        raise ValueError(f"return_text_in_logprobs must be a boolean, got {text!r}")
    return LogprobParams(prompt_len if start == -1 else start, top_n,
                         None if ids is None else tuple(ids), text)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)

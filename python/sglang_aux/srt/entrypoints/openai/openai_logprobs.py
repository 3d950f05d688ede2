"""OpenAI's logprobs objects from SGLang's native logprob meta_info (`[logprob, token_id,
text]` entries): the legacy completions layout and the chat layout."""

from __future__ import annotations

from sglang_aux.srt.model_loader.tokenizer import Tokenizer


def completion_logprobs(tokenizer: Tokenizer, meta: dict, with_prompt: bool,
                        offset: int = 0) -> dict:
    """`{tokens, token_logprobs, top_logprobs, text_offset}`: the prompt's entries first when
    `with_prompt` (echo), the first of them null as it has nothing before it. Each
    top_logprobs dict holds the top-n and the chosen token (OpenAI: up to n + 1 entries);
    tokens with the same text (pieces of multi-byte characters) keep the likeliest's value.
    text_offset counts characters of the choice's text from `offset` (where a streamed
    chunk's tokens start), adding each token's own text (a piece of a multi-byte character
    counts as one U+FFFD)."""
    rows = list(meta["output_token_logprobs"])
    tops = list(meta.get("output_top_logprobs") or [None] * len(rows))
    if with_prompt:
        rows = meta["input_token_logprobs"] + rows
        tops = list(meta.get("input_top_logprobs") or [None] * len(meta["input_token_logprobs"])
                    ) + tops
    tokens, values, top_dicts, offsets = [], [], [], []
    for (value, token_id, _), top in zip(rows, tops, strict=True):
        text = tokenizer.token_text(token_id)
        tokens.append(text)
        values.append(value)
        offsets.append(offset)
        offset += len(text)
        if value is None:
            top_dicts.append(None)
            continue
        alternatives: dict[str, float] = {}
        for v, t in [*((v, t) for v, t, _ in top or []), (value, token_id)]:
            alternatives.setdefault(tokenizer.token_text(t), v)
        top_dicts.append(alternatives)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": top_dicts,
            "text_offset": offsets}


def chat_logprobs(tokenizer: Tokenizer, meta: dict) -> dict:
    """`{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}` for
    the output tokens; top_logprobs as many as asked, most likely first."""
    rows = meta["output_token_logprobs"]
    tops = meta.get("output_top_logprobs") or [[]] * len(rows)

    def entry(value: float, token_id: int) -> dict:
        return {"token": tokenizer.token_text(token_id), "logprob": value,
                "bytes": tokenizer.token_bytes(token_id)}

    return {"content": [{**entry(value, token_id),
                         "top_logprobs": [entry(v, t) for v, t, _ in top]}
                        for (value, token_id, _), top in zip(rows, tops, strict=True)]}

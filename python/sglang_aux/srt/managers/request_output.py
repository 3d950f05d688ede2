"""A finished request as the output dict every entry point returns (SGLang's `text`,
`output_ids` and `meta_info`)."""

from __future__ import annotations

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.logprobs import LogprobParams, PositionLogprobs


def spec_meta_info(req: Req) -> dict:
    """SGLang's speculative fields of a request's meta_info (zeros without speculation). The
    accept length counts every completion token per verify step (bonus tokens included); the
    rate is accepted over proposed drafts, B-1 proposed per verify step."""
    verify_ct, hist = req.spec_verify_ct, req.spec_accept_histogram
    accepted = sum(i * n for i, n in enumerate(hist))
    proposed = verify_ct * (len(hist) - 1)
    return {
        "spec_accept_length": len(req.output_ids) / verify_ct if verify_ct else 0.0,
        "spec_accept_rate": accepted / proposed if proposed else 0.0,
        "spec_accepted_drafts": accepted,
        "spec_proposed_drafts": proposed,
        "spec_verify_ct": verify_ct,
        # ours: target tokens the verify steps spent (DSpark's compact verify spends fewer)
        "spec_verify_tokens": req.spec_verify_tokens,
        "spec_accept_histogram": list(hist),
    }


def logprob_meta_info(tokenizer: Tokenizer, req: Req) -> dict:
    return logprob_meta(tokenizer, req.logprob, req.input_logprobs, req.output_logprobs)


def logprob_meta(tokenizer: Tokenizer, lp: LogprobParams, input_rows: list[PositionLogprobs],
                 output_rows: list[PositionLogprobs]) -> dict:
    """SGLang's logprob fields of meta_info for these entries: `[logprob, token_id, text or
    None]` per token (the text with return_text_in_logprobs), top-n and requested-id lists
    of such entries per position (None where a position has none: the first prompt
    entry)."""

    def entry(value: float | None, token: int) -> list:
        return [value, token, tokenizer.decode([token]) if lp.return_text else None]

    def entries(pairs: list[tuple[float, int]] | None) -> list | None:
        return None if pairs is None else [entry(v, t) for v, t in pairs]

    meta = {}
    for side, rows in (("input", input_rows), ("output", output_rows)):
        meta[f"{side}_token_logprobs"] = [entry(v, t) for v, t, _, _ in rows]
        if lp.top_n:
            meta[f"{side}_top_logprobs"] = [entries(top) for _, _, top, _ in rows]
        if lp.token_ids is not None:
            meta[f"{side}_token_ids_logprobs"] = [entries(ids) for _, _, _, ids in rows]
    meta["output_token_logprobs_length"] = len(output_rows)
    return meta


def output_text(tokenizer: Tokenizer, req: Req) -> str:
    """The output's text, cut before what stopped it (the stop token's text, the stop string
    or the regex's match) unless `no_stop_trim`; special tokens as `skip_special_tokens`
    says (`spaces_between_special_tokens` only matters to slow HF tokenizers: ours are fast
    ones, which ignore it, as SGLang's do)."""
    p, reason = req.sampling_params, req.finished_reason
    ids = req.output_ids
    trim = not p.no_stop_trim and reason is not None and reason["type"] == "stop"
    if trim and isinstance(reason.get("matched"), int) and ids and ids[-1] == reason["matched"]:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
    if trim and isinstance(reason.get("matched"), str) and reason["matched"] in text:
        text = text[: text.find(reason["matched"])]
    return text


def request_output(tokenizer: Tokenizer, req: Req, latency: float | None = None) -> dict:
    text = output_text(tokenizer, req)
    meta = {
        "id": req.rid,
        "prompt_tokens": len(req.origin_input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": req.finished_reason,
        **spec_meta_info(req),
    }
    if req.logprob is not None:
        meta.update(logprob_meta_info(tokenizer, req))
    if latency is not None:
        meta["e2e_latency"] = latency
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

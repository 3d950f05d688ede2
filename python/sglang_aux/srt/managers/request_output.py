"""A finished request as the output dict every entry point returns (SGLang's `text`,
`output_ids` and `meta_info`)."""

from __future__ import annotations

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.tokenizer import Tokenizer


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
        "spec_accept_histogram": list(hist),
    }


def request_output(tokenizer: Tokenizer, req: Req, latency: float | None = None) -> dict:
    text = tokenizer.decode(req.output_ids)
    reason = req.finished_reason
    if reason and reason["type"] == "stop" and isinstance(reason.get("matched"), str):
        text = text[: text.find(reason["matched"])] if reason["matched"] in text else text
    meta = {
        "id": req.rid,
        "prompt_tokens": len(req.origin_input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": reason,
        **spec_meta_info(req),
    }
    if latency is not None:
        meta["e2e_latency"] = latency
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta}

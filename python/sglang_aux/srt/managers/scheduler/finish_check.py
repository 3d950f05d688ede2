"""When a request ends: EOS and stop token ids, stop strings and regexes, max_new_tokens,
the context end. (min_new_tokens keeps EOS and stop token ids from being chosen at all,
`PenaltyRows`; as SGLang, stop strings still match before it.)

A step brings one token per request (several for DFlash). One decode of each request's tail
per step tells whether a stop string can end it there; only then is each new token's own tail
decoded, to find the token that completed the string (the request ends at that token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.model_loader.tokenizer import Tokenizer

STOP_REGEX_WINDOW_TOKENS = 64  # output tokens a stop regex's match is searched in


@dataclass(frozen=True)
class FinishCheck:
    tokenizer: Tokenizer
    eos_token_ids: set[int]
    context_len: int
    tokens_per_req: int  # the most positions one step writes per request

    def may_stop(self, req: Req, new_tokens: list[int]) -> bool:
        """Whether a stop string or regex can end `req` within `new_tokens` (not yet
        appended)."""
        p = req.sampling_params
        if not p.stop and not p.stop_regex:
            return False
        return self._stop_in_text(req, req.output_ids[-_stop_window(req):] + new_tokens) \
            is not None

    def reason(self, req: Req, tok: int, check_stop: bool) -> dict | None:
        """The finish reason once `tok` was appended to `req`'s output, else None."""
        p = req.sampling_params
        if (tok in self.eos_token_ids and not p.ignore_eos) or tok in p.stop_token_ids:
            return {"type": "stop", "matched": tok}
        if check_stop:
            matched = self._stop_in_text(req, req.output_ids[-_stop_window(req):])
            if matched is not None:
                return {"type": "stop", "matched": matched}
        # the next step writes positions up to seq_len - 1 + tokens_per_req - 1
        at_context_end = req.seq_len + self.tokens_per_req - 1 >= self.context_len
        if len(req.output_ids) >= p.max_new_tokens or at_context_end:
            return {"type": "length", "length": len(req.output_ids)}
        return None

    def _stop_in_text(self, req: Req, ids: list[int]) -> str | None:
        """The first stop string in the text of `ids`, else the first non-empty text a stop
        regex matches there."""
        p = req.sampling_params
        text = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
        matched = next((s for s in p.stop if s in text), None)
        if matched is not None or not p.stop_regex:
            return matched
        for pattern in p.stop_regex:
            found = next((m.group(0) for m in re.finditer(pattern, text) if m.group(0)), None)
            if found is not None:
                return found
        return None


def _stop_window(req: Req) -> int:
    """Output tokens whose text can hold the end of a stop string (or of a stop regex's
    match, if it is at most STOP_REGEX_WINDOW_TOKENS tokens long)."""
    p = req.sampling_params
    return max(8 + max(map(len, p.stop), default=0),
               STOP_REGEX_WINDOW_TOKENS if p.stop_regex else 0)

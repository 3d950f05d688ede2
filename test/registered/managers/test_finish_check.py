"""FinishCheck: a multi-token step ends a request at the token that completes a stop string
(also one that began in earlier output), EOS and length limits still apply per token, and a
step no stop string can end decodes its text once, not once per token."""

import sys

import pytest

from sglang_aux.srt.managers.schedule_batch import Req
from sglang_aux.srt.managers.scheduler.finish_check import FinishCheck
from sglang_aux.srt.model_loader.tokenizer import Tokenizer
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

TOK = Tokenizer.byte_level()  # ids 0..255 are bytes
EOS = 256


class CountingTokenizer:
    def __init__(self):
        self.decodes = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decodes += 1
        return TOK.decode(ids, skip_special_tokens=skip_special_tokens)


def _req(output: str, **params) -> Req:
    return Req("r", TOK.encode("prompt"), SamplingParams.from_dict(params),
               output_ids=TOK.encode(output))


def _append(check: FinishCheck, req: Req, new: str) -> dict | None:
    """What the scheduler does with one step's tokens; returns the finish reason."""
    tokens = TOK.encode(new)
    may = check.may_stop(req, tokens)
    for tok in tokens:
        req.output_ids.append(tok)
        req.finished_reason = check.reason(req, tok, may)
        if req.finished:
            break
    return req.finished_reason


@pytest.mark.parametrize("before,step,kept", [
    ("The answer is", " 42\nQuestion: next", " 42\nQuestion"),  # completes inside the step
    ("The answer is 42\nQues", "tion: x", "tion"),  # began in earlier output
])
def test_stop_string_ends_at_the_completing_token(before, step, kept):
    check = FinishCheck(TOK, {EOS}, context_len=4096, tokens_per_req=8)
    req = _req(before, max_new_tokens=100, stop=["Question"])
    assert _append(check, req, step) == {"type": "stop", "matched": "Question"}
    assert TOK.decode(req.output_ids) == before + kept


def test_eos_and_length_apply_per_token():
    check = FinishCheck(TOK, {EOS}, context_len=4096, tokens_per_req=8)
    req = _req("ab", max_new_tokens=100)
    tokens = [*TOK.encode("cd"), EOS, *TOK.encode("ef")]
    reasons = []
    for tok in tokens:
        req.output_ids.append(tok)
        reasons.append(check.reason(req, tok, False))
        if reasons[-1]:
            break
    assert reasons[-1] == {"type": "stop", "matched": EOS} and len(req.output_ids) == 5
    req = _req("ab", max_new_tokens=4)
    assert _append(check, req, "cdefgh") == {"type": "length", "length": 4}
    assert TOK.decode(req.output_ids) == "abcd"


def test_a_step_no_stop_string_can_end_decodes_once():
    counting = CountingTokenizer()
    check = FinishCheck(counting, {EOS}, context_len=4096, tokens_per_req=8)
    req = _req("The answer is", max_new_tokens=100, stop=["Question"])
    assert _append(check, req, " 42, so x") is None
    assert counting.decodes == 1
    assert _append(check, req, "Question") is not None
    assert counting.decodes > 2  # a possible stop: each token's tail is decoded


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

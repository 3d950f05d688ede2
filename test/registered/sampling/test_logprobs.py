"""Logprobs (SGLang's return_logprob family) on real Engines: SGLang's meta_info layout,
prompt entries equal to a fresh prefill's, and DFlash's (from the verify logits) equal to
target-only's, greedy, fp32 on CPU: ids exactly, values to the kernels' batch variance, and
bit for bit with batch-invariant kernels."""

import math
import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.batch_invariant import batch_invariant_kernels
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import tiny_checkpoint

register_cpu_ci(est_time=60, suite="default")

PROMPTS = ["The quick brown fox jumps over", "Once upon a time", "1 2 3 4 5 6 7"]
COMMON = dict(device="cpu", max_total_tokens=4096, max_running_requests=8)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    target = tiny_checkpoint("tiny-llama", root)
    draft = tiny_checkpoint("tiny-llama-dflash", root)
    return (Engine(model_path=target, **COMMON),
            Engine(model_path=target, speculative_algorithm="DFLASH",
                   speculative_draft_model_path=draft, **COMMON))


def test_layout_matches_sglang(engines):
    plain, _ = engines
    ids = plain.tokenizer.encode(PROMPTS[0])
    out = plain.generate(input_ids=ids, sampling_params={"max_new_tokens": 5, "temperature": 0,
                                                         "ignore_eos": True},
                         return_logprob=True, logprob_start_len=2, top_logprobs_num=3,
                         token_ids_logprob=[5, 7], return_text_in_logprobs=True)
    meta = out["meta_info"]
    inp, outp = meta["input_token_logprobs"], meta["output_token_logprobs"]
    # entries for prompt tokens 2.. (the first None, as SGLang), one per output token
    assert [e[1] for e in inp] == ids[2:] and inp[0][0] is None
    assert [e[1] for e in outp] == out["output_ids"] and meta["output_token_logprobs_length"] == 5
    assert all(e[2] == plain.tokenizer.decode([e[1]]) for e in inp + outp)
    assert meta["input_top_logprobs"][0] is None and meta["input_token_ids_logprobs"][0] is None
    for top, chosen in zip(meta["output_top_logprobs"], outp, strict=True):
        assert len(top) == 3 and top[0][1] == chosen[1]  # greedy: the top token was chosen
        assert top[0][0] == chosen[0] and top[0][0] >= top[1][0] >= top[2][0]
    for row in meta["output_token_ids_logprobs"] + meta["input_token_ids_logprobs"][1:]:
        assert [e[1] for e in row] == [5, 7] and all(e[0] <= 0 for e in row)
    # without return_logprob: none of the fields; without the text switch: None texts
    bare = plain.generate(input_ids=ids, sampling_params={"max_new_tokens": 2})
    assert "output_token_logprobs" not in bare["meta_info"]
    short = plain.generate(input_ids=ids, sampling_params={"max_new_tokens": 2},
                           return_logprob=True)
    assert short["meta_info"]["input_token_logprobs"] == []
    assert all(e[2] is None for e in short["meta_info"]["output_token_logprobs"])
    assert "output_top_logprobs" not in short["meta_info"]


def test_values_are_the_raw_distribution(engines):
    """Prompt and output entries equal the log-softmax of a plain forward's logits over the
    whole sequence (before temperature: a sampled request gets the same kind of values)."""
    plain, _ = engines
    ids = plain.tokenizer.encode(PROMPTS[1])
    out = plain.generate(input_ids=ids, sampling_params={"max_new_tokens": 4, "temperature": 0.7,
                                                         "seed": 3, "ignore_eos": True},
                         return_logprob=True, logprob_start_len=0)
    seq = ids + out["output_ids"]
    ref = plain.generate(input_ids=seq, sampling_params={"max_new_tokens": 1},
                         return_logprob=True, logprob_start_len=0)["meta_info"]
    want = [e[0] for e in ref["input_token_logprobs"]]
    meta = out["meta_info"]
    got = [e[0] for e in meta["input_token_logprobs"] + meta["output_token_logprobs"]]
    assert got[0] is None and want[0] is None
    assert got[1:] == pytest.approx(want[1:], abs=1e-4)
    assert all(math.isfinite(v) and v <= 0 for v in got[1:])


DFLASH_KW = dict(sampling_params={"max_new_tokens": 12, "temperature": 0, "ignore_eos": True},
                 return_logprob=True, logprob_start_len=1, top_logprobs_num=2,
                 token_ids_logprob=[3])
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs",
                "output_token_ids_logprobs", "input_top_logprobs")


def _dflash_and_target_only(engines) -> tuple[list[dict], list[dict]]:
    """The same greedy batch through both engines. The tiny draft is untrained: DFlash
    proposes the target's own tokens, the second one broken, so verify steps accept one
    draft and reject the next."""
    plain, spec = engines
    ids = [plain.tokenizer.encode(p) for p in PROMPTS]
    want = plain.generate(input_ids=ids, **DFLASH_KW)
    refs = {tuple(i): w["output_ids"] for i, w in zip(ids, want, strict=True)}
    worker, b = spec.worker, spec.worker.verify_width

    def propose(reqs, fb):
        drafts = []
        for r in reqs:
            n = len(r.output_ids)
            d = (refs[tuple(r.origin_input_ids)][n:n + b - 1] + [0] * b)[: b - 1]
            d[1] = (d[1] + 1) % 300
            drafts.append(d)
        return torch.tensor(drafts, device=fb.input_ids.device)

    worker.propose = propose
    try:
        got = spec.generate(input_ids=ids, **DFLASH_KW)
    finally:
        worker.propose = worker._graph_proposals
    assert all(o["meta_info"]["spec_accepted_drafts"] for o in got)  # blocks accepted drafts
    for w, g in zip(want, got, strict=True):
        assert g["output_ids"] == w["output_ids"]
    return want, got


def test_dflash_logprobs_equal_target_only(engines):
    want, got = _dflash_and_target_only(engines)
    for w, g in zip(want, got, strict=True):
        for key in LOGPROB_KEYS:
            _assert_entries_close(g["meta_info"][key], w["meta_info"][key], key)


def test_dflash_logprobs_are_target_only_bits_with_batch_invariant_kernels(engines):
    """What remains above is the kernels' batch variance alone: with each row computed as if
    alone (`batch_invariant_kernels`), the verify logits' values are target-only's bit for
    bit (docs/compat.md)."""
    with batch_invariant_kernels():
        want, got = _dflash_and_target_only(engines)
    for w, g in zip(want, got, strict=True):
        for key in LOGPROB_KEYS:
            assert g["meta_info"][key] == w["meta_info"][key], key


def _assert_entries_close(got, want, key: str) -> None:
    """Token ids and texts equal, values within fp32 rounding: a verify forward scores B
    positions with other matmul shapes than a 1-token decode, so CPU kernels round the last
    bits differently (the prompt entries come from the same prefill and match exactly)."""
    if isinstance(want, list) and want and isinstance(want[0], float | None.__class__) and (
            len(want) == 3 and isinstance(want[1], int)):
        assert got[1:] == want[1:], key
        assert (got[0] is None) == (want[0] is None), key
        if want[0] is not None:
            assert got[0] == pytest.approx(want[0], abs=1e-4), key
        return
    assert (got is None) == (want is None) and (want is None or len(got) == len(want)), key
    for g, w in zip(got or [], want or [], strict=True):
        _assert_entries_close(g, w, key)


def test_bad_fields_fail_alone(engines):
    plain, _ = engines
    ids = plain.tokenizer.encode(PROMPTS[2])
    for kw, name in ((dict(logprob_start_len=len(ids) + 1), "logprob_start_len"),
                     (dict(top_logprobs_num=-1), "top_logprobs_num"),
                     (dict(token_ids_logprob=[10**9]), "token_ids_logprob")):
        with pytest.raises(ValueError, match=name):
            plain.generate(input_ids=ids, return_logprob=True, **kw)
    assert plain.generate(input_ids=ids, sampling_params={"max_new_tokens": 1})["output_ids"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

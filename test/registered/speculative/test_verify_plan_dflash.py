"""DFlash with compact verify (`--speculative-verify-mode compact`) on CPU: each proposal's
confidence is the draft's probability of it (a float64 softmax of the draft's own logits);
greedy output equals target-only through the token buckets' graphs, overlap on and off, and on
every aux path, and through the Triton attention (the interpreter), which reads each
request's keys once per ragged step; steps with logprobs or penalties verify every token and
give target-only's values; the flags compact refuses. (The T > 0 law:
`test_acceptance_law.py`.)"""

import os

# NOTE: must precede any @triton.jit definition, i.e. any import of the Triton backend.
os.environ["TRITON_INTERPRET"] = "1"

import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.entrypoints.engine import Engine  # noqa: E402
from sglang_aux.srt.layers.attention.torch_native_backend import (  # noqa: E402
    TorchNativeAttnBackend,
)
from sglang_aux.srt.layers.attention.triton_backend import TritonAttnBackend  # noqa: E402
from sglang_aux.test.ci.ci_register import register_cpu_ci  # noqa: E402
from sglang_aux.test.runtime_utils import (  # noqa: E402
    CAPTURED_BS,
    GREEDY_IGNORE_EOS,
    SPEC_ENGINE_KW,
    SPEC_PROMPTS,
    STAGGERED,
    assert_kv_all_back,
    assert_spec_counts,
    engine_in_verify_mode,
    pair_checkpoints,
    record_graph_forwards,
)

register_cpu_ci(est_time=120, suite="default")

PAIRS = {"tiny-llama": "tiny-llama-dflash", "tiny-qwen3": "tiny-qwen3-dflash",
         "tiny-k3": "tiny-k3-dflash"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"), PAIRS)


@pytest.fixture(scope="module")
def target_only(ckpts):
    return {t: Engine(model_path=ckpts[t], **SPEC_ENGINE_KW).generate(SPEC_PROMPTS, STAGGERED)
            for t in PAIRS}


def _dflash(ckpts, target="tiny-llama", mode="compact", **kw) -> Engine:
    return engine_in_verify_mode(mode, model_path=ckpts[target], speculative_algorithm="DFLASH",
                                 speculative_draft_model_path=ckpts[PAIRS[target]],
                                 **{**SPEC_ENGINE_KW, **kw})


def test_confidence_is_the_drafts_probability_of_its_proposal(ckpts):
    """After every draft forward (graph replays included): `Proposals.confidence[:bs]` is the
    float64 softmax maximum of the draft's logits rows (block offsets 1..W-1, the only ones
    it computes), and the proposals are their argmax. The full width at every batch size: a
    schedule derived from this CPU's timings may verify a size plainly (once, in CI, no draft
    forward of 4 ran)."""
    engine = _dflash(ckpts, speculative_draft_len_schedule="1:4")
    worker = engine.worker
    b, forward, checked = worker.verify_width, worker.draft_runner.forward, []

    def checking(fb):
        out = forward(fb)
        bs = fb.batch_size
        logits = out.next_token_logits.view(bs, b - 1, -1).double()
        want = torch.softmax(logits, -1).amax(-1)
        torch.testing.assert_close(worker.proposals.confidence[:bs].double(), want, rtol=1e-5,
                                   atol=0)
        assert torch.equal(worker.proposals.tokens[:bs], logits.argmax(-1))
        checked.append(bs)
        return out

    worker.draft_runner.forward = checking
    engine.generate(SPEC_PROMPTS, STAGGERED)
    assert set(checked) == {1, 2, 3, 4}


@pytest.mark.parametrize("target", list(PAIRS))
@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_compact_dflash_equals_target_only(ckpts, target_only, target, overlap):
    engine = _dflash(ckpts, target, disable_overlap_schedule=not overlap)
    worker = engine.worker
    b = worker.verify_width
    verifies = record_graph_forwards(worker.target_runner)
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    for ref, out in zip(target_only[target], outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        m = out["meta_info"]
        assert_spec_counts(m, b)
        assert m["spec_verify_ct"] <= m["spec_verify_tokens"] < b * m["spec_verify_ct"]
    # graphs per token bucket, several of them replayed
    graphs = worker.target_runner.step_graphs
    assert graphs.layouts[-1].step_bs == CAPTURED_BS[-1] * b
    assert all(g is not None for _, g in verifies) and len({g for _, g in verifies}) > 2
    assert_kv_all_back(engine)


@pytest.mark.parametrize("variant", [dict(speculative_dflash_aux_projection="streamed"),
                                     dict(disable_shared_aux_buffer=True),
                                     dict(disable_decode_cuda_graph=True)])
def test_compact_dflash_on_every_aux_path(ckpts, target_only, variant):
    engine = _dflash(ckpts, "tiny-k3", **variant)
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in target_only["tiny-k3"]]
    assert_kv_all_back(engine)


def test_token_cap_verifies_whole_blocks_below_it(ckpts, target_only):
    """`--compact-verify-max-tokens`: a step whose blocks fit the cap verifies all of them;
    a larger one verifies exactly the cap (at least its anchors); output still target-only's."""
    engine = _dflash(ckpts, compact_verify_max_tokens=10,
                     speculative_draft_len_schedule="1:4")  # the full width: the cap alone
    worker, plans = engine.worker, []
    b, plan = worker.verify_width, worker.verify_plan.plan

    def recording(bs, every_token, confidence, width):
        n = plan(bs, every_token, confidence, width)
        plans.append((bs, worker.verify_plan.verify_lens[:bs].tolist()))
        return n

    worker.verify_plan.plan = recording
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in target_only["tiny-llama"]]
    assert {bs for bs, _ in plans} == {1, 2, 3, 4}
    for bs, lens in plans:
        assert sum(lens) == min(bs * b, max(bs, 10)), (bs, lens)
        if bs * b <= 10:
            assert lens == [b] * bs
    assert_kv_all_back(engine)


def test_ragged_verify_attention_reads_each_request_once(ckpts, target_only, monkeypatch):
    """The CPU attention runs a ragged step's tokens request by request (each request's keys
    gathered once): equal to gathering them per token, in every verify step."""
    backend = TorchNativeAttnBackend
    shared_rows, checked, plain = backend._forward_shared_rows, [], []

    def both(self, q, layer, fb, kv_len):
        got = shared_rows(self, q, layer, fb, kv_len)
        if got is None:
            plain.append(fb.forward_mode.name)
            return None
        monkeypatch.setattr(backend, "_forward_shared_rows", lambda *_: None)
        want = self._forward_fixed(q, layer, fb)  # one entry, one gather
        monkeypatch.setattr(backend, "_forward_shared_rows", both)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        checked.append(fb.forward_mode.name)
        return got

    monkeypatch.setattr(backend, "_forward_shared_rows", both)
    outs = _dflash(ckpts, "tiny-qwen3").generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in target_only["tiny-qwen3"]]
    assert checked and set(checked) == {"TARGET_VERIFY"}
    assert "TARGET_VERIFY" not in plain


@pytest.mark.parametrize("target", ["tiny-llama", "tiny-k3"])
def test_compact_through_triton_attention_equals_static_and_target_only(ckpts, target,
                                                                        monkeypatch):
    """Every engine on the Triton attention: compact verify's greedy tokens equal static
    verify's and target-only's, and its verify forwards hand the backend the request layout
    (`ForwardBatch.ragged`), which it reads each request's keys once through."""
    ragged, forward = [], TritonAttnBackend.forward

    def recording(self, q, k, v, layer, fb, save_kv_cache=True):
        if fb.forward_mode.name == "TARGET_VERIFY":
            ragged.append(fb.ragged is not None)
        return forward(self, q, k, v, layer, fb, save_kv_cache)

    monkeypatch.setattr(TritonAttnBackend, "forward", recording)
    kw = dict(SPEC_ENGINE_KW, attention_backend="triton")
    want = [o["output_ids"] for o in Engine(model_path=ckpts[target], **kw).generate(
        SPEC_PROMPTS, STAGGERED)]
    for mode in ("static", "compact"):
        ragged.clear()
        engine = _dflash(ckpts, target, mode, attention_backend="triton")
        outs = engine.generate(SPEC_PROMPTS, STAGGERED)
        assert [o["output_ids"] for o in outs] == want, mode
        assert ragged and set(ragged) == {mode == "compact"}, mode
        assert_kv_all_back(engine)


LOGPROBS = dict(return_logprob=True, logprob_start_len=1, top_logprobs_num=2,
                token_ids_logprob=[3])


def _entries(field) -> list[tuple]:
    """A logprob field's (value, token id, text) entries, flattened."""
    if isinstance(field, tuple | list) and len(field) == 3 and isinstance(field[1], int):
        return [tuple(field)]
    return [e for x in field for e in _entries(x)]


def test_logprob_and_penalty_steps_verify_every_token(ckpts):
    """A batch with a logprob request, or a penalized one, verifies whole blocks (the static
    rows these paths read) and returns target-only's tokens and logprobs."""
    engine, plain = _dflash(ckpts), Engine(model_path=ckpts["tiny-llama"], **SPEC_ENGINE_KW)
    b = engine.worker.verify_width
    params = dict(GREEDY_IGNORE_EOS, max_new_tokens=12)
    got, want = (e.generate(SPEC_PROMPTS[1:3], params, **LOGPROBS) for e in (engine, plain))
    for g, w in zip(got, want, strict=True):
        assert g["output_ids"] == w["output_ids"]
        m = g["meta_info"]
        assert m["spec_verify_tokens"] == b * m["spec_verify_ct"]
        for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
            got_entries, want_entries = _entries(m[key]), _entries(w["meta_info"][key])
            assert got_entries, key
            assert [e[1:] for e in got_entries] == [e[1:] for e in want_entries], key
            assert [e[0] for e in got_entries] == pytest.approx(
                [e[0] for e in want_entries], abs=1e-4), key
    penalized = dict(params, frequency_penalty=0.8, presence_penalty=0.3)
    got, want = (e.generate(SPEC_PROMPTS, penalized) for e in (engine, plain))
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    assert all(o["meta_info"]["spec_verify_tokens"] == b * o["meta_info"]["spec_verify_ct"]
               for o in got)
    # the same engine, plain greedy again: compact lengths
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert sum(o["meta_info"]["spec_verify_tokens"] for o in outs) < b * sum(
        o["meta_info"]["spec_verify_ct"] for o in outs)
    assert_kv_all_back(engine)


def test_compact_dflash_start_errors(ckpts):
    with pytest.raises(ValueError, match="enable-mixed-chunk"):
        _dflash(ckpts, enable_mixed_chunk=True)
    with pytest.raises(ValueError, match="DFLASH with --speculative-verify-mode compact and "
                                         "--tp-size > 1"):
        _dflash(ckpts, tp_size=2)
    with pytest.raises(ValueError, match="compact-verify-budget-frac"):
        _dflash(ckpts, compact_verify_budget_frac=1.5)
    with pytest.raises(ValueError, match="compact-verify-max-tokens must be >= 1, got 0"):
        _dflash(ckpts, compact_verify_max_tokens=0)
    with pytest.raises(ValueError, match="two budgets of compact verify"):
        _dflash(ckpts, compact_verify_budget_frac=0.5, compact_verify_max_tokens=8)
    # static verify refuses compact verify's flags, naming them and the mode flag
    for flag, value in (("compact_verify_budget_frac", 0.5), ("compact_verify_max_tokens", 8),
                        ("speculative_dspark_align_verify_tokens_to_graph_tier", True)):
        with pytest.raises(ValueError, match=f"--{flag.replace('_', '-')} only act with "
                                             "--speculative-verify-mode compact"):
            _dflash(ckpts, mode="static", **{flag: value})
    # static verify with mixed chunks starts
    engine = _dflash(ckpts, mode="static", enable_mixed_chunk=True)
    assert engine.worker.verify_plan.compact is False


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

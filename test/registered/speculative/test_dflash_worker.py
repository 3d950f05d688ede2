"""DFlash end to end on CPU (SPEC 3.5): lossless greedy decoding, acceptance bookkeeping under
known proposals, and aux rows consumed before the next target forward."""

import sys

import pytest
import torch

from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.managers.schedule_batch import Req, reserve_kv
from sglang_aux.srt.sampling.sampling_params import SamplingParams
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    assert_kv_all_back,
    assert_spec_counts,
    eager_forward,
    extend_batch,
    pair_checkpoints,
)

register_cpu_ci(est_time=90, suite="default")

PROMPTS = ["Hi", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48 of"]
GREEDY = {"temperature": 0, "max_new_tokens": 14, "ignore_eos": True}
PAIRS = {"tiny-k3": "tiny-k3-dflash", "tiny-llama": "tiny-llama-dflash"}
COMMON = dict(device="cpu", max_total_tokens=4096, cuda_graph_bs_decode=[1, 2, 4],
              max_running_requests=4)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"), PAIRS)


@pytest.fixture(scope="module")
def target_only(ckpts):
    return {t: Engine(model_path=ckpts[t], **COMMON).generate(PROMPTS, GREEDY) for t in PAIRS}


def _dflash(ckpts, target, **kw):
    return Engine(model_path=ckpts[target], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=ckpts[PAIRS[target]], **{**COMMON, **kw})


@pytest.mark.parametrize("target", list(PAIRS))
@pytest.mark.parametrize("shared", [True, False])
def test_greedy_dflash_equals_target_only(ckpts, target_only, target, shared):
    engine = _dflash(ckpts, target, disable_shared_aux_buffer=not shared)
    runner = engine.worker.target_runner
    assert (runner.aux_storage is not None) == shared
    outs = engine.generate(PROMPTS, GREEDY)
    for ref, out in zip(target_only[target], outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        assert_spec_counts(out["meta_info"], engine.worker.verify_width)
    assert_kv_all_back(engine)


@pytest.mark.parametrize("target", list(PAIRS))
def test_narrower_verify_widths_stay_lossless(ckpts, target_only, target):
    """`--speculative-verify-width w` below the draft's block: each step verifies the block's
    first w - 1 proposals (what `bench_dflash_step.py --widths` times), greedy output still
    the target's."""
    widths = range(2, _dflash(ckpts, target).worker.verify_width)
    assert len(widths) == 2  # the tiny drafts' block of 4: widths 2 and 3
    for width in widths:
        engine = _dflash(ckpts, target, speculative_verify_width=width)
        assert engine.worker.verify_width == width
        graphs = engine.worker.target_runner.step_graphs  # the eager-replay graphs
        assert {x.tokens_per_req for x in graphs.layouts} == {width}
        outs = engine.generate(PROMPTS, GREEDY)
        for ref, out in zip(target_only[target], outs, strict=True):
            assert out["output_ids"] == ref["output_ids"], width
            assert_spec_counts(out["meta_info"], width)
        assert_kv_all_back(engine)


def _oracle(worker, references: dict[str, list[int]], corrupt_at: int | None):
    """Proposals read from the target-only output; `corrupt_at` (1-based) breaks one."""

    def propose(reqs, fb):
        drafts = []
        for r in reqs:
            ref = references[r.rid]
            n = len(r.output_ids)
            d = (ref[n:n + worker.verify_width - 1] + [0] * worker.verify_width)
            d = d[: worker.verify_width - 1]
            if corrupt_at is not None:
                d[corrupt_at - 1] = (d[corrupt_at - 1] + 1) % 300
            drafts.append(d)
        return torch.tensor(drafts, device=fb.input_ids.device)

    return propose


@pytest.mark.parametrize("corrupt_at", [None, 1, 2, 3])
def test_acceptance_under_known_proposals(ckpts, target_only, corrupt_at):
    engine = _dflash(ckpts, "tiny-k3")
    worker = engine.worker
    b = worker.verify_width
    params = dict(GREEDY, max_new_tokens=1 + 3 * b)  # first token + three full steps
    refs = engine.generate(PROMPTS, dict(params))  # rids req-0..3, the same as below
    by_rid = {f"req-{i + len(PROMPTS)}": r["output_ids"] for i, r in enumerate(refs)}
    worker.propose = _oracle(worker, by_rid, corrupt_at)
    lengths = []
    orig_decode = worker.decode

    def decode(reqs):
        before = [r.kv_len for r in reqs]
        step = orig_decode(reqs)
        for r, k0, toks in zip(reqs, before, step.tokens(), strict=True):
            lengths.append(len(toks))
            assert r.kv_len == k0 + len(toks)
            assert r.kv_len == len(r.origin_input_ids) + len(r.output_ids) + len(toks) - 1
        return step

    worker.decode = decode
    outs = engine.generate(PROMPTS, params)
    expect = b if corrupt_at is None else corrupt_at
    assert lengths and all(n == expect for n in lengths[:len(PROMPTS)]), lengths
    for ref, out in zip(refs, outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
    for o in outs:  # every step accepted expect - 1 drafts
        m = o["meta_info"]
        assert m["spec_accept_histogram"][expect - 1] == m["spec_verify_ct"] == sum(
            m["spec_accept_histogram"])
        assert m["spec_accept_length"] == m["completion_tokens"] / m["spec_verify_ct"]
    if corrupt_at is None:
        assert all(o["meta_info"]["spec_accept_rate"] == 1.0 for o in outs)
    assert_kv_all_back(engine)


def _draft_context_error(worker, req: Req) -> float:
    """Max |draft context K - recomputed| over the request's committed slots, where the
    recomputation prefills the whole committed sequence into fresh rows."""
    tr = worker.target_runner
    committed = (req.origin_input_ids + req.output_ids)[: req.kv_len]
    (fresh,), fb = extend_batch(tr, [committed])
    aux = eager_forward(tr, fb).aux_hidden_states
    slots = tr.req_to_token_pool.req_to_token[req.req_pool_idx, : req.kv_len].long()
    pool = worker.draft_runner.token_to_kv_pool
    got = [pool.k_buffer[i][slots] for i in range(len(pool.k_buffer))]
    # the draft's own definition of context K (training uses it too), not the commit path
    draft = worker.draft_runner.model
    want = [k for k, _ in draft.context_kv(draft.project_context(aux), fb.positions)]
    return max(float((g - w.view(g.shape)).abs().max()) for g, w in zip(got, want, strict=True))


def _run_steps(worker, prompt_ids, steps=4):
    """Drive the worker as the scheduler does: rows and whole reservations first."""
    reqs = [Req(f"s{i}", ids, SamplingParams(temperature=0)) for i, ids in enumerate(prompt_ids)]
    for r in reqs:
        r.req_pool_idx = worker.target_runner.req_to_token_pool.alloc()
        need = len(r.origin_input_ids) + (steps + 1) * worker.verify_width
        reserve_kv(worker.target_runner, r, need)
        worker.admit(r)
    for r, toks in zip(reqs, worker.prefill(reqs).tokens(), strict=True):
        r.output_ids += toks
    for _ in range(steps):
        for r, toks in zip(reqs, worker.decode(reqs).tokens(), strict=True):
            r.output_ids += toks
    return reqs


def test_aux_rows_consumed_before_next_target_forward(ckpts):
    engine = _dflash(ckpts, "tiny-k3")
    worker = engine.worker
    buf = worker.target_runner.aux_storage.buffer
    worker.on_aux_consumed = lambda: buf.fill_(float("nan"))
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS[1:3]]
    reqs = _run_steps(worker, prompts)
    for r in reqs:
        assert _draft_context_error(worker, r) < 1e-4


def test_reading_after_poison_is_detected(ckpts):
    """Control: had the commit read its rows after the buffer was overwritten (as by the next
    verify replay), the context check would catch it. (The CPU's eager replay re-runs the
    captured closure, which looks the commit up on the worker.)"""
    engine = _dflash(ckpts, "tiny-k3")
    worker = engine.worker
    commit = worker.draft_context.commit

    def late_commit(aux, positions, out_cache_loc):
        aux.fill_(float("nan"))
        commit(aux, positions, out_cache_loc)

    worker.draft_context.commit = late_commit
    reqs = _run_steps(worker, [engine.tokenizer.encode(PROMPTS[2])], steps=2)
    worker.draft_context.commit = commit
    err = _draft_context_error(worker, reqs[0])
    assert not err < 1e-4, "a late read of the shared buffer went unnoticed"


def test_dflash_start_errors(ckpts):
    with pytest.raises(ValueError, match="draft-model-path"):
        Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH", **COMMON)
    with pytest.raises(ValueError, match="pipeline"):
        Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH",
               speculative_draft_model_path=ckpts["tiny-k3-dflash"], pp_size=2, **COMMON)
    with pytest.raises(ValueError, match="verify-width must be >= 2 with DFLASH"):
        Engine(model_path=ckpts["tiny-k3"], speculative_algorithm="DFLASH",
               speculative_draft_model_path=ckpts["tiny-k3-dflash"],
               speculative_verify_width=1, **COMMON)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

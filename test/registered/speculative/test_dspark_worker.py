"""DSpark end to end on CPU (issue 30): greedy DSpark equals target-only token for token on
the three tiny targets, static and compact verify, overlap on and off, through every captured
graph size and a padded one; compact lengths within the budget, 1..verify width and the token
buckets in a served run; acceptance exact under known proposals (at most `lens - 1` drafts);
mixed steps; the aux gating and storage; the refusals (logprobs, bad flags, bad drafts);
compact verify through the Triton attention's ragged path too (the interpreter, here)."""

import os

# NOTE: before any @triton.jit definition is imported: the Triton attention runs interpreted.
os.environ["TRITON_INTERPRET"] = "1"

import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_aux.srt.configs.model_config import ModelConfig
from sglang_aux.srt.configs.speculative_algorithm import SpeculativeAlgorithm
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_executor.model_runner_components.misc_utils import (
    resolve_aux_hidden_states_width,
)
from sglang_aux.srt.model_loader.loader import get_model
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    CAPTURED_BS,
    GREEDY_IGNORE_EOS,
    SPEC_ENGINE_KW,
    SPEC_PROMPTS,
    STAGGERED,
    assert_kv_all_back,
    assert_spec_counts,
    engine_in_verify_mode,
    flat_step_costs,
    pair_checkpoints,
    record_graph_forwards,
    record_verdict_rows,
)

register_cpu_ci(est_time=150, suite="default")

PAIRS = {"tiny-llama": "tiny-llama-dspark", "tiny-qwen3": "tiny-qwen3-dspark",
         "tiny-k3": "tiny-k3-dspark"}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"), PAIRS, "tiny-llama-dflash")


@pytest.fixture(scope="module")
def target_only(ckpts):
    return {t: Engine(model_path=ckpts[t], **SPEC_ENGINE_KW).generate(SPEC_PROMPTS, STAGGERED)
            for t in PAIRS}


@pytest.fixture(scope="module")
def flat_costs(tmp_path_factory):
    return flat_step_costs(tmp_path_factory.mktemp("costs"))


def _dspark(ckpts, target="tiny-llama", mode="static", **kw) -> Engine:
    return engine_in_verify_mode(mode, model_path=ckpts[target], speculative_algorithm="DSPARK",
                                 speculative_draft_model_path=ckpts[PAIRS[target]],
                                 **{**SPEC_ENGINE_KW, **kw})


@pytest.mark.parametrize("target", list(PAIRS))
@pytest.mark.parametrize("mode", ["static", "compact"])
@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_dspark_equals_target_only(ckpts, target_only, flat_costs, target, mode,
                                          overlap):
    costs = {"speculative_step_costs": flat_costs} if mode == "compact" else {}
    engine = _dspark(ckpts, target, mode, disable_overlap_schedule=not overlap, **costs)
    worker = engine.worker
    drafts, verifies = (record_graph_forwards(worker.draft_runner),
                        record_graph_forwards(worker.target_runner))
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    b = worker.verify_width
    assert b == worker.proposer.draft_block_size + 1 == 4
    for ref, out in zip(target_only[target], outs, strict=True):
        assert out["output_ids"] == ref["output_ids"]
        m = out["meta_info"]
        assert_spec_counts(m, b)
        if mode == "static":
            assert m["spec_verify_tokens"] == b * m["spec_verify_ct"]
        else:
            assert m["spec_verify_ct"] <= m["spec_verify_tokens"] < b * m["spec_verify_ct"]
    # the draft's graphs: every captured size and a padded batch of 3
    assert all(g is not None for _, g in drafts)
    assert {bs for bs, _ in drafts} == {1, 2, 3, 4}
    assert {g for _, g in drafts} == set(range(len(CAPTURED_BS)))
    assert all(g is not None for _, g in verifies)
    graphs = worker.target_runner.step_graphs
    if mode == "static":
        assert {g for _, g in verifies} == set(range(len(CAPTURED_BS)))
    else:  # token buckets: several, each a captured layout
        assert graphs.layouts[-1].step_bs == CAPTURED_BS[-1] * b
        assert len({g for _, g in verifies}) > 2
    assert_kv_all_back(engine)


@pytest.mark.parametrize("variant", [dict(speculative_dflash_aux_projection="streamed"),
                                     dict(disable_shared_aux_buffer=True),
                                     dict(disable_decode_cuda_graph=True),
                                     dict(attention_backend="triton")])
def test_compact_verify_on_every_aux_path(ckpts, target_only, variant):
    """Compact verify's ragged forwards through the streamed projection, per-forward aux
    outputs, eager steps and the Triton attention (each request's keys read once for all its
    verified tokens): greedy output still equals target-only."""
    engine = _dspark(ckpts, "tiny-k3", "compact", **variant)
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in target_only["tiny-k3"]]
    assert_kv_all_back(engine)


@pytest.mark.parametrize("align,sampled", [(False, False), (True, False), (False, True)])
def test_compact_lengths_respect_budget_bounds_and_buckets(ckpts, align, sampled):
    """Every step's lengths: 1..W (the verify width), the budget spent (to the bucket with
    `align`), the bucket captured; no request accepts more than its verified drafts, greedy or
    sampled (`test_acceptance_law.py` holds the cap where drafts are often accepted)."""
    frac = 0.5
    engine = _dspark(ckpts, mode="compact", compact_verify_budget_frac=frac,
                     speculative_dspark_align_verify_tokens_to_graph_tier=align)
    worker = engine.worker
    b = worker.verify_width
    n_proposals = b - 1
    buckets = [x.step_bs for x in worker.target_runner.step_graphs.layouts]
    plans, plan = [], worker.verify_plan.plan

    def recording_plan(bs, every_token, confidence, width):
        n = plan(bs, every_token, confidence, width)
        plans.append((bs, n, width, worker.verify_plan.verify_lens[:n].tolist()))
        return n

    worker.verify_plan.plan, rows = recording_plan, record_verdict_rows(worker)
    params = [dict(p, temperature=1.0, seed=i) if sampled else p
              for i, p in enumerate(STAGGERED)]
    outs = engine.generate(SPEC_PROMPTS, params)
    assert plans and len({n for _, n, _, _ in plans}) > 1
    for bs, n, width, lens in plans:
        live, rest = lens[:bs], lens[bs:]
        assert n in buckets and all(1 <= x <= b for x in live) and not any(rest)
        # the derived draft length schedule's width caps the budget too
        take = min(bs * (width - 1), round(frac * bs * n_proposals))
        if align:
            take = min(n - bs, bs * (width - 1))
        # random confidences are far above the survival floor: the budget is spent whole
        assert sum(live) == bs + take <= n, (bs, n, lens)
    verdicts = [(row[0], row[-1]) for row in rows]  # accepted drafts, tokens verified
    assert all(0 <= accepted <= length - 1 for accepted, length in verdicts)
    assert sum(o["meta_info"]["spec_verify_tokens"] for o in outs) == sum(
        length for _, length in verdicts)
    assert_kv_all_back(engine)


def test_compact_batches_past_the_largest_bucket_run_eagerly(ckpts):
    """More requests than the largest verify graph takes: the step runs eagerly with exactly
    its budget's tokens, and greedy output still equals target-only."""
    prompts = SPEC_PROMPTS * 2
    common = dict(SPEC_ENGINE_KW, max_running_requests=8)
    ref = Engine(model_path=ckpts["tiny-llama"], **common).generate(prompts, STAGGERED * 2)
    engine = _dspark(ckpts, mode="compact", **common)
    worker = engine.worker
    largest = worker.target_runner.step_graphs.layouts[-1].step_bs
    verifies = record_graph_forwards(worker.target_runner)
    outs = engine.generate(prompts, STAGGERED * 2)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    eager = [bs for bs, g in verifies if g is None]
    assert eager and all(n > largest for n in eager)
    assert all(g is not None for bs, g in verifies if bs <= largest)
    assert_kv_all_back(engine)


def _oracle(worker, references: dict[str, list[int]]):
    """Proposals read from the target-only output."""
    w = worker.verify_width - 1

    def propose(reqs, fb):
        rows = []
        for r in reqs:
            n = len(r.output_ids)
            rows.append((references[r.rid][n : n + w] + [0] * w)[:w])
        return torch.tensor(rows, device=fb.input_ids.device)

    return propose


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_acceptance_under_known_proposals(ckpts, mode):
    """Every proposal right: static accepts all W - 1, compact exactly `lens - 1` (the bonus
    comes from the row after the last verified draft)."""
    engine = _dspark(ckpts, mode=mode, disable_overlap_schedule=True)
    worker = engine.worker
    params = dict(GREEDY_IGNORE_EOS, max_new_tokens=1 + 4 * worker.verify_width)
    # references past the end: a compact step's drafts may reach beyond max_new_tokens
    refs = engine.generate(SPEC_PROMPTS, dict(params, max_new_tokens=3 * params["max_new_tokens"]))
    by_rid = {f"req-{i + len(SPEC_PROMPTS)}": r["output_ids"] for i, r in enumerate(refs)}
    worker.propose = _oracle(worker, by_rid)
    rows = record_verdict_rows(worker)
    outs = engine.generate(SPEC_PROMPTS, params)
    for ref, out in zip(refs, outs, strict=True):
        assert out["output_ids"] == ref["output_ids"][: params["max_new_tokens"]]
    assert rows
    for row in rows:
        want = worker.verify_width - 1 if mode == "static" else row[-1] - 1
        assert row[0] == want, row
    if mode == "compact":
        assert len({row[-1] for row in rows}) > 1, "lengths should vary with confidence"
    assert_kv_all_back(engine)


def test_mixed_steps_equal_target_only(ckpts):
    prompts = SPEC_PROMPTS + ["x", "What is the capital of France?", "Once upon a time"]
    params = dict(GREEDY_IGNORE_EOS, max_new_tokens=10)
    common = dict(SPEC_ENGINE_KW, max_running_requests=3, cuda_graph_bs_decode=[1, 2, 3],
                  cuda_graph_tokens_prefill=[16, 32, 64], cuda_graph_max_bs_prefill=2,
                  enable_mixed_chunk=True, mixed_chunk_max_prefill_tokens=16)
    ref = Engine(model_path=ckpts["tiny-llama"], **common).generate(prompts, params)
    engine = _dspark(ckpts, **common)
    mixed = []
    orig = engine.worker.mixed

    def counting(*a, **kw):
        mixed.append(1)
        return orig(*a, **kw)

    engine.worker.mixed = counting
    outs = engine.generate(prompts, params)
    assert mixed, "no mixed step ran"
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in ref]
    assert_kv_all_back(engine)


def test_dspark_targets_share_the_aux_storage(ckpts):
    config = ModelConfig.from_pretrained(ckpts["tiny-llama"])
    model = get_model(config, "cpu")
    model.set_dflash_layers_to_capture([0, 1])
    dspark = SpeculativeAlgorithm.DSPARK
    assert dspark.is_dflash_family()
    width = resolve_aux_hidden_states_width(model=model, spec_algorithm=dspark,
                                            is_draft_worker=False)
    assert width == 2 * config.hf_config.hidden_size
    assert resolve_aux_hidden_states_width(model=model, spec_algorithm=dspark,
                                           is_draft_worker=True) == 0
    for mode in ("static", "compact"):
        worker = _dspark(ckpts, "tiny-k3", mode).worker
        storage = worker.target_runner.aux_storage
        assert storage is not None and worker.draft_runner.aux_storage is None
        graphs = worker.target_runner.step_graphs
        # every verify graph (a batch size, or a token bucket) writes a row view of it
        for layout, static in zip(graphs.layouts, graphs.static, strict=True):
            rows = static.aux_hidden_states_buffer
            assert rows.data_ptr() == storage.buffer.data_ptr()
            assert rows.shape[0] == layout.num_tokens
        assert storage.buffer.shape[0] >= graphs.layouts[-1].num_tokens


def test_dspark_refuses_logprobs(ckpts):
    engine = _dspark(ckpts)
    with pytest.raises(ValueError, match="return_logprob"):
        engine.generate(SPEC_PROMPTS[0], dict(GREEDY_IGNORE_EOS, max_new_tokens=4),
                        return_logprob=True)
    out = engine.generate(SPEC_PROMPTS[0], dict(GREEDY_IGNORE_EOS, max_new_tokens=4))  # serving
    assert out["meta_info"]["completion_tokens"] == 4


def test_dflash_serves_a_dspark_draft_with_a_warning(ckpts, target_only, caplog):
    """A DSpark draft given to DFLASH runs as a DFlash draft (its Markov head unread), still
    lossless, and the log says so."""
    with caplog.at_level(logging.WARNING, logger="sglang_aux.srt.speculative.dflash_worker"):
        engine = Engine(model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
                        speculative_draft_model_path=ckpts["tiny-llama-dspark"],
                        **SPEC_ENGINE_KW)
    assert any("is a DSpark draft" in r.getMessage() and "Markov head" in r.getMessage()
               for r in caplog.records)
    outs = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in target_only["tiny-llama"]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sglang_aux.srt.speculative.dflash_worker"):
        _dspark(ckpts)
    assert not caplog.records  # DSPARK reads the head: nothing to say


def test_dspark_start_errors(ckpts, tmp_path):
    t = ckpts["tiny-llama"]
    with pytest.raises(ValueError, match="markov_rank"):
        Engine(model_path=t, speculative_algorithm="DSPARK",
               speculative_draft_model_path=ckpts["tiny-llama-dflash"], **SPEC_ENGINE_KW)
    with pytest.raises(ValueError, match="pipeline"):
        _dspark(ckpts, pp_size=2)
    with pytest.raises(ValueError, match="verify-width must be >= 3 with DSPARK"):
        _dspark(ckpts, speculative_verify_width=2)
    with pytest.raises(ValueError, match="DSPARK with --tp-size > 1 is not built"):
        _dspark(ckpts, tp_size=2)
    with pytest.raises(ValueError, match="enable-mixed-chunk"):
        _dspark(ckpts, mode="compact", enable_mixed_chunk=True)
    with pytest.raises(ValueError, match="cap-accept"):
        _dspark(ckpts, mode="cap-accept")
    headless = tmp_path / "headless"
    shutil.copytree(ckpts["tiny-llama-dspark"], headless)
    cfg = json.loads((headless / "config.json").read_text())
    cfg["enable_confidence_head"] = False
    (headless / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="confidence head"):
        engine_in_verify_mode("compact", model_path=t, speculative_algorithm="DSPARK",
                              speculative_draft_model_path=str(headless), **SPEC_ENGINE_KW)
    # the flag overrides the checkpoint's proposal count; static verify runs without the head
    engine = Engine(model_path=t, speculative_algorithm="DSPARK",
                    speculative_draft_model_path=str(headless),
                    speculative_verify_width=6, **SPEC_ENGINE_KW)
    assert engine.worker.verify_width == 6 == engine.worker.draft_runner.model.num_proposals + 1
    markov = engine.worker.draft_runner.model.markov_head  # its bounds: taken at load, current
    assert markov._bounds_of == (markov.markov_w2.weight.data_ptr(),
                                 markov.markov_w2.weight._version)
    assert engine.worker.target_runner.step_graphs.layouts[0].tokens_per_req == 6
    out = engine.generate(SPEC_PROMPTS[1], dict(GREEDY_IGNORE_EOS, max_new_tokens=8))
    assert out["meta_info"]["spec_accept_histogram"].__len__() == 6


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

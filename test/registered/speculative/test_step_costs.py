"""Step costs (configs/step_costs.py, speculative/step_cost_probe.py): a step pads to the
smallest measured size holding it and grows in proportion past the largest, the contexts'
share with its requests; the file round-trips, bare or as a bench report's field (files
without the context keys still load); the start-up probe times the draft graph at every
captured batch size and the verify graph (ragged or static) at every token bucket or batch
size, then the largest of each over requests that hold the context, clears those requests'
rows, and leaves the engine's greedy output exact. A static server's draft, which computes
only a narrower step's proposals, is timed at one proposal a request too (those graphs
captured for it, kept for steps of width 2), and its cost is interpolated in the proposals."""

import json
import sys

import pytest

from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.speculative.step_cost_probe import measure_step_costs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    CAPTURED_BS,
    SPEC_ENGINE_KW,
    SPEC_PROMPTS,
    STAGGERED,
    pair_checkpoints,
)

register_cpu_ci(est_time=15, suite="default")


def test_a_step_pads_to_the_next_measured_size():
    costs = StepCosts({1: 1.0, 4: 2.0}, {4: 3.0, 16: 5.0})
    assert [costs.draft(bs) for bs in (1, 2, 4)] == [1.0, 2.0, 2.0]
    assert costs.draft(8) == pytest.approx(4.0)  # past the largest: in proportion
    assert [costs.verify(n) for n in (1, 4, 5, 16, 32)] == [3.0, 3.0, 5.0, 5.0, 10.0]
    assert costs.context_cost(8, drafted=True) == 0.0
    ctx = StepCosts({1: 1.0}, {4: 3.0}, context=512, draft_context_ms=0.01,
                    verify_context_ms=0.05)
    assert ctx.context_cost(8, drafted=True) == pytest.approx(0.48)
    assert ctx.context_cost(8, drafted=False) == pytest.approx(0.4)


def test_a_narrower_draft_costs_between_one_proposal_and_all():
    costs = StepCosts({1: 1.0, 4: 2.0}, {4: 3.0}, draft_one_ms={1: 0.9, 4: 1.0},
                      draft_proposals=3)
    assert [costs.draft(4, n) for n in (None, 3, 2, 1)] == [2.0, 2.0, 1.5, 1.0]
    assert costs.draft(2, 2) == 1.5 and costs.draft(1, 1) == 0.9
    assert StepCosts({1: 1.0}, {4: 3.0}).draft(1, 1) == 1.0  # not measured: the block's
    for bad in ({1: 0.9}, {1: 0.9, 4: -1}):
        with pytest.raises(ValueError, match="'draft_one_ms' must give finite positive"):
            StepCosts({1: 1.0, 4: 2.0}, {4: 3.0}, draft_one_ms=bad, draft_proposals=3)
    with pytest.raises(ValueError, match="with 'draft_proposals' >= 2"):
        StepCosts({1: 1.0}, {4: 3.0}, draft_one_ms={1: 0.5}, draft_proposals=1)


@pytest.mark.parametrize("field, value", [("context", -1), ("draft_context_ms", float("inf")),
                                          ("verify_context_ms", "1")])
def test_bad_context_costs_are_refused(field, value):
    with pytest.raises(ValueError, match=f"'{field}' must be a finite number >= 0"):
        StepCosts({1: 1.0}, {4: 3.0}, **{field: value})


def test_file_round_trips_bare_and_inside_a_bench_report(tmp_path):
    costs = StepCosts({1: 1.5, 2: 2.5}, {2: 3.0, 8: 4.0}, context=900, draft_context_ms=0.002,
                      verify_context_ms=0.004, draft_one_ms={1: 1.0, 2: 1.2},
                      draft_proposals=15, source="probe")
    bare, report = tmp_path / "bare.json", tmp_path / "report.json"
    bare.write_text(json.dumps(costs.to_json()))
    report.write_text(json.dumps({"rows": [], "step_costs": costs.to_json()}))
    for path in (bare, report):
        loaded = StepCosts.load(str(path))
        assert loaded == costs and loaded.source == f"{path} (probe)"
    old = tmp_path / "old.json"  # written before the context keys
    old.write_text(json.dumps({"draft_ms": {"1": 1.5}, "verify_ms": {"2": 3.0}}))
    assert StepCosts.load(str(old)) == StepCosts({1: 1.5}, {2: 3.0})


@pytest.mark.parametrize("mode", ["compact", "static"])
def test_probe_times_every_captured_graph(tmp_path, mode, monkeypatch):
    ckpts = pair_checkpoints(tmp_path, {"tiny-llama": "tiny-llama-dflash"})
    kw = dict(SPEC_ENGINE_KW, model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
              speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    engine = Engine(speculative_verify_mode=mode, **kw)
    worker = engine.worker
    draft, verify = worker.draft_runner.step_graphs, worker.target_runner.step_graphs
    pool = worker.target_runner.req_to_token_pool
    # the attention's lengths of every forward the probe replays
    seen, attend = [], worker.target_runner.attn_backend.forward

    def recording(q, k, v, layer, fb, *a, **k2):
        if layer.layer_id == 0:
            seen.append((fb.forward_mode, int(fb.seq_lens.max())))
        return attend(q, k, v, layer, fb, *a, **k2)

    monkeypatch.setattr(worker.target_runner.attn_backend, "forward", recording)
    plan = worker.verify_plan
    before = list(draft.layouts)
    costs = measure_step_costs(draft, verify, replays=2, context=200,
                               ragged_lens=plan.verify_lens if plan.compact else None,
                               narrow_draft=not plan.compact)
    assert sorted(costs.draft_ms) == CAPTURED_BS
    w = worker.verify_width
    if plan.compact:  # its draft ranks every proposal: the block's cost alone
        assert costs.draft_one_ms == {} and draft.layouts == before
    else:  # one proposal's logits a request at every size, those graphs kept
        assert sorted(costs.draft_one_ms) == CAPTURED_BS and costs.draft_proposals == w - 1
        assert all(v > 0 for v in costs.draft_one_ms.values())
        assert sorted((x.step_bs, x.logits_per_req) for x in draft.layouts) == sorted(
            [(bs, w - 1) for bs in CAPTURED_BS] + [(bs, 1) for bs in CAPTURED_BS])
    assert sorted(costs.verify_ms) == [x.num_tokens for x in verify.layouts]
    assert all(v > 0 for v in (*costs.draft_ms.values(), *costs.verify_ms.values()))
    assert costs.context == 200 and costs.source.endswith("; contexts of 200 tokens)")
    assert costs.draft_context_ms >= 0 and costs.verify_context_ms >= 0
    # the target's verify graph replayed over requests holding the context, then the rows
    # and lengths the probe borrowed are clear again
    assert max(n for _, n in seen) == 200 + w
    assert not pool.req_to_token[1:].any() and not pool.kv_lens.any()
    assert not plan.verify_lens.any()
    # the server measured its own at start-up (no file given), at the default context or
    # what the KV pool holds for the largest graph's requests
    assert worker.draft_len.costs is None or worker.draft_len.costs.context > 0
    want = Engine(**SPEC_ENGINE_KW, model_path=ckpts["tiny-llama"]).generate(SPEC_PROMPTS,
                                                                           STAGGERED)
    got = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]


@pytest.mark.parametrize("mode", ["compact", "static"])
def test_a_context_the_pool_or_the_context_cannot_hold_is_measured_smaller(tmp_path, mode):
    ckpts = pair_checkpoints(tmp_path, {"tiny-llama": "tiny-llama-dflash"})
    kw = dict(model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
              speculative_verify_mode=mode, speculative_step_cost_context=100000,
              speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    profile = tmp_path / "profile.json"
    profile.write_text('{"accept_histogram": [1, 1, 1, 1]}')
    if mode == "static":  # static verify measures its costs only to derive from a profile
        kw["speculative_acceptance_profile"] = str(profile)
    by_pool = Engine(**dict(SPEC_ENGINE_KW, max_total_tokens=1024), **kw)
    costs, w = by_pool.worker.draft_len.costs, by_pool.worker.verify_width
    largest = max(CAPTURED_BS)  # the draft's requests, and the ragged bucket's at width w
    assert 0 < costs.context <= 1024 // largest - w
    # a context right at the model's limit: every probe request's step still fits it
    by_context = Engine(**dict(SPEC_ENGINE_KW, context_length=128), **kw)
    assert by_context.worker.draft_len.costs.context == 128 - w
    got = by_context.generate(SPEC_PROMPTS, STAGGERED)
    want = Engine(**dict(SPEC_ENGINE_KW, context_length=128),
                  model_path=ckpts["tiny-llama"]).generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    with pytest.raises(ValueError, match="--speculative-step-cost-context must be >= 0"):
        Engine(**SPEC_ENGINE_KW, model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
               speculative_draft_model_path=ckpts["tiny-llama-dflash"],
               speculative_step_cost_context=-1)

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

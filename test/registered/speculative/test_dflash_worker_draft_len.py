"""DFlash under a draft length schedule (`--speculative-draft-len-schedule 1:4,3:2,5:1`,
compact and static verify, CPU): requests arrive and finish so the running batch grows past 5
and shrinks back to 1, crossing every threshold both ways; every greedy request's output equals
target-only token for token (a sampled request rides along, so the sampling tails run over
plain steps too); each step verifies what its batch size's width allows, plain steps (width 1)
run no draft forward, yet commit the draft context of their tokens, so speculation resumes
after them; the step statistics count them. Static verify replays a graph of each step's
width (captured per batch size and width); derived from a profile, its schedule is fixed at
start-up with the graphs it needs. Without a schedule static verify keeps the full width and
counts its mixed steps among the verify steps."""

import json
import sys

import pytest

from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import (
    ARRIVAL_SAMPLED,
    ARRIVALS,
    arrival_params,
    assert_kv_all_back,
    cached_kv_error,
    committed_tokens,
    pair_checkpoints,
    record_mixed_steps,
    run_arrivals,
)

register_cpu_ci(est_time=40, suite="default")

SCHEDULE = "1:4,3:2,5:1"
# arrivals prefilled apart unless a test asks for mixed steps
ENGINE_KW = dict(device="cpu", max_total_tokens=4096, max_running_requests=6,
                 cuda_graph_bs_decode=[1, 2, 4, 6], enable_mixed_chunk=False)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"),
                            {"tiny-llama": "tiny-llama-dflash"})


@pytest.fixture(scope="module")
def target_only(ckpts):
    engine = Engine(model_path=ckpts["tiny-llama"], **ENGINE_KW)
    return engine.generate([p for p, _, _ in ARRIVALS],
                           [arrival_params(i) for i in range(len(ARRIVALS))])


def _dflash(ckpts, mode: str, **kw) -> Engine:
    """The tiny DFlash pair under `mode` verify."""
    return Engine(model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=ckpts["tiny-llama-dflash"],
                  speculative_verify_mode=mode, **{**ENGINE_KW, **kw})


def _assert_exact(engine: Engine, reqs: list, target_only: list[dict], *,
                  context: bool = False) -> None:
    """Every greedy request equals target-only token for token, each at its full length;
    `context`: the target's K/V and the draft context of every committed token are cached
    (plain steps' too)."""
    for i, (req, want) in enumerate(zip(reqs, target_only, strict=True)):
        assert len(req.output_ids) == ARRIVALS[i][1]
        if i != ARRIVAL_SAMPLED:
            assert req.output_ids == want["output_ids"], i
        if context:
            assert cached_kv_error(engine, committed_tokens(req)) < 1e-4, i


def _assert_crossed_both_ways(sizes: list[int], widths: list[int], w: int) -> None:
    """The running batch grew past each threshold of SCHEDULE and shrank back below them:
    widths w and 2 before the first plain step and after the last."""
    assert set(sizes) >= {1, 2, 3, 4, 5, 6}
    first_plain, last_plain = widths.index(1), len(widths) - 1 - widths[::-1].index(1)
    assert w in widths[:first_plain] and 2 in widths[:first_plain]
    assert 2 in widths[last_plain:] and w in widths[last_plain:]


@pytest.mark.parametrize("overlap", [False, True])
def test_batch_crossing_the_thresholds_both_ways_stays_exact(ckpts, target_only, overlap):
    engine = _dflash(ckpts, "compact", speculative_draft_len_schedule=SCHEDULE,
                     disable_overlap_schedule=not overlap)
    worker = engine.worker
    schedule, w = DraftLenSchedule.parse(SCHEDULE), worker.verify_width
    steps, plan, draft_forward = [], worker.verify_plan.plan, worker.draft_runner.forward
    drafts = []

    def recording_plan(bs, every_token, confidence, width):
        n = plan(bs, every_token, confidence, width)
        steps.append((bs, width, worker.verify_plan.verify_lens[:bs].tolist()))
        return n

    def counting_draft(fb):
        drafts.append(fb.forward_mode)
        return draft_forward(fb)

    worker.verify_plan.plan, worker.draft_runner.forward = recording_plan, counting_draft
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only, context=True)
    widths = [width for _, width, _ in steps]
    _assert_crossed_both_ways([bs for bs, _, _ in steps], widths, w)
    budget = worker.verify_plan.budget
    for bs, width, lens in steps:
        assert width == schedule.width(bs), (bs, width)
        assert all(1 <= n <= w for n in lens)
        assert sum(lens) <= bs + min(budget(bs), bs * (width - 1)), (bs, width, lens)
        if width == 1:
            assert lens == [1] * bs
    # plain steps run no draft forward, and the statistics count them
    assert drafts == [ForwardMode.DRAFT_BLOCK] * sum(width > 1 for width in widths)
    assert worker.step_stats == {"spec_verify_steps": len(steps),
                                 "spec_plain_steps": widths.count(1)}
    assert worker.server_info()["speculative_draft_len_schedule"] == {
        "schedule": SCHEDULE, "source": "flag", "verify_width": w}
    assert_kv_all_back(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_static_verify_narrows_per_batch_size_and_stays_exact(ckpts, target_only, overlap):
    engine = _dflash(ckpts, "static", speculative_draft_len_schedule=SCHEDULE,
                     disable_overlap_schedule=not overlap)
    worker = engine.worker
    schedule, w, runner = DraftLenSchedule.parse(SCHEDULE), worker.verify_width, \
        worker.target_runner
    graphs = runner.step_graphs
    # the full width at every captured size (steps that verify every token), and each size's
    # schedule widths: size 4 takes bs 3-4 (width 2), size 6 bs 5-6 (width 1)
    assert sorted((x.step_bs, x.tokens_per_req) for x in graphs.layouts) == [
        (1, w), (2, w), (4, 2), (4, w), (6, 1), (6, w)]
    # the draft's graphs: every size's proposals (w - 1 logits rows a request), and those a
    # narrower width verifies (size 4: 1; size 6's width 1 runs no draft)
    draft_graphs = worker.draft_runner.step_graphs
    assert sorted((x.step_bs, x.tokens_per_req, x.logits_per_req)
                  for x in draft_graphs.layouts) == [
        (1, w, w - 1), (2, w, w - 1), (4, w, 1), (4, w, w - 1), (6, w, w - 1)]
    steps, prepare, draft_forward, drafts = [], runner.prepare, worker.draft_runner.forward, []
    draft, narrowed = worker._draft, []

    def checking_draft(reqs, has_sampling, width=None):
        """A narrower step's proposals are the full block's first width - 1: its draft
        computes the same logits rows, only fewer (the full forward first, the step's own
        last, so the step reads its own)."""
        bs, n = len(reqs), (width or w) - 1
        if n < w - 1:
            draft(reqs, has_sampling)
            full = worker.proposals.tokens[:bs, :n].clone()
        draft(reqs, has_sampling, width)
        if n < w - 1:
            assert worker.proposals.tokens[:bs, :n].equal(full), (bs, width)
            narrowed.append(bs)

    def recording_prepare(inputs):
        fb = prepare(inputs)
        if inputs.mode == ForwardMode.TARGET_VERIFY:
            layout = graphs.layouts[fb.prepared_graph]
            steps.append((len(inputs.step_rows), fb.tokens_per_req, layout.tokens_per_req))
        return fb

    def counting_draft(fb):
        rows = draft_graphs.layouts[fb.prepared_graph].logits_per_req
        drafts.append((fb.batch_size, fb.logits_per_req, rows))
        return draft_forward(fb)

    runner.prepare, worker.draft_runner.forward = recording_prepare, counting_draft
    worker._draft = checking_draft
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only, context=True)
    widths = [width for _, width, _ in steps]
    _assert_crossed_both_ways([bs for bs, _, _ in steps], widths, w)
    # every verify step at its batch size's width, a graph of that width replayed
    assert all(width == schedule.width(bs) == graph_width for bs, width, graph_width in steps)
    # each draft forward (a narrower step's twice) computes its step's proposals' logits, in a
    # graph of that many rows a request
    assert narrowed and all(n == rows for _, n, rows in drafts)
    assert [(bs, n) for bs, n, _ in drafts if n < w - 1] == [
        (bs, schedule.width(bs) - 1) for bs in narrowed]
    assert len(drafts) == sum(width > 1 for width in widths) + len(narrowed)
    assert worker.step_stats == {"spec_verify_steps": len(steps),
                                 "spec_plain_steps": widths.count(1)}
    # each request's verify tokens are its steps' widths (under overlap, a step launched
    # before its request's finish was read is not recorded)
    verified, launched = (sum(r.spec_verify_tokens for r in reqs),
                          sum(bs * width for bs, width, _ in steps))
    assert verified == launched if not overlap else 0 < verified <= launched
    assert worker.server_info()["speculative_draft_len_schedule"] == {
        "schedule": SCHEDULE, "source": "flag", "verify_width": w}
    assert_kv_all_back(engine)
    with pytest.raises(ValueError, match=f"step widths above the full width {w}"):
        runner.capture_step_widths(lambda bs: w + 1)


def test_static_narrower_widths_run_eagerly_without_graphs(ckpts, target_only):
    """Past the captured sizes (here: no graphs at all) a narrower static step runs eagerly
    at its width, and stays exact."""
    engine = _dflash(ckpts, "static", speculative_draft_len_schedule=SCHEDULE,
                     disable_decode_cuda_graph=True)
    worker = engine.worker
    assert worker.target_runner.step_graphs is None
    widths, forward = [], worker.target_runner.forward

    def recording(fb):
        if fb.forward_mode == ForwardMode.TARGET_VERIFY:
            widths.append((fb.batch_size, fb.tokens_per_req))
        return forward(fb)

    worker.target_runner.forward = recording
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only)
    schedule = DraftLenSchedule.parse(SCHEDULE)
    assert {w for _, w in widths} == {1, 2, worker.verify_width}
    assert all(w == schedule.width(bs) for bs, w in widths)
    assert_kv_all_back(engine)


def test_static_schedule_derived_from_a_profile_captures_its_widths(ckpts, target_only,
                                                                     tmp_path):
    costs, profile = tmp_path / "costs.json", tmp_path / "profile.json"
    costs.write_text(json.dumps({"draft_ms": {"1": 1.0, "8": 2.0},
                                 "verify_ms": {"4": 4.0, "8": 4.5, "16": 5.0, "32": 20.0}}))
    profile.write_text(json.dumps({"accept_histogram": [0.2, 0.4, 0.2, 0.2]}))
    engine = _dflash(ckpts, "static", speculative_step_costs=str(costs),
                     speculative_acceptance_profile=str(profile))
    worker = engine.worker
    w, info = worker.verify_width, worker.server_info()["speculative_draft_len_schedule"]
    # at the draft graphs' sizes 1, 2, 4, 6: bs 4 verifies 16 tokens at 2 + 5 ms (2.6 tokens a
    # request) rather than 12 at the same cost; bs 6 verifies 12 (1.8 / 7 ms) rather than 24,
    # which pads to 32 tokens at 20 ms
    assert info["source"] == "derived" and info["schedule"] == "1:4,6:2"
    assert info["rederived"].startswith("never")
    assert sorted((x.step_bs, x.tokens_per_req) for x in
                  worker.target_runner.step_graphs.layouts) == [
        (1, w), (2, w), (4, w), (6, 2), (6, w)]
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only)
    assert worker.server_info()["speculative_draft_len_schedule"]["schedule"] == "1:4,6:2"
    assert_kv_all_back(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_mixed_steps_run_at_the_schedules_width(ckpts, target_only, overlap):
    """`--enable-mixed-chunk` under static verify and a schedule: a step that prefills
    arrivals verifies its batch size's width too (plain decoding at width 1), in a mixed
    graph captured at that width, and stays exact."""
    engine = _dflash(ckpts, "static", speculative_draft_len_schedule=SCHEDULE,
                     enable_mixed_chunk=True, disable_overlap_schedule=not overlap)
    worker, runner = engine.worker, engine.worker.target_runner
    schedule, w = DraftLenSchedule.parse(SCHEDULE), worker.verify_width
    mixed_graphs = runner.graph_runners[ForwardMode.MIXED]
    assert {x.tokens_per_req for x in mixed_graphs.layouts} == {1, 2, w}
    steps = record_mixed_steps(runner)
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only, context=True)
    assert engine.scheduler.stats["mixed_steps"] == len(steps) > 0
    # each mixed step at its live batch size's width, a mixed graph of that width replayed;
    # narrower ones among them
    assert all(width == schedule.width(bs) == graph for bs, width, graph in steps), steps
    assert {width for _, width, _ in steps} - {w}, steps
    assert_kv_all_back(engine)


def test_static_verify_runs_the_full_width_and_counts_mixed_steps(ckpts, target_only):
    engine = _dflash(ckpts, "static", enable_mixed_chunk=True)
    worker = engine.worker
    reqs = run_arrivals(engine)
    _assert_exact(engine, reqs, target_only)
    stats = engine.scheduler.stats
    assert stats["mixed_steps"] > 0
    assert worker.step_stats == {"spec_verify_steps": stats["decode_steps"] + stats["mixed_steps"],
                                 "spec_plain_steps": 0}
    assert worker.server_info()["speculative_draft_len_schedule"] == {
        "schedule": f"1:{worker.verify_width}", "source": "static verify: full width",
        "verify_width": worker.verify_width}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

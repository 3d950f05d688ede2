"""The draft length schedule with real CUDA graphs on the H200 (the twin of
test_dflash_worker_draft_len.py): a batch that grows to 6 and shrinks back to 1 across
`1:4,3:2,5:1`, every verify step a ragged graph replay (compact) or a replay of the graph of
its batch size's width (static; its draft's LM head over that width's proposals; its mixed
steps too), keeps every greedy request equal to target-only token for token, overlap on and
off; the derived schedule's step costs are timed with CUDA events at start-up, and its
output is exact too."""

import json
import sys

import pytest
import torch

from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.test.ci.ci_register import register_cuda_ci
from sglang_aux.test.runtime_utils import (
    ARRIVAL_SAMPLED,
    ARRIVALS,
    arrival_params,
    assert_kv_all_back,
    pair_checkpoints,
    record_graph_forwards,
    record_mixed_steps,
    run_arrivals,
)

register_cuda_ci(est_time=90, suite="default")

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
SCHEDULE = "1:4,3:2,5:1"
COMMON = dict(device="cuda", max_total_tokens=8192, max_running_requests=6,
              cuda_graph_bs_decode=[1, 2, 4, 6])


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return pair_checkpoints(tmp_path_factory.mktemp("ckpt"),
                            {"tiny-llama": "tiny-llama-dflash"})


@pytest.fixture(scope="module")
def target_only(ckpts):
    engine = Engine(model_path=ckpts["tiny-llama"], **COMMON)
    return engine.generate([p for p, _, _ in ARRIVALS],
                           [arrival_params(i) for i in range(len(ARRIVALS))])


def _dflash(ckpts, **kw) -> Engine:
    return Engine(model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
                  speculative_draft_model_path=ckpts["tiny-llama-dflash"],
                  **{"speculative_verify_mode": "compact", **COMMON, **kw})


def _assert_exact(reqs, target_only) -> None:
    for i, (req, want) in enumerate(zip(reqs, target_only, strict=True)):
        assert len(req.output_ids) == ARRIVALS[i][1]
        if i != ARRIVAL_SAMPLED:
            assert req.output_ids == want["output_ids"], i


@pytest.mark.parametrize("overlap", [False, True])
def test_schedule_crossing_thresholds_with_cuda_graphs(ckpts, target_only, overlap):
    engine = _dflash(ckpts, speculative_draft_len_schedule=SCHEDULE,
                     disable_overlap_schedule=not overlap)
    worker = engine.worker
    for runner in (worker.draft_runner, worker.target_runner):
        assert type(runner.step_graphs.backend).__name__ == "CudaGraphBackend"
    verifies, planned, plan = record_graph_forwards(worker.target_runner), [], \
        worker.verify_plan.plan

    def recording_plan(bs, every_token, confidence, width):
        planned.append((bs, width))
        return plan(bs, every_token, confidence, width)

    worker.verify_plan.plan = recording_plan
    _assert_exact(run_arrivals(engine), target_only)
    # every verify step a graph replay (fb.batch_size: a ragged step's token bucket)
    assert len(verifies) == len(planned) and all(g is not None for _, g in verifies)
    schedule = DraftLenSchedule.parse(SCHEDULE)
    assert all(width == schedule.width(bs) for bs, width in planned)
    assert {width for _, width in planned} == {1, 2, 4}
    stats = worker.step_stats
    assert 0 < stats["spec_plain_steps"] < stats["spec_verify_steps"] == len(planned)
    assert_kv_all_back(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_static_narrower_widths_with_cuda_graphs(ckpts, target_only, overlap):
    # prefills apart (mixed steps, on by default on CUDA, are the next test's): every
    # verify step is then a TARGET_VERIFY forward
    engine = _dflash(ckpts, speculative_verify_mode="static",
                     speculative_draft_len_schedule=SCHEDULE, enable_mixed_chunk=False,
                     disable_overlap_schedule=not overlap)
    worker = engine.worker
    graphs = worker.target_runner.step_graphs
    assert type(graphs.backend).__name__ == "CudaGraphBackend"
    w = worker.verify_width
    assert sorted((x.step_bs, x.tokens_per_req) for x in graphs.layouts) == [
        (1, w), (2, w), (4, 2), (4, w), (6, 1), (6, w)]
    verifies = record_graph_forwards(worker.target_runner)
    _assert_exact(run_arrivals(engine), target_only)
    # every verify step a replay of a graph of its batch size's width
    schedule = DraftLenSchedule.parse(SCHEDULE)
    assert verifies and all(g is not None for _, g in verifies)
    widths = {graphs.layouts[g].tokens_per_req for _, g in verifies}
    assert widths == {1, 2, w}
    stats = worker.step_stats
    assert 0 < stats["spec_plain_steps"] < stats["spec_verify_steps"] == len(verifies)
    assert all(graphs.layouts[g].tokens_per_req == schedule.width(bs) for bs, g in verifies)
    # the draft's graphs: its LM head over each width's proposals only, replayed
    draft = worker.draft_runner.step_graphs
    assert sorted((x.step_bs, x.logits_per_req) for x in draft.layouts) == [
        (1, w - 1), (2, w - 1), (4, 1), (4, w - 1), (6, w - 1)]
    assert_kv_all_back(engine)


@pytest.mark.parametrize("overlap", [False, True])
def test_static_mixed_steps_at_narrower_widths_with_cuda_graphs(ckpts, target_only, overlap):
    """`--enable-mixed-chunk`: a step that prefills arrivals verifies its batch size's width
    too, a mixed CUDA graph captured at that width replayed, and stays exact."""
    from sglang_aux.srt.forward_state.forward_batch_info import ForwardMode

    engine = _dflash(ckpts, speculative_verify_mode="static",
                     speculative_draft_len_schedule=SCHEDULE, enable_mixed_chunk=True,
                     disable_overlap_schedule=not overlap)
    runner, w = engine.worker.target_runner, engine.worker.verify_width
    mixed = runner.graph_runners[ForwardMode.MIXED]
    assert type(mixed.backend).__name__ == "CudaGraphBackend"
    assert {x.tokens_per_req for x in mixed.layouts} == {1, 2, w}
    steps = record_mixed_steps(runner)
    _assert_exact(run_arrivals(engine), target_only)
    schedule = DraftLenSchedule.parse(SCHEDULE)
    assert steps and all(width == schedule.width(bs) == graph for bs, width, graph in steps), steps
    assert {width for _, width, _ in steps} - {w}, steps
    # no step fell back to an eager forward (`/get_server_info` `forwards`)
    counts = runner.forward_counts
    assert counts["MIXED"]["eager"] == 0 < counts["MIXED"]["graph"], counts
    assert counts["TARGET_VERIFY"]["eager"] == 0, counts
    assert_kv_all_back(engine)


def test_derived_schedule_from_cuda_event_costs(ckpts, target_only):
    engine = _dflash(ckpts)
    planner = engine.worker.draft_len
    assert planner.costs.source.startswith("measured at start-up (cuda graph replays, "
                                           "padding rows; contexts of ")
    assert planner.costs.context > 0 and planner.costs.verify_context_ms > 0
    assert sorted(planner.costs.draft_ms) == COMMON["cuda_graph_bs_decode"]
    assert all(v > 0 for v in (*planner.costs.draft_ms.values(),
                               *planner.costs.verify_ms.values()))
    info = engine.worker.server_info()["speculative_draft_len_schedule"]
    print(f"derived on the device: {info}")
    assert info["source"] == "derived"
    assert DraftLenSchedule.parse(info["schedule"]).max_width <= engine.worker.verify_width
    _assert_exact(run_arrivals(engine), target_only)
    assert_kv_all_back(engine)



def test_static_schedule_derived_from_cuda_event_costs(ckpts, target_only, tmp_path):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"accept_histogram": [0.2, 0.4, 0.2, 0.2]}))
    engine = _dflash(ckpts, speculative_verify_mode="static",
                     speculative_acceptance_profile=str(profile))
    worker = engine.worker
    info = worker.server_info()["speculative_draft_len_schedule"]
    print(f"static, derived on the device: {info}")
    assert info["source"] == "derived" and info["rederived"].startswith("never")
    # its draft timed at one proposal a request too, at every captured size
    costs = worker.draft_len.costs
    assert sorted(costs.draft_one_ms) == COMMON["cuda_graph_bs_decode"]
    assert all(v > 0 for v in costs.draft_one_ms.values())
    schedule, w = DraftLenSchedule.parse(info["schedule"]), worker.verify_width
    graphs = worker.target_runner.step_graphs
    have = {(x.step_bs, x.tokens_per_req) for x in graphs.layouts}
    # the full width everywhere, and every captured size's schedule widths
    sizes = COMMON["cuda_graph_bs_decode"]
    assert {(bs, w) for bs in sizes} <= have
    low = 0
    for size in sizes:
        assert {(size, schedule.width(bs)) for bs in range(low + 1, size + 1)} <= have
        low = size
    verifies = record_graph_forwards(worker.target_runner)
    _assert_exact(run_arrivals(engine), target_only)
    assert verifies and all(g is not None and graphs.layouts[g].tokens_per_req ==
                            schedule.width(bs) for bs, g in verifies)
    assert_kv_all_back(engine)

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v", "-s"]))

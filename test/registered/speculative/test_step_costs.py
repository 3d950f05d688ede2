"""Step costs (configs/step_costs.py, speculative/step_cost_probe.py): a step pads to the
smallest measured size holding it and grows in proportion past the largest; the file
round-trips, bare or as a bench report's field; the start-up probe times the draft graph at
every captured batch size and the ragged verify graph at every token bucket, and leaves the
engine's greedy output exact."""

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


def test_file_round_trips_bare_and_inside_a_bench_report(tmp_path):
    costs = StepCosts({1: 1.5, 2: 2.5}, {2: 3.0, 8: 4.0}, source="probe")
    bare, report = tmp_path / "bare.json", tmp_path / "report.json"
    bare.write_text(json.dumps(costs.to_json()))
    report.write_text(json.dumps({"rows": [], "step_costs": costs.to_json()}))
    for path in (bare, report):
        loaded = StepCosts.load(str(path))
        assert loaded == costs and loaded.source == f"{path} (probe)"


def test_probe_times_every_captured_graph(tmp_path):
    ckpts = pair_checkpoints(tmp_path, {"tiny-llama": "tiny-llama-dflash"})
    kw = dict(SPEC_ENGINE_KW, model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
              speculative_draft_model_path=ckpts["tiny-llama-dflash"])
    engine = Engine(speculative_verify_mode="compact", **kw)
    worker = engine.worker
    draft, verify = worker.draft_runner.step_graphs, worker.target_runner.step_graphs
    costs = measure_step_costs(draft, verify, replays=2)
    assert sorted(costs.draft_ms) == CAPTURED_BS
    assert sorted(costs.verify_ms) == [x.num_tokens for x in verify.layouts]
    assert all(v > 0 for v in (*costs.draft_ms.values(), *costs.verify_ms.values()))
    # the server measured its own at start-up (no file given)
    assert worker.draft_len.costs.source.startswith("measured at start-up")
    want = Engine(**SPEC_ENGINE_KW, model_path=ckpts["tiny-llama"]).generate(SPEC_PROMPTS,
                                                                           STAGGERED)
    got = engine.generate(SPEC_PROMPTS, STAGGERED)
    assert [o["output_ids"] for o in got] == [o["output_ids"] for o in want]
    with pytest.raises(ValueError, match="ragged graphs"):
        static = Engine(speculative_verify_mode="static", **kw).worker
        measure_step_costs(static.draft_runner.step_graphs, static.target_runner.step_graphs)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

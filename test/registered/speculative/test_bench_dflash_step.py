"""The DFlash step-cost benchmark (benchmark/spec_decode/bench_dflash_step.py) in its CPU smoke
mode (tiny-llama and its block-4 draft, the overlap scheduler on, as on CUDA): the worker
accepts exactly what the bench forces, the timed steps' histogram is the profile's, static and
compact verify both run, the report carries the compact engine's step costs in the format
`--speculative-step-costs` reads, and a bad acceptance profile or flag fails in one line before
any model loads."""

import json
import math
import sys
from pathlib import Path

import pytest

from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=20, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_dflash_step.py"
SMOKE_PROBS = [0.4, 0.3, 0.2, 0.1]  # profiles/tiny-llama-dflash-b4_synthetic.json
WIDTH = len(SMOKE_PROBS)


def _bench():
    return load_bench(SCRIPT)


def _rounded_counts(n: int) -> list[int]:
    """The profile times n, rounded to counts that sum to n (largest remainders)."""
    exact = [p * n for p in SMOKE_PROBS]
    counts = [int(x) for x in exact]
    for a in sorted(range(WIDTH), key=lambda a: counts[a] - exact[a])[: n - sum(counts)]:
        counts[a] += 1
    return counts


def test_smoke_forces_the_profile_static_and_compact(tmp_path, capsys):
    out = tmp_path / "step.json"
    report = _bench().main(["--smoke", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == report["rows"]
    assert "tok/step" in capsys.readouterr().out
    rows = {(r["mode"], r["bs"]): r for r in report["rows"]}
    assert set(rows) == {(m, bs) for m in ("static", "compact") for bs in (1, 4)}
    assert report["profile"]["tokens_per_step"] == pytest.approx(2.0)
    for (mode, bs), r in rows.items():
        n = r["steps"] * bs
        # what the worker recorded accepting is what the bench forced, step for step
        assert r["accept_histogram"] == r["forced_histogram"]
        assert sum(r["accept_histogram"]) == n
        emitted = sum((a + 1) * c for a, c in enumerate(r["accept_histogram"]))
        assert r["tokens_per_step"] == pytest.approx(emitted / n)
        assert r["ratio"] == pytest.approx(r["tokens_per_step"] * r["target_step_ms"]
                                           / r["step_ms"])
        assert r["dflash_tok_s"] > 0 and r["target_tok_s"] > 0
        if mode == "static":
            assert r["accept_histogram"] == _rounded_counts(n)
            assert abs(r["tokens_per_step"] - 2.0) < (WIDTH - 1) / n
            assert r["verify_tokens_per_accepted"] == pytest.approx(WIDTH / r["tokens_per_step"])
        else:  # the same draws, cut at each request's verified proposals; half the budget
            static = rows["static", bs]
            assert r["tokens_per_step"] <= static["tokens_per_step"]
            assert r["verify_tokens_per_accepted"] < static["verify_tokens_per_accepted"]
            # the schedule's cost of this step, from the costs the report carries
            doc = report["step_costs"]
            costs = StepCosts(**{k: {int(x): v for x, v in doc[k].items()}
                                 for k in ("draft_ms", "verify_ms")},
                              **{k: doc[k] for k in ("context", "draft_context_ms",
                                                     "verify_context_ms")})
            # the probe's requests held the bench's context (the KV pool holds it)
            assert costs.context == 24
            verified = math.ceil(round(r["verify_tokens_per_accepted"] * emitted / r["steps"], 6))
            assert r["predicted_step_ms"] == pytest.approx(
                costs.draft(bs) + costs.verify(verified) + costs.context_cost(bs, drafted=True))
            assert r["step_ms_over_predicted"] == pytest.approx(r["step_ms"]
                                                                / r["predicted_step_ms"])
    assert [t["bs"] for t in report["target_only"]] == [1, 4]
    # the compact engine's step costs, in the file the server's --speculative-step-costs reads
    costs = StepCosts.load(str(out))
    assert sorted(costs.draft_ms) == [1, 2, 3, 4] and costs.verify_ms
    assert DraftLenSchedule.parse(report["draft_len_schedule"]).max_width <= WIDTH


def test_oracle_confidence_verifies_only_accepted_tokens(tmp_path):
    report = _bench().main(["--smoke", "--verify-modes", "compact", "--compact-confidence",
                            "oracle", "--out", str(tmp_path / "step.json")])
    for r in report["rows"]:
        assert r["accept_histogram"] == r["forced_histogram"]
        assert r["verify_tokens_per_accepted"] == 1.0


def test_narrower_widths_force_the_truncated_profile(tmp_path):
    """`--widths`: each static engine verifies that many tokens a request, and the profile's
    acceptances past its last proposal count as its last."""
    report = _bench().main(["--smoke", "--verify-modes", "static", "--widths", "2", "4",
                            "--out", str(tmp_path / "step.json")])
    rows = {(r["width"], r["bs"]): r for r in report["rows"]}
    assert set(rows) == {(w, bs) for w in (2, 4) for bs in (1, 4)}
    truncated = {2: [0.4, 0.6], 4: SMOKE_PROBS}
    for (width, bs), r in rows.items():
        n = r["steps"] * bs
        assert r["accept_histogram"] == r["forced_histogram"]
        assert len(r["accept_histogram"]) == width and sum(r["accept_histogram"]) == n
        expected = 1 + sum(a * p for a, p in enumerate(truncated[width]))
        assert abs(r["tokens_per_step"] - expected) < (width - 1) / n
        assert r["verify_tokens_per_accepted"] == pytest.approx(width / r["tokens_per_step"])
    assert rows[2, 1]["tokens_per_step"] < rows[4, 1]["tokens_per_step"]
    for bs in (1, 4):  # the report names the better width of each batch size
        width, ratio = max(((w, rows[w, bs]["ratio"]) for w in (2, 4)), key=lambda x: x[1])
        assert report["best_width"]["static"][bs] == (width, ratio)


def test_derived_static_schedule_runs_each_batch_size_at_its_width(tmp_path):
    """`--schedule derived`: the static engine derives its schedule from the profile and the
    given step costs (bs 1: E(w) = 1, 1.6, 1.9, 2.0 over 2, 3, 3, 3 ms: width 4; bs 4:
    1.6 / 3.1 ms beats 1.9 / 11 and plain's 1 / 2: width 2), so its bs-4 row verifies two
    tokens a request and accepts the profile cut there."""
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"draft_ms": {"1": 1.0, "4": 1.0},
                                 "verify_ms": {"4": 2.0, "8": 2.1, "16": 10.0}}))
    report = _bench().main(["--smoke", "--verify-modes", "static", "--schedule", "derived",
                            "--step-costs", str(costs), "--out", str(tmp_path / "step.json")])
    server = report["server_schedule"][f"static width {WIDTH}"]
    assert server["schedule"] == "1:4,3:2" and server["source"] == "derived"
    assert server["costs"]["draft_ms"] == {"1": 1.0, "4": 1.0}  # what it derived from
    rows = {r["bs"]: r for r in report["rows"]}
    assert rows[1]["width"] == WIDTH and rows[4]["width"] == 2
    for bs, truncated in ((1, SMOKE_PROBS), (4, [0.4, 0.6])):
        r, n = rows[bs], rows[bs]["steps"] * bs
        assert r["accept_histogram"] == r["forced_histogram"]
        assert sum(r["accept_histogram"][r["width"]:]) == 0
        expected = 1 + sum(a * p for a, p in enumerate(truncated))
        assert r["profile_tokens_per_step"] == pytest.approx(expected)
        assert abs(r["tokens_per_step"] - expected) < (r["width"] - 1) / n
        assert r["verify_tokens_per_accepted"] == pytest.approx(r["width"]
                                                                / r["tokens_per_step"])


@pytest.mark.parametrize("widths, says", [(["1"], "a verify width of 1 is target-only"),
                                          (["5"], "width 5 is not within 1..4")])
def test_width_out_of_range_is_one_line_before_any_model(widths, says):
    with pytest.raises(SystemExit) as e:
        _bench().main(["--smoke", "--target", "no-such-model", "--widths", *widths])
    assert "\n" not in str(e.value) and says in str(e.value)


@pytest.mark.parametrize("text, says", [
    ("{not json", "not a JSON object"),
    ('{"accept_histogram": [0.5, 0.5]}', "must be 4 finite non-negative numbers"),
    ('{"accept_histogram": [0.5, -0.1, 0.3, 0.3]}', "must be 4 finite non-negative numbers"),
    ('{"accept_histogram": [0, 0, 0, 0]}', "not all 0"),
    ('{"histogram": [1, 1, 1, 1]}', "not a JSON object with 'accept_histogram'"),
    ('{"accept_histogram": [1, 1, 1, 1], "verify_width": 16}', "made for verify width 16"),
])
def test_bad_profile_is_one_line_before_any_model(tmp_path, text, says):
    path = tmp_path / "profile.json"
    path.write_text(text)
    # a target that does not exist: the profile's error comes first
    with pytest.raises(SystemExit) as e:
        _bench().main(["--smoke", "--target", "no-such-model", "--profile", str(path)])
    message = str(e.value)
    assert "\n" not in message and str(path) in message and says in message


def test_flag_out_of_range_is_one_line_before_any_model():
    with pytest.raises(SystemExit) as e:
        _bench().main(["--smoke", "--target", "no-such-model",
                       "--compact-verify-budget-frac", "1.5"])
    assert str(e.value) == ("bench_dflash_step: --compact-verify-budget-frac must be in "
                            "[0, 1], got 1.5")



@pytest.mark.parametrize("argv, says", [
    (["--schedule", "derived", "--widths", "2"], "--schedule derived runs each batch size"),
    (["--step-costs", "costs.json"], "--step-costs acts with --schedule derived"),
])
def test_schedule_flags_that_do_not_go_together(argv, says, capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--smoke", "--target", "no-such-model", *argv])
    err = capsys.readouterr().err
    assert says in err and err.count("error:") == 1

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

"""The served-traffic benchmark (benchmark/spec_decode/bench_dflash_served.py) in its CPU smoke
mode (tiny-llama and its block-4 draft, the overlap scheduler on, as on CUDA): the closed loop
holds its concurrency, plain configurations prefill in steps of their own and mixed ones ride
arrivals in the running batch's step, the window's tokens are the scheduler's, DFlash accepts
exactly what the bench forced (through verify and mixed steps, with and without overlap), the
ratios are the tok/s quotients, and bad flags fail in one line before any model loads."""

import json
import sys
from pathlib import Path

import pytest

from sglang_aux.test.bench_script import load_bench
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmark/spec_decode/bench_dflash_served.py"
CONFIGS = ("target", "target_mixed", "dflash", "dflash_mixed")
BATCH_SIZES = (1, 4)  # the smoke's
WIDTH = 4  # the smoke draft's block size


def _bench():
    return load_bench(SCRIPT)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("served") / "served.json"
    report = _bench().main(["--smoke", "--out", str(out)])
    return report, out


def test_every_config_and_concurrency_is_reported(smoke, capsys):
    report, out = smoke
    assert json.loads(out.read_text())["rows"] == report["rows"]
    rows = {(r["config"], r["bs"]): r for r in report["rows"]}
    assert set(rows) == {(c, bs) for c in CONFIGS for bs in BATCH_SIZES}
    assert set(report["server_schedule"]) == {"dflash", "dflash_mixed"}


def test_the_closed_loop_holds_its_concurrency(smoke):
    for r in smoke[0]["rows"]:
        # each finished request was replaced by one new one, and the first wave turned over
        assert r["requests_started"] == r["bs"] + r["requests_finished"]
        assert r["requests_finished"] > r["bs"] and r["finished_in_window"] > 0
        stats = r["stats"]
        # every timed step launched one forward: a prefill, a decode / verify or a mixed one
        assert stats["prefill_steps"] + stats["decode_steps"] + stats["mixed_steps"] \
            == r["steps"]
        # and the forwards each runner ran in the window, by mode, graph or eager
        def forwards(runner: str, mode: str, counts: dict = r["forwards"]) -> int:
            return sum(n for k, n in counts.items() if k.startswith(f"{runner} {mode} "))

        step = "TARGET_VERIFY" if r["config"].startswith("dflash") else "DECODE"
        assert forwards("target", step) == stats["decode_steps"]
        assert forwards("target", "MIXED") == stats["mixed_steps"]
        assert forwards("target", "EXTEND") == stats["prefill_steps"]
        if step == "TARGET_VERIFY":
            assert forwards("draft", "DRAFT_BLOCK") == (stats["decode_steps"]
                                                        + stats["mixed_steps"]
                                                        - stats["spec_plain_steps"])


def test_plain_configs_prefill_apart_and_mixed_ones_ride_the_step(smoke):
    rows = {(r["config"], r["bs"]): r for r in smoke[0]["rows"]}
    for (config, bs), r in rows.items():
        stats = r["stats"]
        if config.endswith("_mixed") and bs > 1:
            assert stats["mixed_steps"] > 0 and stats["mixed_requests"] > 0
        else:
            assert stats["mixed_steps"] == 0 and stats["prefill_steps"] > 0
            assert stats["prefill_interruptions"] <= stats["prefill_steps"]
    for config in ("target", "dflash"):
        # one request: its replacement finds no running batch to ride, so mixed steps change
        # nothing
        plain, mixed = rows[config, 1], rows[f"{config}_mixed", 1]
        for key in ("prefill_steps", "decode_steps", "generated_tokens"):
            assert plain["stats"][key] == mixed["stats"][key]


def test_the_window_counts_the_schedulers_tokens(smoke):
    for r in smoke[0]["rows"]:
        stats = r["stats"]
        # the requests' output growth over the window (finished and new ones included) is
        # what the scheduler appended
        assert r["emitted"] == stats["generated_tokens"] > 0
        assert r["tok_s"] == pytest.approx(r["emitted"] / (r["steps"] * r["step_ms"]) * 1e3)
        assert r["tokens_per_request_step"] == pytest.approx(
            r["emitted"] / stats["decode_batch_requests"])


def test_dflash_accepts_what_was_forced(smoke):
    for r in smoke[0]["rows"]:
        if not r["config"].startswith("dflash"):
            assert "accept_histogram" not in r
            continue
        assert r["verify_width"] == WIDTH and r["stats"]["spec_plain_steps"] == 0
        assert r["accept_histogram"] == r["forced_histogram"]
        assert len(r["accept_histogram"]) == WIDTH and sum(r["accept_histogram"][1:]) > 0


def test_ratios_are_the_tok_s_quotients(smoke):
    report = smoke[0]
    tok = {(r["config"], r["bs"]): r["tok_s"] for r in report["rows"]}
    assert [x["bs"] for x in report["ratios"]] == list(BATCH_SIZES)
    for x in report["ratios"]:
        bs = x["bs"]
        assert x["dflash/target"] == pytest.approx(tok["dflash", bs] / tok["target", bs])
        assert x["dflash_mixed/target_mixed"] == pytest.approx(
            tok["dflash_mixed", bs] / tok["target_mixed", bs])
        assert x["best_dflash/best_target"] == pytest.approx(
            max(tok["dflash", bs], tok["dflash_mixed", bs])
            / max(tok["target", bs], tok["target_mixed", bs]))


def test_forcing_without_overlap(tmp_path):
    """Without overlap a step's rows are read in the step that launched them, and a finished
    request runs no extra row."""
    report = _bench().main(["--smoke", "--overlap-schedule", "off", "--configs", "dflash_mixed",
                            "--bs", "4", "--out", str(tmp_path / "served.json")])
    [row] = report["rows"]
    assert row["accept_histogram"] == row["forced_histogram"]
    assert row["stats"]["mixed_steps"] > 0
    assert report["ratios"] == [{"bs": 4}]  # nothing to divide by


def test_delayed_mixed_configs_gather_arrivals(tmp_path):
    """`_mixed_delay` with rows to spare: the prefill delayer holds arrivals back, so its
    mixed steps pass over waiting requests and carry more than one arrival on average; its
    ratio is reported."""
    report = _bench().main(["--smoke", "--configs", "target_mixed_delay", "dflash_mixed_delay",
                            "--bs", "8", "--max-running-requests", "16",
                            "--out", str(tmp_path / "served.json")])
    for row in report["rows"]:
        stats = row["stats"]
        assert stats["prefill_steps"] == 0 < stats["prefill_delayed_passes"], row["config"]
        assert stats["mixed_requests"] > stats["mixed_steps"] > 0, row["config"]
    tok = {r["config"]: r["tok_s"] for r in report["rows"]}
    [x] = report["ratios"]
    assert x["dflash_mixed_delay/target_mixed_delay"] == pytest.approx(
        tok["dflash_mixed_delay"] / tok["target_mixed_delay"])
    assert x["best_dflash/best_target"] == x["dflash_mixed_delay/target_mixed_delay"]


def test_mixed_token_counts_reach_the_mixed_engines(tmp_path):
    """`--mixed-tokens` below the arrivals' 8 new tokens: no mixed graph holds an arrival,
    so a mixed configuration prefills every arrival in a step of its own."""
    report = _bench().main(["--smoke", "--configs", "target_mixed", "--bs", "4",
                            "--mixed-tokens", "4", "--out", str(tmp_path / "served.json")])
    [row] = report["rows"]
    assert row["stats"]["mixed_steps"] == 0 < row["stats"]["prefill_steps"]


def test_a_cut_run_keeps_the_configurations_it_finished(tmp_path, monkeypatch):
    """The report is written after each configuration: a run its time limit kills keeps
    the rows of those it finished."""
    bench = _bench()
    measure = bench.measure_config

    def cut(args, config, profile):
        if config == "dflash":
            raise KeyboardInterrupt  # what the limit's kill leaves
        return measure(args, config, profile)

    monkeypatch.setattr(bench, "measure_config", cut)
    out = tmp_path / "served.json"
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--smoke", "--configs", "target", "dflash", "--bs", "1",
                    "--out", str(out)])
    assert [r["config"] for r in json.loads(out.read_text())["rows"]] == ["target"]


@pytest.mark.parametrize("argv, says", [
    (["--new-prompt-tokens", "24"], "--new-prompt-tokens must be in [0, --context 24)"),
    (["--output-tokens", "0"], "--output-tokens must be >= 1"),
    (["--max-running-requests", "2"], "--max-running-requests must be >= the largest --bs"),
    (["--configs", "target", "eagle"], "--configs: invalid choice: 'eagle'"),
])
def test_bad_flag_is_one_line_before_any_model(argv, says, capsys):
    with pytest.raises(SystemExit):
        _bench().main(["--smoke", "--target", "no-such-model", *argv])
    err = capsys.readouterr().err
    assert says in err and err.count("error:") == 1


def test_bad_profile_is_one_line_before_any_model(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text('{"accept_histogram": [0.5, 0.5]}')
    with pytest.raises(SystemExit) as e:
        _bench().main(["--smoke", "--target", "no-such-model", "--profile", str(path)])
    message = str(e.value)
    assert message.startswith("bench_dflash_served: ") and "\n" not in message
    assert str(path) in message and "must be 4 finite non-negative numbers" in message


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))

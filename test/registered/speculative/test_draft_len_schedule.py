"""`--speculative-draft-len-schedule` (configs/draft_len_schedule.py): parsing, the width at
every batch size, merging a derived schedule's steps, and the refusals, each one line naming
the flag and its value: bad syntax, unsorted or duplicate batch sizes, out-of-range widths
(in ServerArgs; against the draft's verify width when the worker reads the draft's config,
before any model loads); the derivation's files that do not parse."""

import json
import sys

import pytest

from sglang_aux.srt.configs.draft_len_schedule import DraftLenSchedule
from sglang_aux.srt.entrypoints.engine import Engine
from sglang_aux.srt.model_executor import model_runner
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import pair_checkpoints

register_cpu_ci(est_time=10, suite="default")

FLAG = "--speculative-draft-len-schedule"


def test_width_holds_from_each_batch_size_up():
    s = DraftLenSchedule.parse("1:16,8:8,32:4,64:1")
    assert [s.width(bs) for bs in (1, 7, 8, 31, 32, 63, 64, 1000)] == [16, 16, 8, 8, 4, 4, 1, 1]
    assert str(s) == "1:16,8:8,32:4,64:1" and s.max_width == 16
    assert DraftLenSchedule.parse(" 1 : 4 ") == DraftLenSchedule.uniform(4)


def test_of_widths_merges_equal_neighbours():
    s = DraftLenSchedule.of_widths({4: 4, 1: 4, 2: 4, 8: 2, 16: 2, 32: 1})
    assert str(s) == "1:4,8:2,32:1"
    assert str(DraftLenSchedule.of_widths({1: 3})) == "1:3"


@pytest.mark.parametrize("text, says", [
    ("", "expected BS:WIDTH pairs"),
    ("1:16,8", "expected BS:WIDTH pairs"),
    ("1:16;8:8", "expected BS:WIDTH pairs"),
    ("1:a", "expected BS:WIDTH pairs"),
    ("1:2:3", "expected BS:WIDTH pairs"),
    ("2:16,8:8", "the first batch size must be 1"),
    ("1:16,8:8,4:4", "ascending without duplicates"),
    ("1:16,8:8,8:4", "ascending without duplicates"),
    ("1:16,8:0", "widths must be >= 1"),
    ("1:-2", "widths must be >= 1"),
])
def test_bad_schedule_is_one_line_naming_flag_and_value(text, says):
    with pytest.raises(ValueError) as e:
        ServerArgs(model_path="tiny-llama", speculative_algorithm="DFLASH",
                   speculative_draft_model_path="tiny-llama-dflash",
                   speculative_draft_len_schedule=text)
    message = str(e.value)
    assert "\n" not in message and message.startswith(FLAG) and says in message


@pytest.mark.parametrize("mode", ["static", "compact"])
def test_width_past_the_verify_width_refused_when_known(mode):
    common = dict(model_path="tiny-llama", speculative_algorithm="DFLASH",
                  speculative_draft_model_path="tiny-llama-dflash", speculative_verify_width=4)
    with pytest.raises(ValueError, match=f"^{FLAG} 1:8,4:2: width 8 exceeds the draft's verify "
                                         "width 4$"):
        ServerArgs(**common, speculative_verify_mode=mode,
                   speculative_draft_len_schedule="1:8,4:2")
    # narrower widths: static verify captures graphs at them, compact's ragged graphs take them
    ServerArgs(**common, speculative_verify_mode=mode, speculative_draft_len_schedule="1:4,4:2")
    with pytest.raises(ValueError, match=f"{FLAG} only act with --speculative-algorithm"):
        ServerArgs(model_path="tiny-llama", speculative_draft_len_schedule="1:4")


def test_static_verify_takes_step_costs_only_with_a_profile(tmp_path):
    costs, profile = tmp_path / "costs.json", tmp_path / "profile.json"
    costs.write_text('{"draft_ms": {"1": 1}, "verify_ms": {"4": 2}}')
    profile.write_text('{"accept_histogram": [1, 1, 1, 1]}')
    common = dict(model_path="tiny-llama", speculative_algorithm="DFLASH",
                  speculative_draft_model_path="tiny-llama-dflash",
                  speculative_verify_mode="static")
    with pytest.raises(ValueError, match="^--speculative-step-costs under static verify needs "
                                         "an acceptance profile"):
        ServerArgs(**common, speculative_step_costs=str(costs),
                   speculative_acceptance_profile="none")
    # given no profile flag, the draft's own may serve: the planner decides, knowing the draft
    ServerArgs(**common, speculative_step_costs=str(costs))
    ServerArgs(**common, speculative_acceptance_profile=str(profile))
    ServerArgs(**common, speculative_acceptance_profile=str(profile),
               speculative_step_costs=str(costs))


@pytest.mark.parametrize("flag, text, says", [
    ("speculative_acceptance_profile", "{oops", "acceptance profile"),
    ("speculative_acceptance_profile", '{"accept_histogram": [0, 0]}', "not all 0"),
    ("speculative_step_costs", "[1, 2]", "not a JSON object with 'draft_ms'"),
    ("speculative_step_costs", '{"draft_ms": {"1": 1}, "verify_ms": {"4": -1}}',
     "'verify_ms' must map sizes >= 1 to finite positive"),
    ("speculative_step_costs", '{"draft_ms": {"x": 1}, "verify_ms": {"4": 1}}',
     "not a JSON object with 'draft_ms'"),
])
def test_derivation_file_that_does_not_parse_is_one_line(tmp_path, flag, text, says):
    path = tmp_path / "file.json"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        ServerArgs(model_path="tiny-llama", speculative_algorithm="DFLASH",
                   speculative_draft_model_path="tiny-llama-dflash",
                   speculative_verify_mode="compact", **{flag: str(path)})
    message = str(e.value)
    assert "\n" not in message and str(path) in message and says in message


@pytest.fixture
def no_model_load(monkeypatch):
    """A model load fails the test: the refusals must come before it."""
    def refuse(*_a, **_k):
        raise AssertionError("a model loaded before the refusal")

    monkeypatch.setattr(model_runner, "get_model", refuse)


@pytest.mark.parametrize("kw, says", [
    (dict(speculative_verify_mode="compact", speculative_draft_len_schedule="1:4,2:5"),
     f"{FLAG} 1:4,2:5: width 5 exceeds the draft's verify width 4"),
    (dict(speculative_draft_len_schedule="1:4,2:5"),
     f"{FLAG} 1:4,2:5: width 5 exceeds the draft's verify width 4"),
    (dict(speculative_verify_mode="compact", speculative_acceptance_profile="PROFILE"),
     "made for verify width 16, the draft verifies 4"),
    (dict(speculative_acceptance_profile="draft"),
     "--speculative-acceptance-profile draft: the draft "),
    (dict(speculative_step_costs="COSTS"),
     "--speculative-step-costs under static verify needs an acceptance profile"),
])
def test_refusals_against_the_draft_come_before_any_model_loads(tmp_path, no_model_load, kw,
                                                                says):
    ckpts = pair_checkpoints(tmp_path, {"tiny-llama": "tiny-llama-dflash"})
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"verify_width": 16, "accept_histogram": [1] * 16}))
    if kw.get("speculative_acceptance_profile") == "PROFILE":
        kw = dict(kw, speculative_acceptance_profile=str(profile))
    if kw.get("speculative_step_costs") == "COSTS":  # the draft has no profile of its own
        costs = tmp_path / "costs.json"
        costs.write_text('{"draft_ms": {"1": 1}, "verify_ms": {"4": 2}}')
        kw = dict(kw, speculative_step_costs=str(costs))
    with pytest.raises(ValueError) as e:
        Engine(model_path=ckpts["tiny-llama"], speculative_algorithm="DFLASH",
               speculative_draft_model_path=ckpts["tiny-llama-dflash"], device="cpu", **kw)
    assert "\n" not in str(e.value) and says in str(e.value)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

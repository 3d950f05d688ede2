"""The derived draft length schedule (speculative/draft_len_planner.py) on hand-computed cases:
expected tokens per step, a width that pays at bs 1 and plain decoding at bs 8, ties to the
smaller width, compact verify's budget capping what a width verifies; the planner's sources
(flag, static, derived from files, no costs) and its re-derivation from the running counts,
logged in one line."""

import json
import logging
import sys

import pytest

from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.server_args import ServerArgs
from sglang_aux.srt.speculative import draft_len_planner
from sglang_aux.srt.speculative.draft_len_planner import (
    DraftLenPlanner,
    derive_widths,
    expected_tokens,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")


def all_proposals(bs: int) -> int:
    return 3 * bs  # W = 4: no budget below the width's


def test_expected_tokens_whole_and_between_widths():
    rates = [0.5, 0.5, 0.5]
    assert [expected_tokens(rates, w) for w in (1, 2, 3, 4)] == [1.0, 1.5, 1.75, 1.875]
    assert expected_tokens(rates, 2.5) == pytest.approx(1.625)
    assert expected_tokens([0.8, 0.5, 0.5], 4) == pytest.approx(2.4)


def test_speculation_pays_at_bs_1_and_plain_decoding_wins_at_bs_8():
    # E(w) = 1, 1.8, 2.2, 2.4. bs 1: w=1 1/4 = 0.25, w=2 1.8/(1+4) = 0.36, w=3 2.2/(1+4)
    # = 0.44, w=4 2.4/(1+4.5) = 0.436. bs 8: w=1 1/5 = 0.2, w=2 1.8/(2+8) = 0.18, w=3
    # 2.2/(2+12) = 0.157, w=4 2.4/(2+16) = 0.133.
    costs = StepCosts({1: 1.0, 8: 2.0},
                      {1: 4.0, 2: 4.0, 3: 4.0, 4: 4.5, 8: 5.0, 16: 8.0, 24: 12.0, 32: 16.0})
    assert derive_widths([1, 8], costs, [0.8, 0.5, 0.5], all_proposals) == {1: 3, 8: 1}


def test_a_tie_goes_to_the_smaller_width():
    # w=1: 1/2 = 0.5; w=2: 1.5/(1+2) = 0.5
    costs = StepCosts({1: 1.0}, {1: 2.0, 2: 2.0})
    assert derive_widths([1], costs, [0.5], lambda bs: bs) == {1: 1}
    cheaper_draft = StepCosts({1: 0.99}, {1: 2.0, 2: 2.0})
    assert derive_widths([1], cheaper_draft, [0.5], lambda bs: bs) == {1: 2}


def test_a_draft_of_fewer_proposals_makes_a_narrower_width_pay():
    """Static verify's narrower steps draft only their proposals. Rates 0.8, 0.5, 0.5: E(w)
    = 1, 1.8, 2.2, 2.4; verify 4 ms at any width. A block's draft costs 4 ms: w=4 2.4/8 =
    0.3 beats w=2 1.8/8 = 0.225; at one proposal 1 ms (w=2: 1.8/5 = 0.36; w=3: 2.5 ms,
    2.2/6.5 = 0.338; w=4: 0.3; w=1: 1/4 = 0.25) the narrowest draft wins."""
    costs = StepCosts({1: 4.0}, {1: 4.0, 2: 4.0, 3: 4.0, 4: 4.0}, draft_one_ms={1: 1.0},
                      draft_proposals=3)
    rates = [0.8, 0.5, 0.5]
    assert derive_widths([1], costs, rates, all_proposals) == {1: 4}
    assert derive_widths([1], costs, rates, all_proposals, narrow_draft=True) == {1: 2}


def test_the_contexts_share_can_make_speculation_pay():
    """The contexts' attention costs every width alike per request, so it narrows what a
    cheaper plain step saves: 1 / 4 beats 1.6 / 7 over padding rows, but with 0.5 ms of
    context a request 1.6 / 11 beats 1 / 8."""
    padding = StepCosts({8: 2.0}, {8: 4.0, 16: 5.0})
    assert derive_widths([8], padding, [0.6], lambda bs: bs) == {8: 1}
    real = StepCosts({8: 2.0}, {8: 4.0, 16: 5.0}, context=1024, verify_context_ms=0.5)
    assert derive_widths([8], real, [0.6], lambda bs: bs) == {8: 2}
    # the draft's own context counts only where the draft runs
    drafted = StepCosts({8: 2.0}, {8: 4.0, 16: 5.0}, context=1024, verify_context_ms=0.5,
                        draft_context_ms=0.5)
    assert derive_widths([8], drafted, [0.6], lambda bs: bs) == {8: 1}


def test_the_budget_caps_what_a_width_verifies():
    # every proposal accepted: E(t) = t. bs 2, budget 3 proposals: w=2 verifies t=2 (2/2 = 1,
    # a tie with plain's 1/1), w=3 and w=4 both t = 1 + 3/2 = 2.5 (2.5/2 = 1.25): w=3.
    costs = StepCosts({2: 1.0}, {2: 1.0, 4: 1.0, 5: 1.0, 8: 1.0})
    assert derive_widths([2], costs, [1.0] * 3, lambda bs: 3) == {2: 3}
    # without the cap, w=4 verifies 4 tokens each: 4/2 = 2
    assert derive_widths([2], costs, [1.0] * 3, all_proposals) == {2: 4}


def _args(**kw) -> ServerArgs:
    return ServerArgs(model_path="tiny-llama", speculative_algorithm="DFLASH",
                      speculative_draft_model_path="tiny-llama-dflash", **kw)


def _no_measure():
    raise AssertionError("measured although the schedule does not need it")


def test_flag_and_static_schedules_are_not_derived():
    flag = DraftLenPlanner(_args(speculative_verify_mode="compact",
                                 speculative_draft_len_schedule="1:4,3:2,5:1"), 4, compact=True)
    flag.start([1, 2, 4], all_proposals, _no_measure)
    assert [flag.width(bs) for bs in range(1, 7)] == [4, 4, 2, 2, 1, 1]
    assert flag.info() == {"schedule": "1:4,3:2,5:1", "source": "flag", "verify_width": 4}
    static = DraftLenPlanner(_args(), 4, compact=False)
    static.start([1, 2, 4], all_proposals, _no_measure)
    assert static.info() == {"schedule": "1:4", "source": "static verify: full width",
                             "verify_width": 4}


def test_no_graphs_to_time_keeps_the_full_width():
    planner = DraftLenPlanner(_args(speculative_verify_mode="compact"), 4, compact=True)
    planner.start([], all_proposals, lambda: None)
    assert planner.width(64) == 4 and planner.info()["source"].startswith("no step costs")


def test_derived_from_files_then_from_the_servers_counts(tmp_path, caplog, monkeypatch):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"step_costs": {
        "draft_ms": {"1": 1.0, "8": 2.0},
        "verify_ms": {"1": 4.0, "2": 4.0, "3": 4.0, "4": 4.5, "8": 5.0, "16": 8.0, "24": 16.0,
                      "32": 20.0}, "source": "hand-made"}}))
    profile = tmp_path / "profile.json"
    # P(accepted = a) = 0.2, 0.4, 0.2, 0.2: conditional rates 0.8, 0.5, 0.5
    profile.write_text(json.dumps({"accept_histogram": [0.2, 0.4, 0.2, 0.2]}))
    planner = DraftLenPlanner(_args(speculative_verify_mode="compact",
                                    compact_verify_budget_frac=1.0,
                                    speculative_step_costs=str(costs),
                                    speculative_acceptance_profile=str(profile)), 4, compact=True)
    caplog.set_level(logging.INFO, logger=draft_len_planner.__name__)
    planner.start([1, 8], planner_budget := all_proposals, _no_measure)
    assert planner.budget is planner_budget
    info = planner.info()
    assert info["schedule"] == "1:3,8:1" and info["source"] == "derived"
    assert info["step_costs"] == f"{costs} (hand-made)"
    assert info["acceptance_prior"] == str(profile)
    assert info["acceptance_rates"] == pytest.approx([0.8, 0.5, 0.5])
    assert "Draft length schedule (derived): 1:3,8:1" in caplog.text
    # the server sees every proposal accepted (rates 0.987, 0.967, 0.967 with the prior):
    # full width at bs 1 once it re-derives; at bs 8 plain's 1/5 still beats 3.86/22
    monkeypatch.setattr(draft_len_planner, "REDERIVE_STEPS", 10)
    for _ in range(9):
        planner.count_step(planner.width(1))
        for _ in range(100):
            planner.observe(accepted=3, verified=4)
    assert planner.width(1) == 3
    planner.count_step(planner.width(1))
    assert planner.width(1) == 4 and planner.info()["acceptance_observed_steps"] == 900
    assert caplog.text.count("Draft length schedule after 10 verify steps: 1:4,8:1") == 1



def test_the_drafts_own_profile_serves_by_default_where_it_fits(tmp_path, caplog):
    """Given no profile flag, the draft folder's acceptance_profile.json is the prior; one that
    does not fit the server's verify width is left out with a warning (nobody asked for it),
    where `draft` naming it is refused; `none` leaves out a good one."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, width in ((good, 4), (bad, 16)):
        folder.mkdir()
        (folder / "acceptance_profile.json").write_text(json.dumps(
            {"accept_histogram": [1] * width, "verify_width": width}))
    planner = DraftLenPlanner(_args(), 4, compact=False, draft_dir=str(good))
    assert planner.profile.path == str(good / "acceptance_profile.json")
    assert DraftLenPlanner(_args(speculative_acceptance_profile="none"), 4, compact=False,
                           draft_dir=str(good)).profile is None
    with caplog.at_level(logging.WARNING):
        assert DraftLenPlanner(_args(), 4, compact=False, draft_dir=str(bad)).profile is None
    assert "made for verify width 16, the draft verifies 4: not used" in caplog.text
    with pytest.raises(ValueError, match="made for verify width 16, the draft verifies 4$"):
        DraftLenPlanner(_args(speculative_acceptance_profile="draft"), 4, compact=False,
                        draft_dir=str(bad))


def test_static_verify_derives_once_from_a_profile(tmp_path, monkeypatch):
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"draft_ms": {"1": 1.0, "8": 2.0},
                                 "verify_ms": {"4": 4.0, "8": 4.5, "16": 5.0, "32": 20.0}}))
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"accept_histogram": [0.2, 0.4, 0.2, 0.2]}))
    planner = DraftLenPlanner(_args(speculative_step_costs=str(costs),
                                    speculative_acceptance_profile=str(profile)), 4,
                              compact=False)
    # static verify's budget is every proposal: a width verifies all of its tokens
    planner.start([1, 8], lambda bs: bs * 3, _no_measure)
    # bs 1: E(w) = 1, 1.8, 2.2, 2.6 over 4, 5, 5, 5 ms: width 4; bs 8: 1.8 / 7 ms (16 tokens)
    # beats plain's 1 / 4.5 and 2.2 / 22 (24 tokens pad to 32)
    info = planner.info()
    assert info["schedule"] == "1:4,8:2" and info["source"] == "derived"
    assert info["rederived"].startswith("never")
    # its graphs are captured for it: the counts never change it
    monkeypatch.setattr(draft_len_planner, "REDERIVE_STEPS", 1)
    for _ in range(5):
        planner.observe(accepted=0, verified=4)
        planner.count_step(planner.width(1))
    assert str(planner.schedule) == "1:4,8:2"
    assert planner.info()["acceptance_observed_steps"] == 5

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

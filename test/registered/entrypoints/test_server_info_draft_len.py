"""/get_server_info of a DFlash server with compact verify and the derived draft length schedule
(the HTTP server in a subprocess, tiny-llama and its block-4 draft on the CPU): the schedule in
force and its sources (the step costs file, the acceptance profile), the start-up log line, and
the plain steps of concurrent requests counted in `scheduler_stats`."""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sglang_aux.srt.configs.step_costs import StepCosts
from sglang_aux.srt.speculative.draft_len_planner import derive_widths
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.runtime_utils import pair_checkpoints
from sglang_aux.test.server_utils import launched_server

register_cpu_ci(est_time=30, suite="default")

# bs 1: w=3 (2.2/5 against w=4's 2.4/5.5); bs 2: w=4 (2.4/(1+5)); bs 3 and 4 (draft 4 ms):
# plain, 1/4 and 1/4.5 against at most 0.2
COSTS = {"draft_ms": {"1": 1.0, "2": 1.0, "4": 4.0},
         "verify_ms": {"1": 4.0, "2": 4.0, "3": 4.0, "4": 4.5, "8": 5.0, "16": 8.0},
         "source": "hand-made for this test"}
PROFILE = {"accept_histogram": [0.2, 0.4, 0.2, 0.2]}  # conditional rates 0.8, 0.5, 0.5
SCHEDULE = "1:3,2:4,3:1"
PROMPTS = ["Hello", "The quick brown fox jumps over", "12 + 30 =", "Natalia sold clips to 48"]


def test_schedule_and_plain_steps_in_server_info(tmp_path):
    ckpts = pair_checkpoints(tmp_path, {"tiny-llama": "tiny-llama-dflash"})
    costs, profile = tmp_path / "costs.json", tmp_path / "profile.json"
    costs.write_text(json.dumps(COSTS))
    profile.write_text(json.dumps(PROFILE))
    widths = derive_widths([1, 2, 3, 4], StepCosts.load(str(costs)), [0.8, 0.5, 0.5],
                           lambda bs: 3 * bs)
    assert widths == {1: 3, 2: 4, 3: 1, 4: 1}
    args = ["--model-path", ckpts["tiny-llama"], "--speculative-algorithm", "DFLASH",
            "--speculative-draft-model-path", ckpts["tiny-llama-dflash"], "--device", "cpu",
            "--speculative-verify-mode", "compact", "--compact-verify-budget-frac", "1.0",
            "--speculative-step-costs", str(costs),
            "--speculative-acceptance-profile", str(profile),
            "--max-running-requests", "4", "--cuda-graph-bs-decode", "1", "2", "3", "4"]
    log = tmp_path / "server.log"
    with launched_server(args, log) as url, httpx.Client(base_url=url, timeout=60) as client:
        def generate(i: int) -> int:  # requests of 8 to 32 tokens: the batch shrinks to 1
            params = {"temperature": 0, "max_new_tokens": 8 * (i + 1), "ignore_eos": True}
            return client.post("/generate", json={"text": PROMPTS[i],
                                                  "sampling_params": params}).status_code

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            codes = list(pool.map(generate, range(len(PROMPTS))))
        assert codes == [200] * len(PROMPTS)
        info = client.get("/get_server_info").json()
    schedule = info["speculative_draft_len_schedule"]
    assert schedule["schedule"] == SCHEDULE and schedule["source"] == "derived"
    assert schedule["verify_width"] == 4
    assert schedule["step_costs"] == f"{costs} (hand-made for this test)"
    assert schedule["acceptance_prior"] == str(profile)
    # the prior's rates 0.8, 0.5, 0.5, moved by what the server counted
    assert schedule["acceptance_observed_steps"] > 0
    assert len(schedule["acceptance_rates"]) == 3
    assert all(0 <= a <= 1 for a in schedule["acceptance_rates"])
    stats = info["scheduler_stats"]
    assert 0 < stats["spec_plain_steps"] < stats["spec_verify_steps"]
    assert stats["spec_verify_steps"] == stats["decode_steps"] + stats["mixed_steps"]
    # every forward by mode, a captured layout's or eager: one verify forward a step (a plain
    # step's of the anchors alone), one draft forward a step that proposes, one per prefill
    forwards, draft = info["forwards"], info["draft_forwards"]
    assert set(forwards) == {"EXTEND", "TARGET_VERIFY"} and set(draft) == {"DRAFT_BLOCK"}
    assert sum(forwards["TARGET_VERIFY"].values()) == stats["spec_verify_steps"]
    assert sum(forwards["EXTEND"].values()) == stats["prefill_steps"]
    assert sum(draft["DRAFT_BLOCK"].values()) == (stats["spec_verify_steps"]
                                                  - stats["spec_plain_steps"])
    assert f"Draft length schedule (derived): {SCHEDULE}" in log.read_text()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

"""DFlash and DSpark sampling through the real Engine and worker, block by block over many
steps: each block position's law (token and stopping point, bonus included) against the exact
law, the random streams kept apart, and acceptance exact under oracle and adversarial drafts
at every captured size; compact verify (DFlash and DSpark) keeps every emitted token on
the target's law.

The pair whose laws are known: `sglang_aux/test/law_pair.py`.
"""

import sys

import pytest
import torch

from sglang_aux.srt.sampling import sampler
from sglang_aux.srt.speculative import acceptance, draft_proposals, dspark_proposal
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.law_pair import (
    CAPTURED,
    DRAFTS,
    PROMPT,
    SAMPLED,
    assert_block_positions_follow_the_target_law,
    assert_compact_verify_keeps_the_target_law,
    law_engine,
    law_pairs,
    record_steps,
)
from sglang_aux.test.runtime_utils import assert_kv_all_back

register_cpu_ci(est_time=150, suite="default")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return law_pairs(tmp_path_factory.mktemp("law"))


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_every_block_position_follows_the_target_law(pairs, algorithm):
    assert_block_positions_follow_the_target_law(pairs, algorithm)


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_static_verify_narrower_than_the_block_keeps_the_law(pairs, algorithm):
    assert_block_positions_follow_the_target_law(pairs, algorithm, width=3)


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_compact_verify_keeps_every_token_on_the_target_law(pairs, algorithm):
    assert_compact_verify_keeps_the_target_law(pairs, algorithm)


@pytest.mark.parametrize("algorithm", list(DRAFTS))
def test_random_streams_never_share_a_draw(pairs, monkeypatch, algorithm):
    """Every draw of a request is keyed by (seed, lane, position); the first token's draw,
    the proposals, the accept tests and the corrected / bonus draws must never use the same
    key, over a whole generation (a later step's proposals included)."""
    engine = law_engine(pairs[algorithm, "noisy"], algorithm)
    keys: dict[str, set] = {}
    real = sampler.uniform

    def spy(seed, position, lane):
        caller = sys._getframe(1)
        site = {"sample": "first token", "sampling": "proposal",
                "propose_block": "proposal"}.get(caller.f_code.co_name)
        if site is None:  # rejection_sample: the accept tests come first, then the residual
            site = "accept test" if lane_order.setdefault(caller.f_lineno, len(lane_order)) \
                % 2 == 0 else "corrected / bonus"
        s, pos = torch.broadcast_tensors(seed, position)
        keys.setdefault(site, set()).update(
            (a, lane, c) for a, c in zip(s.reshape(-1).tolist(), pos.reshape(-1).tolist(),
                                         strict=True))
        return real(seed, position, lane)

    lane_order: dict[int, int] = {}
    monkeypatch.setattr(sampler, "uniform", spy)
    monkeypatch.setattr(acceptance, "uniform", spy)
    monkeypatch.setattr(draft_proposals, "uniform", spy)
    monkeypatch.setattr(dspark_proposal, "uniform", spy)
    params = [dict(SAMPLED, max_new_tokens=40, seed=100 + i) for i in range(4)]
    engine.generate(input_ids=[PROMPT] * 4, sampling_params=params)
    assert set(keys) == {"first token", "proposal", "accept test", "corrected / bonus"}, keys
    sites = sorted(keys)
    for i, a in enumerate(sites):
        for other in sites[i + 1:]:
            shared = keys[a] & keys[other]
            assert not shared, f"{a} and {other} share draws {sorted(shared)[:4]}"


@pytest.mark.parametrize("algorithm", list(DRAFTS))
@pytest.mark.parametrize("kind,expect", [("oracle", "block"), ("adversarial", 1)])
@pytest.mark.parametrize("sampled", [True, False])
def test_acceptance_is_exact_under_known_drafts_at_every_size(pairs, kind, expect, sampled,
                                                              algorithm):
    """A draft whose law is the target's accepts every proposal (the whole block, every step);
    one whose top-k is disjoint from the target's accepts none (one token per step); batches
    of every captured size and a padded one, sampled and greedy."""
    engine = law_engine(pairs[algorithm, kind], algorithm)
    b = engine.worker.verify_width
    want = b if expect == "block" else expect
    steps = record_steps(engine.worker)
    params = dict(SAMPLED) if sampled else {"temperature": 0, "ignore_eos": True}
    for bs in [*CAPTURED, 3]:
        steps.clear()
        outs = engine.generate(input_ids=[PROMPT] * bs, sampling_params=[
            dict(params, max_new_tokens=1 + 3 * b, seed=i) for i in range(bs)])
        assert steps and all(len(row) == want for s in steps for row in s), (bs, steps)
        for o in outs:
            m = o["meta_info"]
            assert m["spec_accept_length"] == m["completion_tokens"] / m["spec_verify_ct"]
            assert m["spec_accept_histogram"][want - 1] == m["spec_verify_ct"]
    assert_kv_all_back(engine)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

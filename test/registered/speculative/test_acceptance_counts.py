"""The server's running per-position acceptance (speculative/acceptance_counts.py): proposal k
counts as tried only when verified with every proposal before it accepted, plain steps count
nothing, and the prior weighs in as that many observations."""

import sys

import pytest

from sglang_aux.srt.speculative.acceptance_counts import AcceptanceCounts
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=2, suite="default")


def test_rates_from_hand_counted_verdicts():
    counts = AcceptanceCounts(verify_width=4)
    counts.observe(accepted=0, verified=4)  # tried 0, accepted none
    counts.observe(accepted=2, verified=4)  # tried 0, 1, 2; accepted 0, 1
    counts.observe(accepted=1, verified=2)  # tried 0 (the one verified); accepted it
    counts.observe(accepted=0, verified=1)  # plain decoding: no proposal
    assert counts.num_steps == 3
    # trials [3, 1, 1], accepts [2, 1, 0]; a prior of 0.5 worth 2 observations each
    assert counts.rates([0.5] * 3, prior_weight=2) == pytest.approx([3 / 5, 2 / 3, 1 / 3])
    # without observations of a proposal, its prior
    assert AcceptanceCounts(4).rates([0.9, 0.8, 0.7], prior_weight=64) == pytest.approx(
        [0.9, 0.8, 0.7])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

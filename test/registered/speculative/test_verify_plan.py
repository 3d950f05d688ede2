"""Compact verify's lengths on known confidences (`verify_plan.compact_verify_lens`): the budget
goes to the globally highest survivals, every request verifies at least 1 and at most W =
proposals + 1 tokens, the step's token count is rounded up to a captured bucket, ties are
broken by block position then request, and survivals below the epsilon are never verified;
equal to a slow reference on random confidences."""

import sys

import pytest
import torch

from sglang_aux.srt.speculative.verify_plan import (
    SURVIVAL_EPS,
    compact_verify_lens,
    round_up_to_bucket,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=5, suite="default")

BUCKETS = [4, 8, 12, 16]
# survivals: [.9 .81 .729], [.5 .45 .405], [.99 .099 .0891]
CONF = torch.tensor([[0.9, 0.9, 0.9], [0.5, 0.9, 0.9], [0.99, 0.1, 0.9]])


def lens(conf, budget, buckets=BUCKETS, **kw):
    out = compact_verify_lens(conf, budget, buckets, **kw)
    return out.verify_lens.tolist(), out.num_tokens


def test_budget_goes_to_the_highest_survivals():
    # top 4: .99 (r2 k0), .9 (r0 k0), .81 (r0 k1), .729 (r0 k2)
    assert lens(CONF, 4) == ([4, 1, 2], 8)
    # one more: .5 (r1 k0)
    assert lens(CONF, 5) == ([4, 2, 2], 8)
    out = compact_verify_lens(CONF, 4, BUCKETS)
    assert out.verify_lens.dtype == torch.int32


def test_minimum_one_and_maximum_gamma_plus_one():
    assert lens(CONF, 0) == ([1, 1, 1], 4)
    assert lens(CONF, 9) == ([4, 4, 4], 12)
    # a budget past every candidate verifies every request whole, in the bucket that holds it
    assert lens(CONF, 100) == ([4, 4, 4], 12)


def test_total_is_rounded_up_to_a_captured_bucket():
    assert lens(CONF, 1) == ([1, 1, 2], 4)
    assert lens(CONF, 2) == ([2, 1, 2], 8)  # 5 tokens: the 8-token graph
    assert lens(CONF, 6, buckets=[3, 9, 12]) == ([4, 3, 2], 9)
    with pytest.raises(ValueError, match="12 verify tokens exceed the largest captured "
                                         "bucket 8"):
        compact_verify_lens(CONF, 9, [4, 8])


def test_ties_go_to_the_earlier_position_then_the_lower_request():
    conf = torch.full((3, 2), 0.5)  # survivals .5 .25 in every request
    assert lens(conf, 1)[0] == [2, 1, 1]
    assert lens(conf, 2)[0] == [2, 2, 1]
    assert lens(conf, 4)[0] == [3, 2, 2]  # every k = 0 before any k = 1
    assert lens(conf, 5)[0] == [3, 3, 2]


def test_survivals_below_epsilon_are_never_verified():
    conf = torch.tensor([[0.9, 0.0, 0.9], [1e-4, 1e-4, 0.9]])  # survivals 1e-4 then 1e-8
    verify, num_tokens = lens(conf, 6)
    assert verify == [2, 2]
    assert num_tokens == 8  # the bucket is sized by the budget, before reading confidences
    assert lens(conf, 6, survival_eps=0.0)[0] == [4, 4]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="budget must be >= 0, got -1"):
        compact_verify_lens(CONF, -1, BUCKETS)
    with pytest.raises(ValueError,
                       match=r"confidence \(3,\) must be \[bs >= 1, proposals >= 1\]"):
        compact_verify_lens(CONF[0], 1, BUCKETS)
    with pytest.raises(ValueError, match=r"distinct, ascending and >= 1, got \[8, 4\]"):
        round_up_to_bucket(3, [8, 4])
    with pytest.raises(ValueError, match="distinct, ascending"):
        round_up_to_bucket(3, [])


def slow_reference(conf: torch.Tensor, budget: int, eps: float) -> list[int]:
    bs, n = conf.shape
    survival = torch.cumprod(conf.double(), 1)
    candidates = sorted((-float(survival[r, k]), k, r) for r in range(bs) for k in range(n))
    out = [1] * bs
    for neg, _, r in candidates[:budget]:
        if -neg >= eps:
            out[r] += 1
    return out


@pytest.mark.parametrize("seed", range(20))
def test_random_confidences_match_the_slow_reference(seed):
    g = torch.Generator().manual_seed(seed)
    bs = int(torch.randint(1, 12, (1,), generator=g))
    n = int(torch.randint(1, 8, (1,), generator=g))
    # quantized so that ties occur, a few exact zeros
    conf = (torch.rand(bs, n, generator=g) * 8).round() / 8
    budget = int(torch.randint(0, bs * n + 3, (1,), generator=g))
    buckets = sorted({bs * (n + 1), *(range(1, bs * (n + 1), 5))})
    out = compact_verify_lens(conf, budget, buckets)
    verify = out.verify_lens.tolist()
    assert verify == slow_reference(conf.float(), budget, SURVIVAL_EPS)
    assert all(1 <= v <= n + 1 for v in verify)
    assert sum(verify) <= bs + min(budget, bs * n) <= out.num_tokens
    assert out.num_tokens in buckets


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

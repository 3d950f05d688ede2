"""Sampling on the device: counter-based draws, inverse-CDF sampling, greedy and sampled rows
mixed (top-k / top-p: test_top_k_top_p.py)."""

import sys
from collections import Counter

import pytest
import torch

from sglang_aux.srt.sampling.sampler import (
    SAMPLE_ROWS,
    Lane,
    SamplingTensors,
    sample,
    sample_from_probs,
    uniform,
)
from sglang_aux.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=10, suite="default")

VOCAB = 11


def _params(temperature, top_k, top_p, seed=None):
    n = len(temperature)
    t = torch.tensor(temperature, dtype=torch.float32)
    k = torch.tensor(top_k, dtype=torch.int64)
    return SamplingTensors(temperature=t, top_k=k, top_p=torch.tensor(top_p),
                           seed=torch.tensor(seed or list(range(n)), dtype=torch.int64),
                           is_greedy=(t < 1e-6) | (k == 1))


def test_uniform_is_keyed_by_seed_position_and_lane_only():
    seed = torch.tensor([7, 7, 8, -3, 2**62 + 5])
    pos = torch.tensor([10, 11, 10, 10, 10])
    u = uniform(seed, pos, Lane.SAMPLE)
    assert ((u >= 0) & (u < 1)).all()
    assert len(set(u.tolist())) == 5
    # the same (seed, position) gives the same draw in any batch, at any row
    alone = uniform(torch.tensor([8]), torch.tensor([10]), Lane.SAMPLE)
    assert alone.item() == u[2].item()
    assert uniform(seed, pos, Lane.ACCEPT).ne(u).all()


def test_uniform_draws_are_uniform():
    n = 200_000
    u = uniform(torch.full((n,), 12345), torch.arange(n), Lane.DRAFT)
    hist = torch.histc(u, bins=10, min=0, max=1) / n
    assert (hist - 0.1).abs().max() < 0.005, hist
    lag = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(lag)) < 0.01


def test_sample_from_probs_follows_the_distribution():
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(VOCAB, generator=g), -1)
    probs[3] = 0.0
    n = 40_000
    u = uniform(torch.full((n,), 99), torch.arange(n), Lane.SAMPLE)
    tokens = sample_from_probs(probs.expand(n, -1), u)
    counts = Counter(tokens.tolist())
    assert 3 not in counts, "a zero-probability token was drawn"
    tv = 0.5 * sum(abs(counts.get(t, 0) / n - float(probs[t] / probs.sum()))
                   for t in range(VOCAB))
    assert tv < 0.015, tv


def _draw_whole(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    cdf = probs.cumsum(-1)
    return (cdf <= u[..., None] * cdf[..., -1:]).sum(-1).clamp_max(probs.shape[-1] - 1)


@pytest.mark.parametrize("shape", [(3, 50), (SAMPLE_ROWS * 2 + 7, 50), (40, 15, 50)])
def test_sample_from_probs_in_slices_equals_one_whole_draw(shape):
    """Drawing `SAMPLE_ROWS` rows at a time, from a contiguous block or a strided view (the
    DRAFT_BLOCK tail's offsets 1..B-1), gives the whole draw's tokens, and a zero-probability
    token is never chosen."""
    g = torch.Generator().manual_seed(7)
    probs = torch.rand(*shape, generator=g)
    probs[..., ::3] = 0.0
    u = torch.rand(*shape[:-1], generator=g)
    drawn = sample_from_probs(probs, u)
    assert drawn.shape == shape[:-1] and drawn.dtype == torch.int64
    assert torch.equal(drawn, _draw_whole(probs, u))
    assert (probs.gather(-1, drawn[..., None]) > 0).all()
    if len(shape) == 3:  # a view that skips each block's first row
        full = torch.rand(shape[0], shape[1] + 1, shape[2], generator=g)
        assert torch.equal(sample_from_probs(full[:, 1:], u), _draw_whole(full[:, 1:], u))


@pytest.mark.parametrize("all_greedy", [True, False])
def test_sample_mixes_greedy_and_sampled_rows(all_greedy):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, VOCAB, generator=g)
    temps = [0.0] * 4 if all_greedy else [0.0, 1.0, 0.0, 1.0]
    params = _params(temps, [VOCAB, VOCAB, 1, 2], [1.0] * 4, seed=[5, 5, 5, 5])
    positions = torch.tensor([3, 3, 9, 4])
    tokens = sample(logits, params, positions, all_greedy)
    greedy = logits.argmax(-1)
    assert tokens[0] == greedy[0] and tokens[2] == greedy[2]
    if not all_greedy:
        assert tokens[3] in logits[3].topk(2).indices
        again = sample(logits[1:2], SamplingTensors(*(t[1:2] for t in (
            params.temperature, params.top_k, params.top_p, params.seed, params.is_greedy))),
            positions[1:2], False)
        assert again.item() == tokens[1].item(), "a row's draw depends on its batch"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

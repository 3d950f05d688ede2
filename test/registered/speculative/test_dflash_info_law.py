"""Lossless rejection sampling as a law over whole blocks: every position, the bonus token and
the stopping point (`rejection_verify`).

Exact: on tiny vocabularies whose probabilities are multiples of 1/den, every draft tuple and
a grid of M uniforms per random number (M a multiple of lcm(1..den), midpoints) give the
sampler's law exactly, compared with the law written down in `position_laws`' terms for the
whole block. Statistical: random (p, q) pairs over vocabularies of 5 to 50, the target's row
depending on the draft before it, each block position's law against the truth by a chi-square
test sized in `sampling_law` (power 0.99 at TV 0.02, false alarm 0.001 for the file).
"""

import itertools
import math
import sys

import pytest
import torch

from sglang_aux.srt.speculative.dflash_info import rejection_verify
from sglang_aux.test.ci.ci_register import register_cpu_ci
from sglang_aux.test.sampling_law import (
    FALSE_ALARM,
    FAMILY,
    SAMPLES_FOR_TV_002,
    chi_square,
    position_cells,
    position_laws,
)

register_cpu_ci(est_time=45, suite="default")

PAIRS = 6  # random (p, q) pairs in the statistical test; FAMILY = PAIRS * STAT_BLOCK
STAT_BLOCK = 4


def _grid_distribution(g: torch.Generator, vocab: int, den: int) -> torch.Tensor:
    """A random distribution whose entries are multiples of 1/den (zeros included)."""
    units = torch.multinomial(torch.ones(vocab), den, replacement=True, generator=g)
    return torch.bincount(units, minlength=vocab).double() / den


def _exact_block_law(p0, transitions, drafts) -> dict[tuple, float]:
    """P(n, x_1..x_n) for every emitted block, from the rule: each token from the target's
    row given the tokens before it; go on past x_i with probability min(p, q_i)(x_i) / p(x_i);
    the bonus ends the block."""
    num_drafts, vocab = drafts.shape
    law: dict[tuple, float] = {}

    def walk(prefix: tuple, prob: float, row: torch.Tensor) -> None:
        i = len(prefix)
        for x in range(vocab):
            px = float(row[x])
            if px == 0.0:
                continue
            if i == num_drafts:  # the bonus
                law[prefix + (x,)] = prob * px
                continue
            go_on = min(px, float(drafts[i, x]))
            if px - go_on > 0:
                law[prefix + (x,)] = prob * (px - go_on)
            if go_on > 0:
                walk(prefix + (x,), prob * go_on, transitions[i][x])

    walk((), 1.0, p0)
    return law


def _enumerated_law(p0, transitions, drafts, grid: int,
                    num_verified: int | None = None) -> dict[tuple, float]:
    """The law `rejection_verify` implements: all draft tuples (weighted by q) x all
    midpoints of `grid` cells for each accept test and for the residual draw (each block
    verifying its first `num_verified` tokens only, when given)."""
    num_drafts, vocab = drafts.shape
    tuples = torch.tensor(list(itertools.product(range(vocab), repeat=num_drafts)))
    u = (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    accept = torch.cartesian_prod(*[u] * num_drafts).view(-1, num_drafts)
    rows_d = tuples.repeat_interleave(accept.shape[0] * grid, 0)
    rows_a = accept.repeat_interleave(grid, 0).repeat(tuples.shape[0], 1)
    rows_r = u.repeat(tuples.shape[0] * accept.shape[0])[:, None].expand(-1, num_drafts + 1)
    n = rows_d.shape[0]
    target = torch.stack([p0.expand(n, -1)] + [transitions[i][rows_d[:, i]]
                                              for i in range(num_drafts)], 1)
    verified = None if num_verified is None else torch.full((n,), num_verified)
    v = rejection_verify(rows_d, drafts.expand(n, -1, -1), target, rows_a, rows_r.contiguous(),
                         verified)
    weight = drafts.gather(1, rows_d.T).prod(0) / (accept.shape[0] * grid)
    # an emitted block as one integer: its length, then its tokens in base `vocab`
    length = v.accepted + 1
    digits = torch.where(torch.arange(num_drafts + 1) < length[:, None], v.tokens + 1, 0)
    code = length * (vocab + 1) ** (num_drafts + 1) + (
        digits * (vocab + 1) ** torch.arange(num_drafts + 1)).sum(-1)
    keys, index = torch.unique(code, return_inverse=True)
    mass = torch.zeros(len(keys), dtype=torch.float64).index_add_(0, index, weight)
    law: dict[tuple, float] = {}
    for key, m in zip(keys.tolist(), mass.tolist(), strict=True):
        if m > 0:
            n_emitted = key // (vocab + 1) ** (num_drafts + 1)
            law[tuple((key // (vocab + 1) ** j) % (vocab + 1) - 1
                      for j in range(n_emitted))] = m
    return law


@pytest.mark.parametrize("den,vocab,block", [(4, 3, 4), (4, 4, 3), (6, 3, 2), (6, 4, 2)])
def test_rejection_sampling_law_is_exact_on_tiny_vocabularies(den, vocab, block):
    grid = math.lcm(*range(1, den + 1))
    for seed in range(6):
        g = torch.Generator().manual_seed(1000 * den + 100 * vocab + seed)
        p0 = _grid_distribution(g, vocab, den)
        transitions = [torch.stack([_grid_distribution(g, vocab, den) for _ in range(vocab)])
                       for _ in range(block - 1)]
        drafts = torch.stack([_grid_distribution(g, vocab, den) for _ in range(block - 1)])
        want = _exact_block_law(p0, transitions, drafts)
        got = _enumerated_law(p0, transitions, drafts, grid)
        assert abs(sum(got.values()) - 1.0) < 1e-9
        for key in set(want) | set(got):
            assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, (
                seed, key, got.get(key), want.get(key), p0, transitions, drafts)


@pytest.mark.parametrize("den,vocab,block,verified", [(4, 3, 4, 1), (4, 3, 4, 2), (4, 3, 4, 3),
                                                     (6, 3, 3, 2)])
def test_fewer_verified_tokens_give_the_shorter_block_law(den, vocab, block, verified):
    """A block that verified only its first `verified` tokens (DSpark's compact verify) has
    exactly the law of a block of that many tokens: the drafts past them and the target's
    rows past them (poisoned here: all mass on token 0) are never read, and the token after
    its last verified draft comes from the target alone."""
    grid = math.lcm(*range(1, den + 1))
    poison = torch.zeros(vocab, vocab, dtype=torch.float64)
    poison[:, 0] = 1.0
    for seed in range(4):
        g = torch.Generator().manual_seed(5000 + 100 * block + 10 * verified + seed)
        p0 = _grid_distribution(g, vocab, den)
        transitions = [torch.stack([_grid_distribution(g, vocab, den) for _ in range(vocab)])
                       for _ in range(verified - 1)] + [poison] * (block - verified)
        drafts = torch.stack([_grid_distribution(g, vocab, den) for _ in range(block - 1)])
        want = _exact_block_law(p0, transitions[: verified - 1], drafts[: verified - 1])
        got = _enumerated_law(p0, transitions, drafts, grid, num_verified=verified)
        assert abs(sum(got.values()) - 1.0) < 1e-9
        for key in set(want) | set(got):
            assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < 1e-9, (seed, key)


def _random_pair(g: torch.Generator, vocab: int):
    """A target (anchor row + Markov rows) and a draft that overlaps it: each draft row mixes
    the target's average row at that position with noise; a few tokens the target never
    emits and a few the draft never proposes."""
    def dist(shape, scale):
        return torch.softmax(torch.randn(shape, generator=g, dtype=torch.float64) * scale, -1)

    scale = 0.5 + 2.0 * torch.rand((), generator=g).item()
    p0 = dist(vocab, scale)
    # rows that depend on the previous token, around a row shared per position
    transitions = [0.7 * dist(vocab, scale) + 0.3 * dist((vocab, vocab), scale)
                   for _ in range(STAT_BLOCK - 1)]
    never = torch.randperm(vocab, generator=g)[: max(1, vocab // 10)]
    p0[never] = 0
    for t in transitions:
        t[:, never] = 0
        t /= t.sum(-1, keepdim=True)
    p0 /= p0.sum()
    mean_rows = [p0] + [t.mean(0) for t in transitions[:-1]]
    mix = 0.1 + 0.3 * torch.rand(STAT_BLOCK - 1, generator=g, dtype=torch.float64)
    drafts = torch.stack([(1 - m) * r + m * dist(vocab, scale)
                          for m, r in zip(mix, mean_rows, strict=True)])
    drafts[:, torch.randperm(vocab, generator=g)[: max(1, vocab // 10)]] = 0
    drafts /= drafts.sum(-1, keepdim=True)
    return p0, transitions, drafts


def test_rejection_sampling_law_at_every_position_chi_square():
    assert FAMILY == PAIRS * STAT_BLOCK
    alpha = FALSE_ALARM / FAMILY
    n = SAMPLES_FOR_TV_002
    vocabs = [5, 50] + [int(v) for v in torch.randint(6, 50, (PAIRS - 2,),
                                                      generator=torch.Generator().manual_seed(7))]
    for pair, vocab in enumerate(vocabs):
        g = torch.Generator().manual_seed(20_000 + pair)
        p0, transitions, drafts = _random_pair(g, vocab)
        laws = position_laws(p0, transitions, drafts)
        d = torch.stack([torch.multinomial(drafts[i].float(), n, replacement=True, generator=g)
                         for i in range(STAT_BLOCK - 1)], 1)  # [n, B-1]
        target = torch.stack([p0.float().expand(n, -1)] + [
            transitions[i].float()[d[:, i]] for i in range(STAT_BLOCK - 1)], 1)
        v = rejection_verify(d, drafts.float().expand(n, -1, -1), target,
                             torch.rand(n, STAT_BLOCK - 1, generator=g),
                             torch.rand(n, STAT_BLOCK, generator=g))
        cells = position_cells(v.accepted, v.tokens, vocab)
        assert laws[-1, -1] < 0.9, "the bonus position must be reached often"
        for i in range(STAT_BLOCK):
            counts = torch.bincount(cells[:, i], minlength=2 * vocab + 1)
            pvalue, tv, df = chi_square(counts, laws[i])
            assert pvalue > alpha, (pair, vocab, i, pvalue, tv, df)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

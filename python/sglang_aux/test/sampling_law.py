"""The law a lossless speculative sampler must follow, and the goodness-of-fit test that holds
it to that law (unit tests of `rejection_verify` and end-to-end DFlash sampling share both).

A verified block emits tokens x_1 .. x_n (n = accepted drafts + 1, at most B). Token x_i is
distributed as the target's row i - 1 given the tokens before it; after it the block goes on
(draft d_i was accepted) with probability min(p, q_i)(x_i) / p(x_i), and the bonus x_B always
ends it. Per block position i that gives the law of
`Y_i in {(x, goes on), (x, stops), not reached}`, which the chi-square test compares with the
counts a sampler produced.

Sizing (`scripts/sampler_test_power.py` recomputes every figure): a Pearson test with at most
100 degrees of freedom, run as one of `FAMILY` tests that share a false-alarm budget of
`FALSE_ALARM` (Bonferroni), flags a law whose total-variation distance from the truth is 0.02
with probability >= 0.99 once `SAMPLES_FOR_TV_002` draws are used: the noncentrality of such a
law is at least `4 * TV**2 * N` (Cauchy-Schwarz), whatever the direction of the bias.
"""

from __future__ import annotations

import torch

FALSE_ALARM = 1e-3  # chance that a correct sampler fails one whole test file
FAMILY = 24  # chi-square tests sharing FALSE_ALARM in the unit test (6 pairs x 4 positions)
SAMPLES_FOR_TV_002 = 80_000  # >= 76,631: power 0.99 at TV 0.02, df 100, alpha 1e-3 / 24
MIN_EXPECTED = 5.0  # cells expected to hold fewer draws are pooled


def position_laws(p0: torch.Tensor, transitions: list[torch.Tensor],
                  drafts: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """`[B, 2V + 1]` float64: per block position i (0-based), the law of Y_i as cells
    `[x goes on (V), x stops (V), not reached]`.

    `p0` `[V]`: the target after the anchor; `transitions[i - 1]` `[V, V]`: the target's row
    i given the token at block position i (i = 1 .. B - 1, Markov on the last draft);
    `drafts` `[B - 1, V]`: the draft distribution at each draft offset; or, for a draft that
    conditions on the token before (DSpark's Markov head), per offset i `[W, V]` given the
    previous token w (offset 0: `[1, V]`, given the anchor)."""
    num_drafts, vocab = len(drafts), p0.numel()
    block = num_drafts + 1
    laws = torch.zeros((block, 2 * vocab + 1), dtype=torch.float64)
    reach = torch.ones(1, dtype=torch.float64)  # P(reach i, previous token = w)
    rows = p0.double()[None]  # [W, V]: the target at position i given w
    for i in range(block):
        joint = reach[:, None] * rows
        go_on = (torch.minimum(rows, drafts[i].double()) * reach[:, None] if i < num_drafts
                 else torch.zeros_like(joint))
        laws[i, :vocab] = go_on.sum(0)
        laws[i, vocab:2 * vocab] = (joint - go_on).sum(0)
        laws[i, -1] = 1.0 - float(reach.sum())
        if i < num_drafts:
            reach, rows = go_on.sum(0), transitions[i].double()
    return laws


def position_cells(accepted: torch.Tensor, tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[bs, B]` cell of Y_i per verified block (`position_laws`' cell order)."""
    block = tokens.shape[1]
    n = (accepted + 1)[:, None]
    i = torch.arange(1, block + 1)[None]
    cell = torch.where(n == i, vocab + tokens, tokens)
    return torch.where(n >= i, cell, 2 * vocab)


def chi_square(counts: torch.Tensor, law: torch.Tensor) -> tuple[float, float, int]:
    """Pearson's test of `counts` `[cells]` against `law` `[cells]`: (p-value, observed TV,
    degrees of freedom). Draws in a cell of probability zero give p-value 0; cells expected
    to hold fewer than MIN_EXPECTED draws are pooled into one."""
    counts, law = counts.double(), law.double()
    n = float(counts.sum())
    tv = 0.5 * float((counts / n - law).abs().sum())
    if bool((counts[law <= 0] > 0).any()):
        return 0.0, tv, 0
    expected = law * n
    small = (expected < MIN_EXPECTED) & (law > 0)
    big = expected >= MIN_EXPECTED
    obs = torch.cat([counts[big], counts[small].sum()[None]])
    exp = torch.cat([expected[big], expected[small].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = int(keep.sum()) - 1
    if df < 1:
        return 1.0, tv, 0
    # chi-square survival function: the regularized upper incomplete gamma function
    p = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                      torch.tensor(stat / 2, dtype=torch.float64)))
    return p, tv, df

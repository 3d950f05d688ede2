"""Power and false-alarm rates of the sampling-law chi-square tests (`test/sampling_law.py`),
by the noncentral chi-square and by simulation. Needs scipy (not a test dependency).

    python scripts/sampler_test_power.py [--sims 2000] [--engine-draws 32 2000 1200 700 400]

The worst case over biases of total-variation distance d from a law p0 has noncentrality
N * sum (p1 - p0)^2 / p0 >= 4 d^2 N (Cauchy-Schwarz with sum p0 = 1), reached by moving mass
d from a half of p0's mass to the other half in proportion to p0; the simulation uses that
bias.
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.stats import chi2, ncx2

from sglang_aux.test.sampling_law import FALSE_ALARM, FAMILY, SAMPLES_FOR_TV_002

TV = 0.02


def power(n: int, df: int, alpha: float, tv: float) -> float:
    return float(ncx2.sf(chi2.isf(alpha, df), df, 4 * tv * tv * n))


def worst_bias(p0: np.ndarray, tv: float) -> np.ndarray:
    order = np.argsort(p0)
    half = np.cumsum(p0[order]) <= 0.5
    a = np.zeros_like(p0, dtype=bool)
    a[order[half]] = True
    return p0 + tv * (p0 * a / p0[a].sum() - p0 * ~a / p0[~a].sum())


def simulate(p0: np.ndarray, p1: np.ndarray, n: int, alpha: float, sims: int,
             rng: np.random.Generator) -> float:
    """Fraction of `sims` Pearson tests at level alpha that reject p0 given draws from p1."""
    counts = rng.multinomial(n, p1, size=sims)
    stat = ((counts - n * p0) ** 2 / (n * p0)).sum(-1)
    return float((stat > chi2.isf(alpha, len(p0) - 1)).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=2000)
    parser.add_argument("--engine-draws", type=int, nargs="+", default=[32, 2000, 1200, 700, 400],
                        help="draws per engine-test position (first token, block positions)")
    parser.add_argument("--engine-df", type=int, default=15)
    args = parser.parse_args()
    alpha = FALSE_ALARM / FAMILY
    print(f"unit test: {FAMILY} tests, alpha per test {alpha:.2e} (family {FALSE_ALARM}), "
          f"N = {SAMPLES_FOR_TV_002}")
    for df in (10, 50, 100):
        crit = chi2.isf(alpha, df)
        need = next(n for n in range(1000, 10**6, 100) if power(n, df, alpha, TV) >= 0.99)
        print(f"  df {df:3d}: critical {crit:6.1f}, power at TV {TV} "
              f"{power(SAMPLES_FOR_TV_002, df, alpha, TV):.4f} (N for 0.99: {need})")
    rng = np.random.default_rng(0)
    for vocab in (5, 50):
        p0 = rng.dirichlet(np.ones(2 * vocab + 1))
        p0 = np.maximum(p0, 1e-3)
        p0 /= p0.sum()
        fa = simulate(p0, p0, SAMPLES_FOR_TV_002, alpha * 100, args.sims, rng) / 100
        pw = simulate(p0, worst_bias(p0, TV), SAMPLES_FOR_TV_002, alpha, args.sims, rng)
        print(f"  simulated, {2 * vocab + 1} cells: power at TV {TV} {pw:.4f}; false alarm "
              f"~{fa:.1e} per test (measured at 100x alpha, scaled)")
    family = len(args.engine_draws)
    e_alpha = FALSE_ALARM / family
    print(f"engine test: {family} tests, alpha per test {e_alpha:.1e}, df {args.engine_df}")
    for n in args.engine_draws:
        figures = ", ".join(f"TV {tv}: {power(n, args.engine_df, e_alpha, tv):.3f}"
                            for tv in (0.02, 0.05, 0.1, 0.2))
        print(f"  {n} draws: power (worst-case direction) {figures}")


if __name__ == "__main__":
    main()

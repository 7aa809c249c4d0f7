"""Two-sided geometric (discrete Laplace) sampler: goodness of fit, moments, symmetry, tails (P1, ST9, ST10,
W9).

Reference law: P(k) = (1-a)/(1+a) a^|k|, a = exp(-1/b), evaluated to 60 digits (``exact_law``); variance
2a/(1-a)² (b = 1: 1.841347, ST10). Every statistical assertion uses a fixed seed (CI-deterministic); for a
random seed each one fails with probability ALPHA = 1e-6 (z-tests at |z| < 4.89, chi-square / binomial p >
1e-6), so a test with j assertions has an a-priori false-failure rate <= j·1e-6.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dasflow.privacy import rng, samplers
from tests.privacy_samplers.exact_law import ALPHA, Z_CRIT, chi_square, geometric_law, z_mean, z_variance

N = 1_000_000
SCALES = [Fraction(1, 3), Fraction(1, 2), Fraction(2), Fraction(50), Fraction(1000)]


def test_st10_variance_oracle() -> None:
    assert abs(float(geometric_law(Fraction(1)).variance) - 1.841347) < 5e-7


@pytest.mark.parametrize("b", [*SCALES, Fraction(10**5), Fraction(123456789, 10)], ids=str)
def test_p1_goodness_of_fit_and_moments(b: Fraction) -> None:
    """P1/ST10: chi-square against the exact pmf, mean 0 and variance 2a/(1-a)² within Monte-Carlo error.
    b = 1e5 and 1.2e7 exercise the two-level (M = tV + R) path."""
    g = rng.seeded(int(b * 3) % 10**6 + 17)
    x = samplers.two_sided_geometric(b, N, g)
    assert x.dtype == np.int64 and x.shape == (N,)
    law = geometric_law(b, k_max=int(min(float(b) * 60, 3e5)) + 10)
    stat, dof, p = chi_square(x, law)
    assert p > ALPHA, (stat, dof)
    assert abs(z_mean(x, law)) < Z_CRIT
    assert abs(z_variance(x, law)) < Z_CRIT


@pytest.mark.parametrize("b", [Fraction(1, 2), Fraction(2), Fraction(50)], ids=str)
def test_symmetry_and_tails(b: Fraction) -> None:
    """P(X = k) = P(X = -k) (paired chi-square) and P(|X| >= m) = 2 a^m / (1 + a) exactly (binomial)."""
    x = samplers.two_sided_geometric(b, N, rng.seeded(int(b * 2) + 101))
    law = geometric_law(b)
    pos, neg = int(np.sum(x > 0)), int(np.sum(x < 0))
    assert stats.binomtest(pos, pos + neg, 0.5).pvalue > ALPHA
    hi = int(6 * float(b)) + 2
    cp = np.bincount(np.clip(x, 0, hi), minlength=hi + 1)[1:hi].astype(np.float64)
    cn = np.bincount(np.clip(-x, 0, hi), minlength=hi + 1)[1:hi].astype(np.float64)
    keep = cp + cn >= 20
    stat = float(np.sum((cp[keep] - cn[keep]) ** 2 / (cp[keep] + cn[keep])))
    assert stats.chi2.sf(stat, int(keep.sum())) > ALPHA
    for m in [1, int(float(b)) + 1, int(3 * float(b)) + 1, int(6 * float(b)) + 1]:
        p = float(law.tail_at_least(m))
        assert stats.binomtest(int(np.sum(np.abs(x) >= m)), N, p).pvalue > ALPHA, m


def test_zero_scale_is_no_noise() -> None:
    g = rng.seeded(1)
    assert not samplers.two_sided_geometric(0, 1000, g).any()
    assert samplers.two_sided_geometric(Fraction(0), (2, 3), g).shape == (2, 3)


def test_samples_independent_lag1() -> None:
    """Consecutive samples are uncorrelated: |corr| sqrt(n) < 4.89."""
    x = samplers.two_sided_geometric(Fraction(3), N, rng.seeded(77)).astype(np.float64)
    r = float(np.corrcoef(x[:-1], x[1:])[0, 1])
    assert abs(r) * np.sqrt(x.size) < Z_CRIT


def test_seeded_reproducible_and_vectorised_shapes() -> None:
    a = samplers.two_sided_geometric(Fraction(5, 2), (10, 20), rng.seeded(3).spawn("k"))
    b = samplers.two_sided_geometric(Fraction(5, 2), (10, 20), rng.seeded(3).spawn("k"))
    assert a.shape == (10, 20) and np.array_equal(a, b)

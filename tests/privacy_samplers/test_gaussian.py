"""Discrete Gaussian sampler N_Z(0, σ²): goodness of fit, moments, symmetry, tails, independence
(S18, ST9, ST10, W9, W11, R9, R10, P-L3).

Reference law: P(k) = exp(-k²/(2σ²)) / Σ_j exp(-j²/(2σ²)) to 60 digits (``exact_law``), which reproduces the
S18 oracles Var N_Z(0,1) = 1 - 2.1123e-7 and Var N_Z(0,2) = 2 - 2.2604e-15. Every statistical assertion uses a
fixed seed (CI-deterministic); for a random seed each one fails with probability ALPHA = 1e-6 (|z| < 4.89 or p
> 1e-6), so a test with j assertions has an a-priori false-failure rate <= j·1e-6.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dasflow.privacy import rng, samplers
from tests.privacy_samplers.exact_law import ALPHA, Z_CRIT, chi_square, gaussian_law, z_mean, z_variance

N = 1_000_000
SIGMA2 = [
    Fraction(1, 100),
    Fraction(1, 2),
    Fraction(1),
    Fraction(2, 3),
    Fraction(148),
    Fraction(9 * 10**4),
    Fraction(10**8),
]


def test_s18_variance_oracles() -> None:
    """S18 / ST10: the exact variances the Monte-Carlo tests compare against."""
    v1 = gaussian_law(Fraction(1)).variance
    v2 = gaussian_law(Fraction(2)).variance
    assert abs(float(1 - v1) - 2.1123e-7) < 5e-12
    assert abs(float(2 - v2) - 2.2604e-15) < 5e-20
    # W11: the true variance is below σ² (strictly, here visibly)
    assert v1 < 1 and v2 < 2


@pytest.mark.parametrize("sigma2", SIGMA2, ids=str)
def test_goodness_of_fit_and_moments(sigma2: Fraction) -> None:
    """Chi-square against the exact pmf; mean 0 and variance = exact Var N_Z(0, σ²) within Monte-Carlo
    error."""
    g = rng.seeded(int(sigma2 * 1000) % 10**6 + 1)
    x = samplers.discrete_gaussian(sigma2, N, g)
    assert x.dtype == np.int64 and x.shape == (N,)
    law = gaussian_law(sigma2)
    if sigma2 == Fraction(1, 100):
        # P(X != 0) = 2 e^-50 / Z ≈ 3.9e-22: every draw must be 0
        assert not x.any()
        return
    stat, dof, p = chi_square(x, law)
    assert p > ALPHA, (stat, dof)
    assert abs(z_mean(x, law)) < Z_CRIT
    assert abs(z_variance(x, law)) < Z_CRIT


@pytest.mark.parametrize("sigma2", [Fraction(1), Fraction("12.16") ** 2, Fraction(9 * 10**4)], ids=str)
def test_symmetry_and_tails(sigma2: Fraction) -> None:
    """P(X = k) = P(X = -k) (sign test and paired chi-square); P(|X| >= k) = exact tail (binomial)."""
    x = samplers.discrete_gaussian(sigma2, N, rng.seeded(int(sigma2) + 5))
    law = gaussian_law(sigma2)
    pos, neg = int(np.sum(x > 0)), int(np.sum(x < 0))
    assert stats.binomtest(pos, pos + neg, 0.5).pvalue > ALPHA
    sigma = float(sigma2) ** 0.5
    hi = int(4 * sigma) + 2
    cp = np.bincount(np.clip(x, 0, hi), minlength=hi + 1)[1:hi].astype(np.float64)
    cn = np.bincount(np.clip(-x, 0, hi), minlength=hi + 1)[1:hi].astype(np.float64)
    keep = cp + cn >= 20
    stat = float(np.sum((cp[keep] - cn[keep]) ** 2 / (cp[keep] + cn[keep])))
    assert stats.chi2.sf(stat, int(keep.sum())) > ALPHA
    for z in [0.5, 1, 2, 3, 4]:
        k = max(1, int(np.ceil(z * sigma)))
        p = float(law.tail_at_least(k))
        assert stats.binomtest(int(np.sum(np.abs(x) >= k)), N, p).pvalue > ALPHA, k


def test_r10_phsafe_noise_checks() -> None:
    """R10 (PHSafe): mean ≈ 0, variance ≈ σ² and the 90% quantile of |noise| within [1.645σ - 1, 1.645σ + 1],
    at PH3 State A-G's σ² = 196/(2·0.662976); independent cells (lag-1 correlation)."""
    sigma2 = Fraction(196) / (2 * Fraction("0.662976"))
    x = samplers.discrete_gaussian(sigma2, N, rng.seeded(662976))
    law = gaussian_law(sigma2)
    assert abs(z_mean(x, law)) < Z_CRIT
    assert abs(z_variance(x, law)) < Z_CRIT
    sigma = float(sigma2) ** 0.5
    q90 = float(np.quantile(np.abs(x), 0.9))
    assert 1.645 * sigma - 1 <= q90 <= 1.645 * sigma + 1
    xf = x.astype(np.float64)
    r = float(np.corrcoef(xf[:-1], xf[1:])[0, 1])
    assert abs(r) * np.sqrt(N) < Z_CRIT


def test_zero_sigma2_is_no_noise_and_shapes() -> None:
    g = rng.seeded(1)
    assert not samplers.discrete_gaussian(0, 1000, g).any()
    assert samplers.discrete_gaussian(Fraction(5), (4, 5), g).shape == (4, 5)
    assert samplers.discrete_gaussian(Fraction(5), 0, g).shape == (0,)


def test_r9_seeded_reproducible_per_key() -> None:
    """A resumed release redraws identical noise for the same key (seeded test mode only)."""
    s2 = Fraction(98, 1) / Fraction("0.5")
    a = samplers.discrete_gaussian(s2, 1000, rng.seeded(2020).spawn("ph1/state"))
    b = samplers.discrete_gaussian(s2, 1000, rng.seeded(2020).spawn("ph1/state"))
    c = samplers.discrete_gaussian(s2, 1000, rng.seeded(2020).spawn("ph1/county"))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_huge_sigma2_no_overflow() -> None:
    """σ² = 1e10 (t = 100001, two-level proposal, ~1M-entry acceptance table): int64 output, moments right."""
    sigma2 = Fraction(10**10)
    x = samplers.discrete_gaussian(sigma2, 200_000, rng.seeded(10))
    law_var = float(sigma2)  # Var N_Z(0, 1e10) = 1e10 to within e^{-2π²·1e10}
    se = (2 * law_var**2 / x.size) ** 0.5
    assert abs(float(np.mean(x.astype(np.float64) ** 2)) - law_var) < Z_CRIT * se
    assert abs(float(np.mean(x))) < Z_CRIT * (law_var / x.size) ** 0.5

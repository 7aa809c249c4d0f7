"""The production path end to end: both samplers driven by the production CSPRNG (ST9, W9, R9, P1).

Not seeded, so not deterministic: each of the 6 assertions fails with probability 1e-6 (ALPHA), i.e. this test
fails spuriously about once in 170,000 runs. It is the one test allowed to use production randomness.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from dasflow.privacy import rng, samplers
from tests.privacy_samplers.exact_law import (
    ALPHA,
    Z_CRIT,
    chi_square,
    gaussian_law,
    geometric_law,
    z_variance,
)

N = 2_000_000


@pytest.mark.slow
def test_csprng_mode_goodness_of_fit() -> None:
    g = rng.csprng()
    assert g.mode == "production"
    sigma2 = Fraction("12.16") ** 2
    x = samplers.discrete_gaussian(sigma2, N, g.spawn("dg"))
    law = gaussian_law(sigma2)
    assert chi_square(x, law)[2] > ALPHA
    assert abs(z_variance(x, law)) < Z_CRIT
    assert abs(float(x.mean())) < Z_CRIT * (float(law.variance) / N) ** 0.5
    y = samplers.two_sided_geometric(Fraction(2), N, g.spawn("geo"))
    glaw = geometric_law(Fraction(2))
    assert chi_square(y, glaw)[2] > ALPHA
    assert abs(z_variance(y, glaw)) < Z_CRIT
    assert abs(float(y.mean())) < Z_CRIT * (float(glaw.variance) / N) ** 0.5

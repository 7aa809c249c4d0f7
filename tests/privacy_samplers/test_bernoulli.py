"""Bernoulli(exp(-x)) primitive: exact P for x = 0, 1/2, 1, 3, 10⁴/3 (ST9, W9).

Fixed seeds. For a random seed each binomial (= 2-cell chi-square) assertion fails with probability ALPHA =
1e-6. x = 0 must always be True (P = 1) and x = 10⁴/3 always False (P = exp(-3333.3) < 1e-1447): any other
outcome is a bug, not bad luck.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from dasflow.privacy import rng, samplers
from tests.privacy_samplers.exact_law import ALPHA

N = 1_000_000


@pytest.mark.parametrize("x", [Fraction(1, 2), Fraction(1), Fraction(3), "0.5", Decimal(3)])
def test_bernoulli_exp_neg_rate(x: Fraction | str | Decimal) -> None:
    xf = samplers.as_rational(x, "x")
    g = rng.seeded(int(xf * 1000))
    out = samplers.bernoulli_exp_neg(x, N, g)
    assert out.dtype == np.bool_ and out.shape == (N,)
    p = float(decimal.Context(prec=50).exp(-Decimal(xf.numerator) / Decimal(xf.denominator)))
    k = int(out.sum())
    assert stats.binomtest(k, N, p).pvalue > ALPHA
    # Pearson chi-square on the two cells, as the spec asks (same test, reported for the record)
    assert stats.chisquare([k, N - k], [N * p, N * (1 - p)]).pvalue > ALPHA


def test_bernoulli_exp_neg_extremes() -> None:
    g = rng.seeded(1)
    assert samplers.bernoulli_exp_neg(0, N, g).all()
    assert not samplers.bernoulli_exp_neg(Fraction(10**4, 3), N, g).any()
    assert samplers.bernoulli_exp_neg(1, (3, 4), g).shape == (3, 4)
    assert samplers.bernoulli_exp_neg(1, 0, g).shape == (0,)

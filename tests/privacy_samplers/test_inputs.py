"""Bad parameters are refused with a ValueError naming the parameter and the value (ST9, W8, W9).

Floats are refused outright (a float cannot be told apart from float drift): the message says to pass a
Fraction.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from dasflow.privacy import rng, samplers

SAMPLERS = [
    ("sigma2", samplers.discrete_gaussian),
    ("scale", samplers.two_sided_geometric),
    ("x", samplers.bernoulli_exp_neg),
]


@pytest.mark.parametrize(("name", "fn"), SAMPLERS)
@pytest.mark.parametrize("bad", [-1, Fraction(-1, 3), Decimal("-0.5"), "-2", "-1/7"])
def test_negative_refused(name: str, fn: object, bad: object) -> None:
    assert callable(fn)
    with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got {re.escape(repr(bad))}$"):
        fn(bad, 5, rng.seeded(1))


@pytest.mark.parametrize(("name", "fn"), SAMPLERS)
@pytest.mark.parametrize("bad", [0.5, 1.0, float("nan"), float("inf"), np.float64(2.0)])
def test_float_refused_with_fraction_advice(name: str, fn: object, bad: object) -> None:
    assert callable(fn)
    with pytest.raises(ValueError, match=rf"{name} must be exact, got float .*pass a fractions\.Fraction"):
        fn(bad, 5, rng.seeded(1))


@pytest.mark.parametrize(("name", "fn"), SAMPLERS)
@pytest.mark.parametrize(
    "bad",
    [Decimal("NaN"), Decimal("Infinity"), "nan", "inf", "Infinity", "abc", "", "1/0", None, True, 3j, [1]],
)
def test_non_rational_refused(name: str, fn: object, bad: object) -> None:
    assert callable(fn)
    with pytest.raises(ValueError, match=rf"^{name} must"):
        fn(bad, 5, rng.seeded(1))


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (3, Fraction(3)),
        (Fraction(2, 3), Fraction(2, 3)),
        (Decimal("0.1"), Fraction(1, 10)),
        ("0.25", Fraction(1, 4)),
        (" 1e-3 ", Fraction(1, 1000)),
        ("1/3", Fraction(1, 3)),
        (np.int64(4), Fraction(4)),
        (0, Fraction(0)),
    ],
)
def test_accepted_rationals(value: object, want: Fraction) -> None:
    assert samplers.as_rational(value, "p") == want


def test_decimal_string_and_fraction_give_identical_noise() -> None:
    """'148.0' and Fraction(148) are the same parameter: the same seeded draws."""
    a = samplers.discrete_gaussian("148.0", 100, rng.seeded(4))
    b = samplers.discrete_gaussian(Fraction(148), 100, rng.seeded(4))
    assert np.array_equal(a, b)


def test_bad_size_and_generator() -> None:
    with pytest.raises(ValueError, match="size"):
        samplers.discrete_gaussian(1, -1, rng.seeded(1))
    with pytest.raises(ValueError, match="size"):
        samplers.two_sided_geometric(1, 2.5, rng.seeded(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="generator"):
        samplers.discrete_gaussian(1, 3, np.random.default_rng(1))  # type: ignore[arg-type]


def test_sigma2_beyond_table_range_refused_clearly() -> None:
    """σ > 1.6e6 (σ² > 2.6e12) would need a > 2^24-entry acceptance table: refused up front, naming sigma2."""
    with pytest.raises(ValueError, match=r"^sigma2 = 10000000000000 is too large"):
        samplers.discrete_gaussian(10**13, 3, rng.seeded(1))


@pytest.mark.parametrize("tiny", [Fraction(1, 10**6), Fraction(1, 10**12)])
def test_tiny_parameters_give_zero_noise(tiny: Fraction) -> None:
    """P(X != 0) < 1e-200 here: all draws are 0, and nothing overflows in exp(-x) for x ~ 1e12."""
    g = rng.seeded(2)
    assert not samplers.discrete_gaussian(tiny, 10_000, g).any()
    assert not samplers.two_sided_geometric(tiny, 10_000, g).any()

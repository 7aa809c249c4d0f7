"""Budget scaling goes through the accountant: σ² = Δ²/(2ρ), b = Δ/ε, exact Fractions."""

from __future__ import annotations

from fractions import Fraction

import pytest

from dasflow.errors import InputError
from dasflow.experiment.scaling import parse_scales, scale_label, scale_plan, scale_spec
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec


def _spec(defn: str = "zcdp", mech: str = "discrete_gaussian", budget: Fraction | None = Fraction(1, 6),
          sens: Fraction = Fraction(51), noise: Fraction = Fraction(153), variance: Fraction | float = Fraction(153),
          ) -> MeasurementSpec:
    return MeasurementSpec(product="p", key="k", level="state", privacy_defn=defn, mechanism=mech,  # type: ignore[arg-type]
                           budget=budget, sensitivity=sens, noise=noise, cells=3, variance=variance)


def test_gaussian_key_uses_its_effective_sensitivity() -> None:
    # a composed key (group sizes' chain): noise 153 at ρ = 1/6 is Δ² = 2·(1/6)·153 = 51, not the listed Δ
    spec = _spec()
    for f in (Fraction(1, 2), Fraction(2), Fraction(3, 7)):
        out = scale_spec(spec, f)
        assert out.budget == Fraction(1, 6) * f
        assert out.noise == accounting.gaussian_sigma2_sq(Fraction(1, 6) * f, 51) == Fraction(153) / f
        assert out.variance == out.noise and isinstance(out.noise, Fraction)
        assert (out.key, out.level, out.cells, out.sensitivity) == ("k", "state", 3, Fraction(51))


def test_plain_gaussian_matches_the_accountant_directly() -> None:
    rho = Fraction(1, 1250)
    spec = _spec(budget=rho, sens=Fraction(1), noise=accounting.gaussian_sigma2(rho, 1),
                 variance=accounting.gaussian_sigma2(rho, 1))
    out = scale_spec(spec, Fraction(4))
    assert out.noise == accounting.gaussian_sigma2(4 * rho, 1) == Fraction(625, 4)


def test_float_published_variance_scales_with_the_noise() -> None:
    out = scale_spec(_spec(variance=153.0), Fraction(2))
    assert out.variance == pytest.approx(76.5) and isinstance(out.variance, float)


def test_geometric_key_and_its_variance() -> None:
    eps = Fraction(1, 2)
    spec = _spec(defn="puredp", mech="two_sided_geometric", budget=eps, sens=Fraction(2), noise=Fraction(4),
                 variance=float(accounting.geometric_variance(Fraction(4))))
    out = scale_spec(spec, Fraction(2))
    assert out.budget == 1 and out.noise == accounting.geometric_scale(1, 2) == 2
    assert out.variance == pytest.approx(float(accounting.geometric_variance(Fraction(2))))


def test_unscalable_and_unchanged_keys() -> None:
    infinite = _spec(budget=None, noise=Fraction(0), variance=Fraction(0))
    assert scale_spec(infinite, Fraction(3)) is infinite
    assert scale_spec(_spec(), Fraction(1)) == _spec()
    with pytest.raises(InputError, match="cannot rescale"):
        scale_spec(_spec(mech="two_sided_geometric"), Fraction(2))
    with pytest.raises(InputError, match="positive"):
        scale_spec(_spec(), Fraction(0))
    assert [s.noise for s in scale_plan([_spec(), infinite], Fraction(3))] == [51, 0]


def test_parse_and_label_scales() -> None:
    scales = parse_scales("0.5, 1,2,1/3")
    assert scales == (Fraction(1, 2), Fraction(1), Fraction(2), Fraction(1, 3))
    assert [scale_label(s) for s in scales] == ["0.5", "1", "2", "1/3"]
    for bad, why in (("0", "positive"), ("-1", ">= 0"), ("1,1.0", "twice"), ("x", "budget-scale")):
        with pytest.raises(InputError, match=why):
            parse_scales(bad)

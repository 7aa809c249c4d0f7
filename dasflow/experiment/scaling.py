"""Budget sweeps: a product's plan with every key's budget multiplied by one exact factor.

The noise of a scaled key is recomputed through the accountant the products use, never hand-scaled:

* zCDP, discrete Gaussian: the plan's key satisfies σ² = Δ²/(2ρ) for its effective squared sensitivity Δ²
  (after the product's stability and composition factors), so Δ² = 2ρσ² and the scaled key gets
  ``accounting.gaussian_sigma2_sq(ρ·f, Δ²)`` = σ²/f;
* pure DP, two-sided geometric: b = Δ/ε, so Δ = εb and the scaled key gets ``accounting.geometric_scale(ε·f,
  Δ)`` = b/f, with the published variance ``accounting.geometric_variance`` of the new scale.

A key with an infinite budget (no noise) stays as it is. Any other (definition, mechanism) pair is refused: its
noise is not a function of the budget this module can recompute exactly. Privacy: the scaled plan is what the
experiment *simulates*; nothing here spends a budget (an experiment never touches a ledger).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.products.base import MeasurementSpec


def parse_scales(text: str) -> tuple[Fraction, ...]:
    """``"0.5,1,2"`` → exact positive factors, in the given order, without repeats (``InputError`` otherwise)."""
    out: list[Fraction] = []
    for item in text.split(","):
        try:
            value = accounting.parse_rational(item.strip(), "--budget-scale")
        except ValueError as exc:
            raise InputError(str(exc), column="--budget-scale") from None
        if value <= 0:
            raise InputError(f"budget scale {item.strip()!r} must be positive", column="--budget-scale")
        if value in out:
            raise InputError(f"budget scale {item.strip()!r} is listed twice", column="--budget-scale")
        out.append(value)
    return tuple(out)


def scale_label(factor: Fraction) -> str:
    """Display form of a factor: an exact decimal where one exists (``0.5``, ``2``), else ``p/q``."""
    d = factor.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    if d != 1:
        return f"{factor.numerator}/{factor.denominator}"
    text = f"{float(factor):.12f}".rstrip("0").rstrip(".")
    return text if Fraction(text) == factor else f"{factor.numerator}/{factor.denominator}"


def scale_spec(spec: MeasurementSpec, factor: Fraction) -> MeasurementSpec:
    """The key with budget·factor and the noise and published variance the accountant gives that budget."""
    if factor <= 0:
        raise InputError(f"budget scale {factor} must be positive", column="--budget-scale")
    if factor == 1 or spec.budget is None or spec.noise == 0:
        return spec
    budget = spec.budget * factor
    variance: Fraction | float
    if spec.privacy_defn == "zcdp" and spec.mechanism == "discrete_gaussian":
        noise = accounting.gaussian_sigma2_sq(budget, 2 * spec.budget * spec.noise)
        if isinstance(spec.variance, Fraction):
            variance = spec.variance * noise / spec.noise
        else:
            variance = float(Fraction(spec.variance) * noise / spec.noise)
    elif spec.privacy_defn == "puredp" and spec.mechanism == "two_sided_geometric":
        noise = accounting.geometric_scale(budget, spec.budget * spec.noise)
        variance = float(accounting.geometric_variance(noise))
    else:
        raise InputError(f"{spec.key}: cannot rescale a {spec.mechanism} key under {spec.privacy_defn} exactly",
                         column="--budget-scale")
    return dataclasses.replace(spec, budget=budget, noise=noise, variance=variance)


def scale_plan(specs: Sequence[MeasurementSpec], factor: Fraction) -> list[MeasurementSpec]:
    """Every key of a plan scaled by ``factor`` (:func:`scale_spec`)."""
    return [scale_spec(s, factor) for s in specs]

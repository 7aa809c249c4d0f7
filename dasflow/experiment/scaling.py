"""Budget sweeps: a product's plan with every key's budget multiplied by one exact factor.

The noise of a scaled key is recomputed through the accountant the products use, never hand-scaled:

* zCDP, discrete Gaussian: the plan's key satisfies σ² = Δ²/(2ρ) for its effective squared sensitivity Δ²
  (after the product's stability and composition factors), so Δ² = 2ρσ² and the scaled key gets
  ``accounting.gaussian_sigma2_sq(ρ·f, Δ²)`` = σ²/f;
* pure DP, two-sided geometric: b = Δ/ε, so Δ = εb and the scaled key gets ``accounting.geometric_scale(ε·f,
  Δ)`` = b/f, with the published variance ``accounting.geometric_variance`` of the new scale.

A key's detail budgets scale with it: SafeTab-P's stage-2 key also draws its TotalOnly counts with
``detail["total_only_noise"]`` at ``detail["total_only_budget"]`` (recomputed the same way), and its
``per_query_budget`` and ``level_budget`` are multiplied by the factor. A key with an infinite budget (no noise)
stays as it is. Any other (definition, mechanism) pair is refused: its noise is not a function of the budget this
module can recompute exactly.

**Budget splits** (:func:`parse_split`, :func:`split_plan`): ``PRODUCT:LEVEL=WEIGHT,LEVEL=WEIGHT`` re-weights the
named plan levels of one product while keeping its total: the listed levels' combined budget B is shared in
proportion to the weights (level L gets B·w_L/Σw, exactly), unlisted levels keep theirs, and every key of level
L is scaled by its level's factor (:func:`scale_spec`), so Σ of the product's key budgets is unchanged exactly.

Privacy: the scaled plan is what the experiment *simulates*; nothing here spends a budget (an experiment never
touches a ledger).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec


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


def _scale_detail(spec: MeasurementSpec, factor: Fraction) -> dict[str, Any]:
    """The key's detail with its own budgets scaled (SafeTab-P: TotalOnly noise, per-query and level budgets)."""
    d = dict(spec.detail)
    tob = d.get("total_only_budget")
    if tob is not None and "total_only_noise" in d:
        tob, noise = Fraction(tob), Fraction(d["total_only_noise"])
        new = tob * factor
        if spec.privacy_defn == "zcdp":
            scaled = accounting.gaussian_sigma2_sq(new, 2 * tob * noise)
            d.update(total_only_variance=scaled)
        else:
            scaled = accounting.geometric_scale(new, tob * noise)
            d.update(total_only_variance=float(accounting.geometric_variance(scaled)))
        d.update(total_only_budget=new, total_only_noise=scaled)
    for name in ("per_query_budget", "level_budget"):
        if d.get(name) is not None:
            d[name] = Fraction(d[name]) * factor
    return d


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
    return dataclasses.replace(spec, budget=budget, noise=noise, variance=variance,
                               detail=_scale_detail(spec, factor))


def scale_plan(specs: Sequence[MeasurementSpec], factor: Fraction) -> list[MeasurementSpec]:
    """Every key of a plan scaled by ``factor`` (:func:`scale_spec`)."""
    return [scale_spec(s, factor) for s in specs]


# ------------------------------------------------------------------------------------------------ splits
@dataclass(frozen=True)
class Split:
    """A candidate budget split of one product: plan level → weight (as written), and its label."""

    product: str
    weights: tuple[tuple[str, Fraction], ...]
    label: str


_ITEM = re.compile(r"\s*([^=]+?)\s*=\s*([^,]+?)\s*(?:,|$)")


def _norm(level: str) -> str:
    return re.sub(r"\s+", "", level).lower()


def parse_split(text: str) -> Split:
    """``"safetab-p:(USA, 1)=2,(STATE, 1)=1"`` → a :class:`Split` (exact positive weights; a level's name may
    contain commas, never ``=``). ``InputError`` naming ``--budget-split`` otherwise."""
    product, sep, rest = text.partition(":")
    if not sep or not product.strip() or not rest.strip():
        raise InputError(f"budget split {text!r} is not PRODUCT:LEVEL=WEIGHT,...", column="--budget-split")
    weights: list[tuple[str, Fraction]] = []
    pos = 0
    while pos < len(rest):
        m = _ITEM.match(rest, pos)
        if m is None or m.end() == pos:
            raise InputError(f"budget split {text!r}: cannot read {rest[pos:]!r} as LEVEL=WEIGHT",
                             column="--budget-split")
        level, raw = m.group(1), m.group(2)
        try:
            w = accounting.parse_rational(raw, "--budget-split")
        except ValueError as exc:
            raise InputError(str(exc), column="--budget-split") from None
        if w <= 0:
            raise InputError(f"budget split {text!r}: weight of {level!r} must be positive", column="--budget-split")
        if any(_norm(level) == _norm(seen) for seen, _ in weights):
            raise InputError(f"budget split {text!r}: level {level!r} is listed twice", column="--budget-split")
        weights.append((level, w))
        pos = m.end()
    return Split(product.strip(), tuple(weights), text.strip())


def split_factors(specs: Sequence[MeasurementSpec], split: Split) -> dict[str, Fraction]:
    """Plan level → exact factor of a split: B·w_L/Σw ÷ B_L for listed levels, 1 for the others."""
    levels: dict[str, Fraction] = {}
    for s in specs:
        if s.budget is None:
            raise InputError(f"{s.key}: an infinite budget cannot be split", column="--budget-split")
        levels[s.level] = levels.get(s.level, Fraction(0)) + s.budget
    by_norm = {_norm(lv): lv for lv in levels}
    chosen: dict[str, Fraction] = {}
    for name, w in split.weights:
        if _norm(name) not in by_norm:
            raise InputError(f"budget split of {split.product}: no plan level {name!r}; levels: "
                             f"{', '.join(levels)}", column="--budget-split")
        chosen[by_norm[_norm(name)]] = w
    if any(levels[lv] == 0 for lv in chosen):
        raise InputError(f"budget split of {split.product}: a listed level has budget 0", column="--budget-split")
    pool = sum((levels[lv] for lv in chosen), Fraction(0))
    total_w = sum(chosen.values(), Fraction(0))
    return {lv: (pool * chosen[lv] / total_w) / levels[lv] if lv in chosen else Fraction(1) for lv in levels}


def split_plan(specs: Sequence[MeasurementSpec], split: Split) -> list[MeasurementSpec]:
    """Every key of the product's plan scaled by its level's split factor (:func:`scale_spec`)."""
    factors = split_factors(specs, split)
    return [scale_spec(s, factors[s.level]) for s in specs]

"""Exact composition of a release plan: what the ledger checks against the cap and records.

Each planned measurement is a mechanism with the planned budget applied to a transformation whose stability
the product already folded into the key's sensitivity (the noise is calibrated to it), so each key is one
``accounting.Spend`` with stability 1 and the plan composes sequentially (``accounting.compose``): zCDP budgets
add, pure-DP entries count ε²/2 under zCDP (Bun & Steinke 2016, Prop. 1.4), all-pure plans also add in ε. An
infinite budget (no noise) makes the total infinite. The (ε, δ = 1e-10) figure is the smaller of the sound
conversions the accounting module computes, and the method used is recorded with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec

DELTA = Fraction(1, 10**10)


@dataclass(frozen=True)
class PlanTotal:
    """Exact totals of a plan and its (ε, δ) conversion."""

    rho: Fraction | None
    epsilon: Fraction | None
    all_pure: bool
    entries: int
    eps_at_delta: Decimal | None
    conversion: str

    def as_record(self) -> dict[str, Any]:
        return {
            "rho": "Infinity" if self.rho is None else str(self.rho),
            "epsilon_pure": None if not self.all_pure else ("Infinity" if self.epsilon is None else
                                                            str(self.epsilon)),
            "all_pure": self.all_pure,
            "entries": self.entries,
            "delta": str(DELTA),
            "epsilon_at_delta": None if self.eps_at_delta is None else f"{self.eps_at_delta:.6f}",
            "conversion": self.conversion,
        }


def compose_plan(specs: Iterable[MeasurementSpec]) -> PlanTotal:
    """Sequential composition of the planned keys (see the module docstring)."""
    spends = [accounting.Spend(definition=s.privacy_defn, budget=s.budget, label=s.key) for s in specs]
    if not spends:
        return PlanTotal(Fraction(0), Fraction(0), True, 0, Decimal(0), "empty plan")
    total = accounting.compose(spends, DELTA, rdp=False)
    if total.is_infinite:
        return PlanTotal(None, None, total.is_pure, len(spends), None, "infinite budget: no guarantee")
    best = total.best
    return PlanTotal(total.rho, total.epsilon, total.is_pure, len(spends),
                     None if best is None else best.epsilon, "" if best is None else best.method)


def budget_sum(specs: Iterable[MeasurementSpec]) -> Fraction | None:
    """The plain sum of the planned budgets (ρ for a zCDP plan, ε for a pure-DP plan; ``None`` if any is
    infinite): a single-definition product's sequential total in its own unit."""
    total = Fraction(0)
    for spec in specs:
        if spec.budget is None:
            return None
        total += spec.budget
    return total

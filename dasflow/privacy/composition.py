"""Exact composition of a release plan (what the ledger checks against the cap and records).

Every planned measurement is a mechanism applied to a stable transformation whose stability is already in its
sensitivity, so the plan composes sequentially: zCDP budgets add (ρ = Σ ρ_i); a pure-DP entry with budget ε_i is
ε_i-DP and hence (ε_i²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4), so mixed plans compose under zCDP. An all-pure
plan also composes to ε = Σ ε_i. An infinite budget (no noise) makes the total infinite (``None``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from dasflow.products.base import MeasurementSpec

DELTA = Fraction(1, 10**10)


@dataclass(frozen=True)
class PlanTotal:
    """Exact totals of a plan: ρ (all entries under zCDP), ε when every entry is pure DP, and the (ε, δ)
    conversion at δ = 1e-10 with the method used."""

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
    """Exact sequential composition of the planned entries (see the module docstring)."""
    from dasflow.privacy import accounting

    rho: Fraction | None = Fraction(0)
    eps: Fraction | None = Fraction(0)
    all_pure = True
    n = 0
    for spec in specs:
        n += 1
        if spec.privacy_defn == "zcdp":
            all_pure = False
            if spec.budget is None or rho is None:
                rho = None
            else:
                rho += spec.budget
        elif spec.privacy_defn == "puredp":
            if spec.budget is None:
                rho, eps = None, None
            else:
                if rho is not None:
                    rho += accounting.puredp_to_zcdp(spec.budget)
                if eps is not None:
                    eps += spec.budget
        else:
            raise ValueError(f"{spec.key}: unknown privacy definition {spec.privacy_defn!r}")
    if rho is None:
        return PlanTotal(None, None if all_pure else None, all_pure, n, None, "infinite budget: no guarantee")
    eps_delta = accounting.zcdp_to_approx_dp(rho, DELTA)
    return PlanTotal(rho, eps if all_pure else None, all_pure, n, eps_delta.epsilon, eps_delta.method)

"""Shared plan builders for the accounting tests (SafeTab-P levels as the paper's Theorems 1-3 compose
them)."""

from __future__ import annotations

from fractions import Fraction

from dasflow.privacy.accounting import Parallel, Sequential, Spend

S = 9  # Δ(g_i) = 9 for every level (SafeTab App. F)
GAMMA = Fraction(1, 10)  # γ (SafeTab App. F)

#: SafeTab Table 4 (= Table 1) as printed: level, MOE, geometric ε Step 2, ε Total, DGauss ρ Step 2, ρ Total.
TABLE4 = (
    ("Nation, Detailed", 6, "3.84", "4.27", "0.481", "0.534"),
    ("State, Detailed", 6, "3.84", "4.27", "0.481", "0.534"),
    ("County, Detailed", 11, "2.24", "2.49", "0.143", "0.159"),
    ("AIANNH, Detailed", 11, "2.24", "2.49", "0.143", "0.159"),
    ("Nation, Regional", 50, "0.531", "0.59", "0.007", "0.008"),
    ("State, Regional", 50, "0.531", "0.59", "0.007", "0.008"),
    ("County, Regional", 50, "0.531", "0.59", "0.007", "0.008"),
)


def safetab_level(definition: str, level_budget: Fraction, *, s: int = S, gamma: Fraction = GAMMA,
                  total_only: bool = True, two_stage: bool = True) -> Parallel:
    """One population-group level of SafeTab Algorithm 1: s group calls per record (generalized parallel
    composition, degree s), each call with budget ρ_i/s; a call is either TotalOnly (one count with ρ_i/s) or
    the two-stage branch (stage 1 γρ_i/s, then the Step-2 cells — disjoint, degree 1 — with (1−γ)ρ_i/s)."""
    per = level_budget / s
    parts: list[Spend | Sequential | Parallel] = []
    if total_only:
        parts.append(Spend(definition, per, label="total_only"))  # type: ignore[arg-type]
    if two_stage:
        parts.append(Sequential((Spend(definition, gamma * per, label="stage1"),  # type: ignore[arg-type]
                                 Parallel((Spend(definition, (1 - gamma) * per,  # type: ignore[arg-type]
                                                 label="step2"),), degree=1))))
    return Parallel(tuple(parts), degree=s, label="level")


def safetab_plan(definition: str, totals: list[Fraction], **kw: object) -> list[Parallel]:
    return [safetab_level(definition, t, **kw) for t in totals]  # type: ignore[arg-type]


def table4_totals(definition: str) -> list[Fraction]:
    column = 3 if definition == "puredp" else 5
    return [Fraction(str(row[column])) for row in TABLE4]

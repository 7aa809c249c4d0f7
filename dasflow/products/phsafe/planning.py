"""The data-independent PHSafe budget plan (R2, R9, R12, R15) and the Table-10 parameter calculator (R13).

One :class:`MeasurementSpec` per tabulated (table, level) — a level whose budget is 0 is not in the plan. Key
``"<table>/<level>"``, e.g. ``"PH3/state_A-G"``.

Privacy argument. The level vector of a table is a count over disjoint (group, cell) pairs of a c-stable
transformation of the base person data (c = 2τ+2 for join tables, Lemma 6; c = 2 for unit tables, a person's
change re-derives one unit record). Its L2 and L1 sensitivity is therefore c; the spec records Δ₂² = c² under
zcdp and Δ₁ = c under puredp (the ``MeasurementSpec`` convention), and

* zcdp: discrete Gaussian with σ² = Δ₂²/(2ρ) = c²/(2ρ) is ρ-zCDP (Canonne–Kamath–Steinke), so the ledger charges ρ
  per level;
* puredp: two-sided geometric with scale b = Δ₁/ε = c/ε is ε-DP;

and sequential composition over the plan gives the execution's total (US 1.257281 for the Table-10 budgets).
σ² and b come from :mod:`dasflow.privacy.accounting`, never from a local formula. Bounded-neighbour loss is 2× the
unbounded one (Theorems 3–4); :func:`bounded_total` reports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from dasflow.privacy import accounting
from dasflow.privacy.composition import budget_sum
from dasflow.products.base import MeasurementSpec
from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.tables import ITERATIONS, MEASURED, level_parts

PRODUCT = "phsafe"
NOISE_NAMES = {"zcdp": "Discrete Gaussian", "puredp": "Two-Sided Geometric"}
#: The MOE convention of Table 10 (phsafe.md §5): z = 1.645, no +1 (the accountant's PHSAFE_Z90).
Z90 = accounting.PHSAFE_Z90


def stability(config: PHSafeConfig, table: str) -> Fraction:
    """c: 2τ+2 for a join table (Lemma 6), 2 for a unit table."""
    if MEASURED[table].kind == "join":
        return Fraction(2 * config.tau[table] + 2)
    return Fraction(2)


def geometric_variance(scale: Fraction) -> float:
    """Variance 2a/(1-a)² (a = e^{-1/b}) of the two-sided geometric (accountant); float, display only."""
    return float(accounting.geometric_variance(scale))


def cells_of(config: PHSafeConfig, table: str, level: str) -> int:
    """Number of public cells of one level: regions x iterations x basis cells (R11)."""
    geo, it = level_parts(level)
    n_regions = 1 if geo == "usa" else len(config.state_filter)
    return n_regions * len(ITERATIONS[it]) * len(MEASURED[table].cells)


def plan(config: PHSafeConfig) -> list[MeasurementSpec]:
    """Every measurement of one execution (US or PR), before any data is read."""
    specs: list[MeasurementSpec] = []
    for table, tdef in MEASURED.items():
        c = stability(config, table)
        for level in tdef.level_keys:
            if not config.tabulated(table, level):
                continue
            budget = config.budgets[table][level]
            # the accountant's spelling of an infinite budget (its parse_budget refuses a bare None)
            b_arg: Fraction | str = "Infinity" if budget is None else budget
            variance: Fraction | float
            if config.privacy_defn == "zcdp":
                sensitivity = c * c  # Δ₂² of the level vector
                noise = accounting.gaussian_sigma2_sq(b_arg, sensitivity)
                variance = noise
                mechanism = "discrete_gaussian"
            else:
                sensitivity = c  # Δ₁ of the level vector
                noise = accounting.geometric_scale(b_arg, sensitivity)
                variance = geometric_variance(noise)
                mechanism = "two_sided_geometric"
            specs.append(MeasurementSpec(
                product=PRODUCT, key=f"{table}/{level}", level=level, privacy_defn=config.privacy_defn,
                mechanism="none" if budget is None else mechanism,  # type: ignore[arg-type]
                budget=budget, sensitivity=sensitivity, noise=Fraction(noise), cells=cells_of(config, table, level),
                variance=variance,
                detail={"table": table, "tau": config.tau.get(table), "kind": tdef.kind,
                        "noise_distribution": NOISE_NAMES[config.privacy_defn],
                        "universe": config.universe},
            ))
    return specs


def total(specs: Iterable[MeasurementSpec]) -> Fraction | None:
    """Sequential composition: the sum of the planned budgets (None if any level has an infinite budget)."""
    return budget_sum(specs)


def config_total(config: PHSafeConfig) -> Fraction | None:
    """The sum of every configured budget (what the plan's total must equal)."""
    s = Fraction(0)
    for levels in config.budgets.values():
        for b in levels.values():
            if b is None:
                return None
            s += b
    return s


def bounded_total(specs: Iterable[MeasurementSpec]) -> Fraction | None:
    """Bounded-neighbour (change one record) loss: 2× the unbounded total (Theorems 3–4)."""
    t = total(specs)
    return None if t is None else 2 * t


def rho_for_moe(c: int | Fraction, moe: int | Fraction, digits: int = 6) -> Fraction:
    """The PHExplore-equivalent calculator (R13): ρ = (1.645·c)² / (2·MOE²) from the accountant, rounded
    half-up to ``digits`` decimals (Table 10 prints 6)."""
    return accounting.round_rational(accounting.phsafe_rho_for_moe(c, moe), digits, "half_up")


def moe_for_rho(c: int | Fraction, rho: Fraction) -> float:
    """The achieved 90% MOE 1.645·c/√(2ρ) of a discrete-Gaussian cell (display only)."""
    return float(accounting.phsafe_moe(c, rho))

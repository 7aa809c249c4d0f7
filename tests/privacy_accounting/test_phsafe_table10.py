"""PHSafe Table 10 and the S-DHC privacy totals (requirements R9, R12, R13, R15; spec phsafe.md §4-§5).

Table 10 rows: (table, τ, c = 2τ+2 or 2) × levels (Nation *, A-G, H-I | State * | State A-G | State H-I) →
MOE target and the unbounded ρ (bounded = 2 × unbounded). The calculator is ρ = (1.645·c)²/(2·MOE²) rounded
half-up to 6 decimals.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from dasflow.privacy import accounting as acc

# (table, c) → [(level, MOE, unbounded ρ printed, bounded ρ printed)]
NATION, STATE_STAR, STATE_AG, STATE_HI = "Nation *, A-G, H-I", "State *", "State A-G", "State H-I"
_JOIN10 = [(NATION, 500, "0.002619", "0.005238"), (STATE_STAR, 200, "0.016371", "0.032742"),
           (STATE_AG, 68, "0.141622", "0.283244"), (STATE_HI, 200, "0.016371", "0.032742")]
_UNIT = [(NATION, 500, "0.000022", "0.000044"), (STATE_STAR, 200, "0.000135", "0.00027"),
         (STATE_AG, 68, "0.00117", "0.00234"), (STATE_HI, 200, "0.000135", "0.00027")]
_JOIN6 = [(NATION, 500, "0.001061", "0.002122"), (STATE_STAR, 200, "0.006630", "0.01326"),
          (STATE_AG, 20, "0.662976", "1.325952"), (STATE_HI, 200, "0.006630", "0.01326")]
TABLE10: dict[str, tuple[int, list[tuple[str, int, str, str]]]] = {
    "PH1_num": (22, _JOIN10),
    "PH1_denom": (2, _UNIT),
    "PH2": (22, [(NATION.replace(", A-G, H-I", ""), 500, "0.002619", "0.005238"),
                 (STATE_STAR, 200, "0.016371", "0.032742")]),
    "PH3": (14, _JOIN6),
    "PH4": (22, _JOIN10),
    "PH5_denom": (2, _UNIT),
    "PH6": (14, [(NATION.replace(", A-G, H-I", ""), 500, "0.001061", "0.002122"),
                 (STATE_STAR, 200, "0.006630", "0.01326")]),
    "PH7": (22, _JOIN10),
    "PH8_denom": (2, _UNIT),
}
_ROWS = [(t, c, *row) for t, (c, rows) in TABLE10.items() for row in rows]


@pytest.mark.parametrize("row", _ROWS, ids=[f"{r[0]}-{r[2]}" for r in _ROWS])
def test_r13_table10_every_row(row: tuple[str, int, str, int, str, str]) -> None:
    """R13: round((1.645·c)²/(2·MOE²), 6) == the printed unbounded ρ; bounded == 2 × unbounded (PHSafe Thm 3-4,
    ``unbounded_to_bounded(method='phsafe')``) == the printed bounded ρ."""
    _table, c, _level, moe, unbounded, bounded = row
    exact = acc.phsafe_rho_for_moe(c, moe)
    assert exact == (Fraction("1.645") * c) ** 2 / (2 * moe * moe)
    rho = acc.round_rational(exact, 6, "half_up")
    assert rho == Fraction(unbounded)
    assert acc.unbounded_to_bounded(rho, "zcdp", "phsafe") == Fraction(bounded) == 2 * rho


def test_r13_intermediate_values() -> None:
    """Spec §5 'intermediate values' (7 decimals) for every (c, MOE) pair of Table 10."""
    want = {(22, 500): "0.0026194", (22, 200): "0.0163715", (22, 68): "0.1416216", (2, 500): "0.0000216",
            (2, 200): "0.0001353", (2, 68): "0.0011704", (14, 500): "0.0010608", (14, 200): "0.0066298",
            (14, 20): "0.6629761"}
    for (c, moe), value in want.items():
        assert acc.round_rational(acc.phsafe_rho_for_moe(c, moe), 7, "half_up") == Fraction(value)


def test_r13_z_1645_not_16449() -> None:
    """Spec §5: 1.6449 fails the 6-decimal match for State rows; 1.645 matches every row."""
    rho_1645 = acc.round_rational(acc.phsafe_rho_for_moe(22, 200), 6)
    rho_16449 = acc.round_rational(acc.phsafe_rho_for_moe(22, 200, z=Fraction("1.6449")), 6)
    assert rho_1645 == Fraction("0.016371") != rho_16449


# spec §5: σ² = c²/(2ρ) at the rounded production ρ, σ, and the achieved MOE 1.645σ
SIGMA_TABLE = [(22, "0.002619", "92401.7", "303.98", "500.04"),
               (22, "0.016371", "14782.2", "121.58", "200.00"),
               (22, "0.141622", "1708.8", "41.34", "68.00"), (14, "0.001061", "92365.7", "303.92", "499.94"),
               (14, "0.006630", "14781.3", "121.58", "200.00"), (14, "0.662976", "147.8", "12.16", "20.00"),
               (2, "0.000022", "90909.1", "301.51", "495.99"), (2, "0.000135", "14814.8", "121.72", "200.22"),
               (2, "0.00117", "1709.4", "41.34", "68.01")]


@pytest.mark.parametrize("case", SIGMA_TABLE, ids=[f"c{c[0]}-rho{c[1]}" for c in SIGMA_TABLE])
def test_r9_r15_variance_column(case: tuple[int, str, str, str, str]) -> None:
    """R9 / R15: VARIANCE = σ² = c²/(2ρ) exactly (e.g. PH3 State A-G 196/(2·0.662976) = 147.82); σ and the
    achieved 90 % MOE match the spec's table. Both parametrisations agree: a c-sensitive query with ρ_i, or a
    sensitivity-1 query with ρ_i/c² behind a c-stable transformation (loss c²·ρ_i/c² = ρ_i)."""
    c, rho_s, sigma2_s, sigma_s, moe_s = case
    rho = Fraction(rho_s)
    sigma2 = acc.gaussian_sigma2(rho, c)
    assert sigma2 == Fraction(c * c) / (2 * rho)
    assert round(Decimal(sigma2.numerator) / Decimal(sigma2.denominator), 1) == Decimal(sigma2_s)
    assert round(acc.to_decimal(sigma2).sqrt(), 2) == Decimal(sigma_s)
    assert round(acc.phsafe_moe(c, rho), 2) == Decimal(moe_s)
    direct = acc.Spend("zcdp", rho, sensitivity=Fraction(c))
    staged = acc.Spend("zcdp", rho / (c * c), sensitivity=Fraction(1), stability=Fraction(c))
    assert direct.noise() == staged.noise() == sigma2
    assert direct.rho_loss() == staged.rho_loss() == rho


def test_r15_ph3_state_ag_variance() -> None:
    """R15: PH3 State A-G VARIANCE = 196/(2·0.662976) = 147.82."""
    assert round(float(acc.gaussian_sigma2(Fraction("0.662976"), 14)), 2) == 147.82


_LEVELS_US = {  # per measured table: the budgets of its levels (Nation ×3 | State *, A-G, H-I)
    t: [Fraction(r[2]) for r in rows for _ in range(3 if r[0].startswith("Nation *, A-G") else 1)]
    for t, (_c, rows) in TABLE10.items()
}
_LEVELS_PR = {t: [Fraction(r[2]) for r in rows if not r[0].startswith("Nation")]
              for t, (_c, rows) in TABLE10.items()}


def _plan(levels: dict[str, list[Fraction]]) -> list[acc.Spend]:
    return [acc.Spend("zcdp", rho, sensitivity=Fraction(TABLE10[t][0]), label=f"{t}#{i}")
            for t, rhos in levels.items() for i, rho in enumerate(rhos)]


def test_r12_per_table_sums_and_us_pr_totals() -> None:
    """R12: per-table sums (PH1_num 0.182221, PH1_denom 0.001506, PH2 0.018990, PH3 0.679419, PH6 0.007691);
    US total unbounded 1.257281, bounded 2.514562; PR (state levels only) 1.226649, bounded 2.453298;
    PH5_num / PH8_num are derived and charged 0."""
    sums = {t: sum(v, Fraction(0)) for t, v in _LEVELS_US.items()}
    assert sums["PH1_num"] == sums["PH4"] == sums["PH7"] == Fraction("0.182221")
    assert sums["PH1_denom"] == sums["PH5_denom"] == sums["PH8_denom"] == Fraction("0.001506")
    assert (sums["PH2"], sums["PH3"], sums["PH6"]) == (Fraction("0.018990"), Fraction("0.679419"),
                                                       Fraction("0.007691"))
    derived = [acc.Spend("zcdp", Fraction(0), label=name) for name in ("PH5_num", "PH8_num")]
    us = acc.compose([*_plan(_LEVELS_US), *derived], rdp=False)
    pr = acc.compose(_plan(_LEVELS_PR), rdp=False)
    assert us.rho == Fraction("1.257281") and pr.rho == Fraction("1.226649")
    assert acc.unbounded_to_bounded(us.rho, "zcdp") == Fraction("2.514562")
    assert acc.unbounded_to_bounded(pr.rho, "zcdp") == Fraction("2.453298")
    assert acc.unbounded_to_bounded(us.rho, "zcdp", "group") == 4 * Fraction("1.257281")


def test_r12_epsilon_at_delta_1e10() -> None:
    """Spec §4 [NS]: ρ + 2√(ρ ln(1/δ)) at δ = 1e-10: US unbounded ≈ 12.02, US bounded ≈ 17.73, PR ≈ 11.86.
    The ledger's default conversion (the better of analytic and the CKS grid) is never larger."""
    for rho, want in (("1.257281", "12.02"), ("2.514562", "17.73"), ("1.226649", "11.86")):
        analytic = acc.zcdp_to_approx_dp(Fraction(rho), acc.DELTA, method="analytic")
        assert round(analytic.epsilon, 2) == Decimal(want)
        best = acc.zcdp_to_approx_dp(Fraction(rho))
        assert best.epsilon <= analytic.epsilon


def test_r12_zero_budget_level_draws_no_noise() -> None:
    """R2/R12: a zero-budget level is not tabulated: it costs 0 and has no noise scale (ValueError, not ∞)."""
    spend = acc.Spend("zcdp", Fraction(0), sensitivity=Fraction(22))
    assert spend.rho_loss() == 0
    with pytest.raises(ValueError, match="rho=0"):
        spend.noise()


def test_pitfall_sensitivity_one_on_join_underestimates_loss() -> None:
    """Spec §8: calibrating to sensitivity 1 on the joined view inflates the real loss by (2τ+2)²: ×484 (τ=10),
    ×196 (τ=6)."""
    for tau, factor in ((10, 484), (6, 196)):
        c = 2 * tau + 2
        wrong = acc.Spend("zcdp", Fraction("0.01"), sensitivity=Fraction(1), stability=Fraction(c))
        assert wrong.rho_loss() == factor * Fraction("0.01")
        assert acc.stability_scale(Fraction("0.01"), c, "zcdp") == factor * Fraction("0.01")

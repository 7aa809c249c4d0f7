"""The plan model and its composition rules (SafeTab Lemmas 1-3, 9-12, Theorems 1-3; PHSafe Lemma 2, L4;
group-size P2; ST5, ST12, ST17, ST20)."""

from __future__ import annotations

import json
from decimal import Decimal
from fractions import Fraction
from typing import Literal

import pytest

from dasflow.privacy import accounting as acc
from tests.privacy_accounting._plans import safetab_level


def test_spend_loss_rules() -> None:
    """zCDP: z·c²·ρ; pure DP: z·c·ε; pure inside zCDP: z·(cε)²/2; noise Δ²/(2ρ) and Δ/ε."""
    z = acc.Spend("zcdp", Fraction(1, 10), sensitivity=Fraction(3), stability=Fraction(2), degree=5)
    assert z.rho_loss() == 5 * 4 * Fraction(1, 10) and z.noise() == Fraction(9, 2) * 10
    assert z.mechanism == "discrete_gaussian"
    with pytest.raises(ValueError, match="no pure-DP loss"):
        z.epsilon_loss()
    p = acc.Spend("puredp", Fraction(1, 2), sensitivity=Fraction(2), stability=Fraction(3), degree=4)
    assert p.epsilon_loss() == 4 * 3 * Fraction(1, 2) and p.rho_loss() == 4 * Fraction(3, 2) ** 2 / 2
    assert p.noise() == 4 and p.mechanism == "two_sided_geometric"


def test_sequential_and_parallel() -> None:
    """Sequential sums (Lemmas 1-3); Parallel with degree z is z × the max over its parts (Lemmas 9, 10)."""
    a, b = acc.Spend("zcdp", Fraction(1, 10)), acc.Spend("zcdp", Fraction(3, 10))
    assert acc.compose(acc.Sequential((a, b)), rdp=False).rho == Fraction(2, 5)
    assert acc.compose(acc.Parallel((a, b), degree=4), rdp=False).rho == Fraction(6, 5)
    assert acc.compose([a, b], rdp=False).rho == Fraction(2, 5)  # an iterable composes sequentially
    assert acc.parallel_compose(Fraction(1, 10), 9) == Fraction(9, 10)
    assert acc.stability_scale(Fraction(1, 2), 3, "puredp") == Fraction(3, 2)
    assert acc.stability_scale(Fraction(1, 2), 3, "zcdp") == Fraction(9, 2)


def test_st5_safetab_level_composes_to_level_budget() -> None:
    """ST5 / Theorems 1, 3: each group call gets ρ_i/s (stage 1 γρ_i/s, Step 2 (1−γ)ρ_i/s, TotalOnly ρ_i/s);
    a record reaches ≤ s calls, so the level costs exactly ρ_i, for both mechanisms."""
    for defn, budget in (("zcdp", Fraction("0.534")), ("puredp", Fraction("4.27"))):
        level = safetab_level(defn, budget)
        leaves = {s.label: s.budget for s in acc.spends(level)}
        assert leaves == {"total_only": budget / 9, "stage1": budget / 90, "step2": budget / 10}
        total = acc.compose(level, rdp=False)
        if defn == "zcdp":
            assert total.rho == budget
        else:
            assert total.epsilon == budget and total.rho == 9 * (budget / 9) ** 2 / 2


def test_st17_mixed_plan_composes_under_zcdp_and_records_method() -> None:
    """Mixed plans compose under zCDP (ε-DP contributes ε²/2); the conversions name their method and the best
    sound one is reported; the record is JSON-serialisable."""
    plan = [acc.Spend("puredp", Fraction(1, 2), label="geo"), acc.Spend("zcdp", Fraction(1, 5), label="dg")]
    total = acc.compose(plan)
    assert total.rho == Fraction(1, 8) + Fraction(1, 5) and not total.is_pure and total.has_geometric
    methods = {c.method.split(" ")[0] for c in total.conversions}
    assert methods == {"zcdp_analytic", "zcdp_cks_grid", "rdp_cks_grid"}
    best = total.best
    assert best is not None and best.epsilon == min(c.epsilon for c in total.conversions)
    record = json.loads(json.dumps(total.as_record()))
    assert record["rho"] == "13/40" and record["best"]["method"] == best.method
    # the RDP curve of the plan is never above its zCDP curve (exact geometric divergence ≤ αε²/2)
    for alpha in (Fraction(2), Fraction(8)):
        rdp = total.rdp(alpha)
        assert rdp is not None and rdp <= acc.to_decimal(alpha * Fraction(13, 40))


def test_generic_pure_spend_rdp_bound() -> None:
    """A pure-DP spend that is not a unit-sensitivity geometric count uses min(cε, α(cε)²/2) per call."""
    s = acc.Spend("puredp", Fraction(1, 2), sensitivity=Fraction(2), degree=3)
    assert s.rdp(Fraction(2)) == 3 * min(Decimal("0.5"), 2 * Decimal("0.25") / 2)
    s = acc.Spend("puredp", Fraction(1, 10), stability=Fraction(2))
    assert s.rdp(Fraction(10)) == min(Decimal("0.2"), 10 * Decimal("0.04") / 2)


def test_infinite_budget_makes_the_total_infinite() -> None:
    """An infinite budget anywhere (no noise) means no privacy guarantee: rho/epsilon None, no conversion."""
    total = acc.compose([acc.Spend("zcdp", Fraction(1)), acc.Spend("zcdp", None)])
    assert total.is_infinite and total.rho is None and total.conversions == () and total.best is None
    assert acc.Spend("zcdp", None, sensitivity=Fraction(22)).noise() == 0
    with pytest.raises(ValueError, match="infinite"):
        total.rdp_conversion()
    assert acc.compose([acc.Spend("puredp", None)]).epsilon is None
    assert acc.unbounded_to_bounded(None, "zcdp") is None and acc.stability_scale(None, 2, "zcdp") is None


def test_st12_all_pure_plan_reports_exact_epsilon() -> None:
    """ST12: an all-pure plan reports its exact ε (δ = 0) next to the zCDP / RDP conversions."""
    plan = [acc.Spend("puredp", Fraction("4.27")), acc.Spend("puredp", Fraction("0.59"))]
    total = acc.compose(plan, rdp=False)
    assert total.is_pure and total.epsilon == Fraction("4.86")
    pure = total.conversions[0]
    assert pure.method.startswith("puredp") and pure.delta == 0 and pure.epsilon == Decimal("4.86")


def test_p2_groupsize_levels() -> None:
    """Group-size P2 / §2.1: each of L levels gets ε/L (parallel within a level, sequential across levels);
    total ε. Count queries (Δ = 2) get scale 2L/ε; cumulative queries (Δ = 1) scale L/ε."""
    eps, levels = Fraction(1, 2), 3
    plan = [acc.Parallel((acc.Spend("puredp", eps / levels, sensitivity=Fraction(2)),), degree=1)
            for _ in range(levels)]
    total = acc.compose(plan, rdp=False)
    assert total.epsilon == eps
    assert acc.geometric_scale(eps / levels, 2) == 2 * levels / eps == 12
    assert acc.geometric_scale(eps / levels, 1) == levels / eps == 6


def test_neighbour_conversions() -> None:
    """PHSafe Thm 3-4: bounded = 2 × unbounded (zCDP and pure); generic group privacy: 4ρ; TopDown's
    change-one calibration σ² = 1/(ρ·share) is twice the add/remove σ² = 1/(2ρ) (W10, ST20, spine S3)."""
    assert acc.unbounded_to_bounded(Fraction(1, 3), "zcdp") == Fraction(2, 3)
    assert acc.unbounded_to_bounded(Fraction(1, 3), "zcdp", "group") == Fraction(4, 3)
    assert acc.unbounded_to_bounded(Fraction(1, 3), "puredp") == Fraction(2, 3)
    with pytest.raises(ValueError, match="method"):
        acc.unbounded_to_bounded(Fraction(1), "zcdp", "other")  # type: ignore[arg-type]
    rho = Fraction(1, 4)
    assert acc.gaussian_sigma2_sq(rho, 2) == 2 * acc.gaussian_sigma2(rho, 1) == 4


def test_conversion_monotone_in_delta_and_rho() -> None:
    """Sanity of the conversions: ε grows as δ shrinks and as ρ grows; the grid never beats the continuous
    optimum by construction, and both are ≥ ρ."""
    e1 = acc.zcdp_to_approx_dp(Fraction(1, 2), Fraction(1, 10**6)).epsilon
    e2 = acc.zcdp_to_approx_dp(Fraction(1, 2), Fraction(1, 10**10)).epsilon
    e3 = acc.zcdp_to_approx_dp(Fraction(1), Fraction(1, 10**10)).epsilon
    assert Decimal("0.5") < e1 < e2 < e3


def test_float_prepass_finds_the_exact_grid_minimum() -> None:
    """The vectorised float pre-pass only ranks the α grid: the reported (ε, α) equal those of the full
    50-digit search over all 900 α (SafeTab geometric plan: exact divergence + CKS, paper τ + Mironov),
    and the float curve agrees with the 50-digit curve to 1e-12 relative on the whole grid."""
    from tests.privacy_accounting._plans import safetab_plan, table4_totals

    total = acc.compose(safetab_plan("puredp", table4_totals("puredp")), rdp=False)
    cases: list[tuple[acc.GeometricDivergence, Literal["cks", "mironov"]]] = [("exact", "cks"),
                                                                               ("paper", "mironov")]
    for divergence, conversion in cases:
        def curve(a: Fraction, div: acc.GeometricDivergence = divergence) -> Decimal:
            value = total.rdp(a, div)
            assert value is not None
            return value

        fast = total.rdp_conversion(divergence=divergence, conversion=conversion)
        slow = acc.rdp_to_approx_dp(curve, acc.DELTA, conversion=conversion)
        assert (fast.epsilon, fast.alpha) == (slow.epsilon, slow.alpha)
        grid = acc.geometric_rdp_float(acc.ALPHA_GRID_FLOAT, 0.47, divergence)
        for i in range(0, 900, 37):
            exact = float(acc.geometric_rdp(acc.ALPHA_GRID[i], Fraction("0.47"), divergence))
            assert abs(grid[i] - exact) <= 1e-12 * abs(exact)
    slow_z = acc.rdp_to_approx_dp(lambda a: acc.to_decimal(a * Fraction("1.41")), acc.DELTA)
    fast_z = acc.zcdp_to_approx_dp_grid(Fraction("1.41"))
    assert (fast_z.epsilon, fast_z.alpha) == (slow_z.epsilon, slow_z.alpha)


def test_records_and_edge_values() -> None:
    """Spend/Total records are JSON-ready with exact strings; ε = 0 gives zero divergence in both modes (the
    limit of eq. 29); huge ε does not overflow the 50-digit context; Var N_Z(σ²) = σ² to 40 digits at the
    σ² = 50 switch to the closed form."""
    spend = acc.Spend("zcdp", Fraction(1, 3), sensitivity=Fraction(22), label="PH1_num/usa_*")
    record = json.loads(json.dumps(spend.as_record()))
    assert record == {"label": "PH1_num/usa_*", "definition": "zcdp", "mechanism": "discrete_gaussian",
                      "budget": "1/3", "sensitivity": "22", "stability": "1", "degree": 1, "noise": "726"}
    assert acc.Spend("zcdp", Fraction(0)).as_record()["noise"] is None
    total = json.loads(json.dumps(acc.compose([spend], rdp=False).as_record()))
    assert total["precision_digits"] == 50 and total["alpha_grid"].startswith("1.01")
    assert acc.geometric_rdp_paper(2, 0) == 0 == acc.geometric_rdp_exact(2, 0)
    big = acc.geometric_rdp_exact(10, 10**5)
    assert abs(big - Decimal(10**5)) < 1  # D_α → ε as ε grows
    below = acc.discrete_gaussian_variance(Fraction(4999, 100))
    assert abs(below - Decimal("49.99")) < Decimal("1e-40")
    assert acc.discrete_gaussian_variance(50) == 50

"""Noise moments and the remaining privacy-core oracles of the specs: safetab ST10, spine S3/S18/S19,
hierarchical-groupsize §1.4/§2.1, eigen-design E4/Example 4."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from dasflow.privacy import accounting as acc


def test_st10_s18_variances() -> None:
    """ST10 / S18: Var L_Z(b=1) = 1.841347; Var N_Z(σ²=1) = 1 − 2.1123·10⁻⁷; Var N_Z(σ²=2) = 2 − 2.2604·10⁻¹⁵;
    Var L_Z(b) ≈ 2b² − 1/6 (0.138 below 2b² at b = 0.5)."""
    assert round(acc.geometric_variance(1), 6) == Decimal("1.841347")
    d1 = 1 - acc.discrete_gaussian_variance(1)
    d2 = 2 - acc.discrete_gaussian_variance(2)
    assert round(d1 * Decimal(10) ** 7, 4) == Decimal("2.1123")
    assert round(d2 * Decimal(10) ** 15, 4) == Decimal("2.2604")
    assert round(2 * Decimal("0.25") - acc.geometric_variance(Fraction(1, 2)), 3) == Decimal("0.138")
    assert abs(2 * 60**2 - Decimal(1) / 6 - acc.geometric_variance(60)) < Decimal("1e-5")


def test_large_sigma_variance_is_sigma2() -> None:
    """For the PHSafe σ² (e.g. 92401.7) the discrete Gaussian variance equals σ² to 40 digits."""
    s2 = acc.gaussian_sigma2(Fraction("0.002619"), 22)
    assert abs(acc.discrete_gaussian_variance(s2) - acc.to_decimal(s2)) < Decimal("1e-35")


GROUPSIZE = [  # ε, counts (scale 2L/ε): a, Var, E|Z|; cumulative (scale L/ε): Var, E|Z|   (L = 3)
    ("0.1", "0.98347", "7200", "60", "1800", "30"),
    ("0.5", None, "288", "12", "71.8", "6"),
    ("1", None, "71.8", "6", "17.8", "3"),
]


@pytest.mark.parametrize("row", GROUPSIZE, ids=[r[0] for r in GROUPSIZE])
def test_groupsize_noise_table(row: tuple[str, str | None, str, str, str, str]) -> None:
    """hierarchical-groupsize §2.1 (L = 3): geometric a = exp(−ε/Δ_level), Var = 2a/(1−a)², E|Z| = 2a/(1−a²),
    each equal to the printed value at its printed precision (half a unit of the last digit)."""
    eps_s, a_s, var_c, abs_c, var_cum, abs_cum = row
    eps, levels = Fraction(eps_s), 3

    def near(value: Decimal, printed: str) -> bool:
        places = len(printed.split(".")[1]) if "." in printed else 0
        return abs(value - Decimal(printed)) <= Decimal(5) * Decimal(10) ** -(places + 1)

    counts = acc.geometric_scale(eps / levels, 2)
    cumulative = acc.geometric_scale(eps / levels, 1)
    assert counts == 2 * levels / eps and cumulative == levels / eps
    if a_s is not None:
        assert near((-1 / acc.to_decimal(counts)).exp(), a_s)
    assert near(acc.geometric_variance(counts), var_c) and near(acc.geometric_mean_abs(counts), abs_c)
    assert near(acc.geometric_variance(cumulative), var_cum)
    assert near(acc.geometric_mean_abs(cumulative), abs_cum)


def _kron(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    return [[x * y for x in ra for y in rb] for ra in a for rb in b]


def _inverse(m: list[list[Fraction]]) -> list[list[Fraction]]:
    """Gauss-Jordan inverse over the rationals (exact)."""
    n = len(m)
    aug = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(m)]
    for col in range(n):
        pivot = next(r for r in range(col, n) if aug[r][col] != 0)
        aug[col], aug[pivot] = aug[pivot], aug[col]
        p = aug[col][col]
        aug[col] = [v / p for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                f = aug[r][col]
                aug[r] = [v - f * w for v, w in zip(aug[r], aug[col], strict=True)]
    return [row[n:] for row in aug]


def test_s19_figure2_variances_64_27() -> None:
    """Spine S2/S3/S19: Figure 2 (1 root, 2 blocks, 2×2 histogram, 4 query groups). With ρ = 1, β = (½, ½) and
    α = ¼ per group the TopDown change-one calibration gives raw σ² = 1/(ρβα) = 8 per query, and exact WLS
    gives Var(Vx̂) with all 27 diagonal entries equal to 64/27."""
    ones2, eye2 = [[1, 1]], [[1, 0], [0, 1]]
    w = _kron(ones2, ones2) + _kron(eye2, ones2) + _kron(ones2, eye2) + _kron(eye2, eye2)  # 9 × 4
    b = [[1, 1], [1, 0], [0, 1]]
    v = _kron(b, w)
    assert (len(v), len(v[0]), sum(map(sum, v))) == (27, 8, 64)
    rho, beta, alpha = Fraction(1), Fraction(1, 2), Fraction(1, 4)
    sigma2 = acc.gaussian_sigma2_sq(rho * beta * alpha, 2)
    assert sigma2 == 8
    assert acc.geometric_scale(Fraction(1) * beta * alpha, 2) == 16  # Laplace_Z scale 2/(ε·β·α) at ε = 1
    gram = [[sum(Fraction(v[k][i] * v[k][j]) for k in range(27)) / sigma2 for j in range(8)]
            for i in range(8)]
    cov = _inverse(gram)
    diag = [sum(v[r][i] * cov[i][j] * v[r][j] for i in range(8) for j in range(8)) for r in range(27)]
    assert diag == [Fraction(64, 27)] * 27


def test_e4_eigen_design_error_factors() -> None:
    """Eigen-design E4 / Prop. 4: P(ε, δ) = 2 ln(2/δ)/ε² = 79.23 at ε = 0.5, δ = 1e-4 (Example 4's printed
    constant); P_Laplace = 2/ε²; P_zCDP = 1/(2ρ)."""
    assert round(acc.gaussian_error_factor(Fraction(1, 2), Fraction(1, 10**4)), 2) == Decimal("79.23")
    assert acc.laplace_error_factor(Fraction(1, 2)) == 8
    assert acc.zcdp_error_factor(Fraction(1, 4)) == 2 == acc.gaussian_sigma2(Fraction(1, 4), 1)


def _combine(*variances: Fraction) -> Fraction:
    """Inverse-variance (WLS) combination of independent unbiased estimates."""
    return 1 / sum((1 / v for v in variances), Fraction(0))


def test_s12_s17_remark1_bypass_rules_from_the_calibrations() -> None:
    """Spine Remark 1 / Theorem 2 / S12 / S17, computed from the noise calibrations (total query only):
    Laplace (ε = 2, scale 2/(εγ) = 1/γ, variance 2b² = 2/γ²): before the bypass 2c/(cγp² + γc²), after
    2c/(γc + γp)², and 'after ≤ before' ⟺ γc ≥ (c−1)γp/2 (equal shares: bypass c ∈ {1, 2, 3}, not 4).
    Gaussian (ρ = 1, TopDown σ² = 1/(ργ)): before c/(cγp + γc), after c/(γc + γp): never lower, equal iff c = 1
    (zCDP bypasses single-child parents only)."""
    def laplace_var(share: Fraction) -> Fraction:
        b = acc.geometric_scale(2 * share, 2)
        return 2 * b * b

    def gauss_var(share: Fraction) -> Fraction:
        return acc.gaussian_sigma2_sq(share, 2)

    shares = [Fraction(k, 12) for k in range(1, 12)]
    for c in range(1, 6):
        for gp in shares:
            for gc in shares:
                before = _combine(laplace_var(gp), c * laplace_var(gc))
                after = c * laplace_var(gc + gp)
                assert before == Fraction(2 * c) / (c * gp**2 + gc**2)
                assert after == Fraction(2 * c) / (gc + gp) ** 2
                assert (after <= before) == (gc >= (c - 1) * gp / 2)
                g_before = _combine(gauss_var(gp), c * gauss_var(gc))
                g_after = c * gauss_var(gc + gp)
                assert g_before == Fraction(c) / (c * gp + gc) and g_after == Fraction(c) / (gc + gp)
                assert (g_after == g_before) == (c == 1) and g_after >= g_before
    equal = Fraction(1, 4)
    assert [c for c in range(1, 6) if equal >= (c - 1) * equal / 2] == [1, 2, 3]

"""Noise moments, margins of error (MOE) and MOE ↔ budget calibrations.

Everything that involves exp/ln/√ is evaluated in the 50-digit :data:`HP` context and returned as ``Decimal``;
results that are budgets are exact ``Fraction``s (the constants of the papers are rational) or are rounded
with an explicit rule by :func:`round_rational`.

SafeTab (Haney et al., seeds/000; spec ``safetab-p.md`` §5, §6.2):

* two-sided geometric L_Z(b), ε = 1/b: P(|Y| > m) = 2e^{−m/b}/(1 + e^{1/b}) exactly for integer m ≥ 0
  (Lemma 13, eq. 34 — an equality on the integers); the paper's 95 % MOE is ⌊b·ln(40/(1 + e^{1/b}))⌋ (eq.
  36) and the calibration is ε = ln(20)/(⌊MOE⌋ + 1) (Corollary 2, eq. 38). The floor makes the paper's MOE
  slightly optimistic (true coverage 93.9–94.9 %, spec W1): :func:`geometric_moe_exact` is the smallest m
  with coverage ≥ 95 % and :func:`geometric_epsilon_exact` the ε with exactly 95 % coverage at ±MOE.
* discrete Gaussian N_Z(σ²): the paper's 95 % MOE is ⌊1.96σ⌋ (Corollary 3) and the calibration
  ρ = 1.92/⌊MOE⌋² (Corollary 4, eq. 37; 1.92 ≈ 1.96²/2 = 1.9208, both constants offered).
  :func:`dgauss_moe_exact` is the smallest m with P(|X| ≤ m) ≥ 95 % by exact summation of the pmf.
* level budgets (App. F.1 with the typo fixed, spec W4): TabulatePopulationGroup budget = base/(1−γ); level
  budget (Table 4 "Total") = s·base/(1−γ); "Step 2" = (1−γ)·Total = s·base.

PHSafe (seeds/002 §7; spec ``phsafe.md`` §5): 90 % MOE = z·σ with z = 1.645 and σ = c/√(2ρ), c = 2τ+2 (join
tables) or 2 (unit tables); inverse ρ = (z·c)²/(2·MOE²), published rounded to 6 decimals (Table 10), bounded =
2 × unbounded.

Eigen-Design (Li–Miklau; spec ``eigen-design.md`` Prop. 4, E4): error factors P(ε, δ) = 2 ln(2/δ)/ε² (classic
Gaussian), P = 2/ε² (Laplace), P = 1/(2ρ) (zCDP Gaussian).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from dasflow.privacy._exact import (
    HP,
    PRECISION,
    floor_sqrt,
    high_precision,
    parse_budget,
    parse_fraction_open,
    parse_positive,
    parse_rational,
    to_decimal,
)

Mechanism = Literal["geometric", "dgauss"]
#: SafeTab Corollary 4's constant (the paper's value) and its exact form 1.96²/2.
DG_CONSTANT_PAPER = Fraction("1.92")
DG_CONSTANT_EXACT = Fraction("1.96") ** 2 / 2
#: PHSafe's 90 % normal quantile as Table 10 uses it (1.6449 fails the 6-decimal match, spec §5).
PHSAFE_Z90 = Fraction("1.645")
SAFETAB_Z95 = Fraction("1.96")
_TINY = Decimal(10) ** -(PRECISION + 10)
#: From this σ² on, Var N_Z(σ²) equals σ² to far more than PRECISION digits (see discrete_gaussian_variance).
_DG_VARIANCE_EXACT_FROM = Fraction(50)


def _scale(value: object, name: str = "scale") -> Fraction:
    return parse_rational(value, name)


def _confidence(value: object) -> Fraction:
    return parse_fraction_open(value, "confidence")


def _moe_int(value: object, name: str = "moe") -> int:
    m = parse_rational(value, name)
    if m.denominator != 1:
        raise ValueError(f"{name}={value!r}: an MOE target is an integer number of persons")
    return int(m)


# --- two-sided geometric

@high_precision
def geometric_variance(scale: object) -> Decimal:
    """Var L_Z(b) = 2a/(1−a)², a = e^{−1/b} (safetab-p ST10: b = 1 → 1.841347). b = 0 (no noise) → 0."""
    b = _scale(scale)
    if b == 0:
        return Decimal(0)
    a = HP.exp(-to_decimal(1 / b))
    return 2 * a / (1 - a) ** 2


@high_precision
def geometric_mean_abs(scale: object) -> Decimal:
    """E|Y| = 2a/(1−a²) for Y ∼ L_Z(b), a = e^{−1/b} (hierarchical-groupsize §1.4)."""
    b = _scale(scale)
    if b == 0:
        return Decimal(0)
    a = HP.exp(-to_decimal(1 / b))
    return 2 * a / (1 - a * a)


@high_precision
def geometric_tail(m: int, scale: object) -> Decimal:
    """P(|Y| > m) = 2e^{−m/b}/(1 + e^{1/b}) for integer m ≥ 0 (SafeTab eq. 34, exact on the integers)."""
    if m < 0:
        raise ValueError(f"m={m}: must be >= 0")
    b = _scale(scale)
    if b == 0:
        return Decimal(0)
    inv = to_decimal(1 / b)
    return 2 * HP.exp(-m * inv) / (1 + HP.exp(inv))


@high_precision
def geometric_coverage(m: int, scale: object) -> Decimal:
    """P(|Y| ≤ m) for Y ∼ L_Z(b)."""
    return 1 - geometric_tail(m, scale)


@high_precision
def _geometric_moe_real(b: Fraction, p: Fraction) -> Decimal:
    inv = to_decimal(1 / b)
    return to_decimal(b) * HP.ln(2 / (to_decimal(p) * (1 + HP.exp(inv))))


def geometric_moe_value(scale: object, confidence: object = Fraction(95, 100)) -> Decimal:
    """The unrounded b·ln(2/(p(1 + e^{1/b}))) (SafeTab eq. 35); at 90 % this is PHSafe's puredp-mode MOE
    b·ln(20/(1 + e^{1/b})) (phsafe.md §3 'Variance tracking' [NS]). b = 0 → 0."""
    b = _scale(scale)
    p = 1 - _confidence(confidence)
    if b == 0:
        return Decimal(0)
    return _geometric_moe_real(b, p)


def geometric_moe_paper(scale: object, confidence: object = Fraction(95, 100)) -> int:
    """The paper's MOE ⌊b·ln(2/(p(1 + e^{1/b})))⌋, p = 1 − confidence (SafeTab eq. 35; 95 %: eq. 36)."""
    b = _scale(scale)
    p = 1 - _confidence(confidence)
    if b == 0:
        return 0
    return max(0, int(_geometric_moe_real(b, p).to_integral_value(rounding="ROUND_FLOOR")))


def geometric_moe_exact(scale: object, confidence: object = Fraction(95, 100)) -> int:
    """The smallest integer m ≥ 0 with P(|Y| ≤ m) ≥ confidence (the ceiling the paper's floor misses, W1)."""
    b = _scale(scale)
    conf = _confidence(confidence)
    if b == 0:
        return 0
    m = max(0, int(_geometric_moe_real(b, 1 - conf).to_integral_value(rounding="ROUND_CEILING")))
    target = to_decimal(conf)
    while m > 0 and geometric_coverage(m - 1, b) >= target:
        m -= 1
    while geometric_coverage(m, b) < target:
        m += 1
    return m


@high_precision
def geometric_epsilon_for_moe(moe: object, confidence: object = Fraction(95, 100)) -> Decimal:
    """SafeTab Corollary 2 (eq. 38): ε = ln(1/p)/(⌊MOE⌋ + 1); 95 % → ln(20)/(⌊MOE⌋ + 1)."""
    m = _moe_int(moe)
    p = 1 - _confidence(confidence)
    return HP.ln(1 / to_decimal(p)) / (m + 1)


@high_precision
def geometric_epsilon_exact(moe: object, confidence: object = Fraction(95, 100)) -> Decimal:
    """The ε at which ±MOE covers exactly ``confidence``: root of 2e^{−mε}/(1 + e^ε) = p (bisection,
    1e-40)."""
    m = _moe_int(moe)
    if m < 1:
        raise ValueError(f"moe={moe!r}: must be >= 1")
    p = to_decimal(1 - _confidence(confidence))

    def tail(eps: Decimal) -> Decimal:
        return 2 * HP.exp(-m * eps) / (1 + HP.exp(eps))

    lo, hi = Decimal(0), Decimal(1)
    while tail(hi) > p:
        hi *= 2
    while hi - lo > Decimal("1e-40"):
        mid = (lo + hi) / 2
        if tail(mid) > p:
            lo = mid
        else:
            hi = mid
    return hi


# --- discrete Gaussian

@high_precision
def _dgauss_weights(sigma2: Fraction) -> list[Decimal]:
    """Unnormalised weights w(x) = e^{−x²/(2σ²)} for x = 0, 1, … until w < 10^-(PRECISION+10).

    About 16σ terms: CDFs, coverages and exact MOEs cost O(σ) (σ ≈ 300, PHSafe's largest, takes ~5 ms).
    """
    q = HP.exp(-1 / to_decimal(2 * sigma2))
    q2 = q * q
    weights = [Decimal(1)]
    w, r = Decimal(1), q  # r = q^(2x+1)
    while w > _TINY:
        w *= r
        r *= q2
        weights.append(w)
    return weights


@high_precision
def discrete_gaussian_variance(sigma2: object) -> Decimal:
    """Exact Var N_Z(σ²) = Σ x² e^{−x²/2σ²} / Σ e^{−x²/2σ²} (slightly below σ²: σ² = 1 → 1 − 2.1123·10⁻⁷,
    σ² = 2 → 2 − 2.2604·10⁻¹⁵; spine spec S18, safetab ST10). σ² = 0 → 0."""
    s2 = _scale(sigma2, "sigma2")
    if s2 == 0:
        return Decimal(0)
    if s2 >= _DG_VARIANCE_EXACT_FROM:
        # Poisson summation: σ² − Var N_Z(σ²) = O(σ⁴ e^{−2π²σ²}) < 10^-400 here, far below the 50 digits.
        return to_decimal(s2)
    w = _dgauss_weights(s2)
    norm = w[0] + 2 * sum(w[1:], Decimal(0))
    second = 2 * sum((x * x * wx for x, wx in enumerate(w) if x), Decimal(0))
    return second / norm


@high_precision
def dgauss_coverage(m: int, sigma2: object) -> Decimal:
    """P(|X| ≤ m) for X ∼ N_Z(σ²), by exact summation."""
    if m < 0:
        raise ValueError(f"m={m}: must be >= 0")
    s2 = _scale(sigma2, "sigma2")
    if s2 == 0:
        return Decimal(1)
    w = _dgauss_weights(s2)
    norm = w[0] + 2 * sum(w[1:], Decimal(0))
    inside = w[0] + 2 * sum(w[1 : m + 1], Decimal(0))
    return min(Decimal(1), inside / norm)


def dgauss_moe_paper(sigma2: object, z: object = SAFETAB_Z95) -> int:
    """The paper's MOE ⌊z·σ⌋ (SafeTab Corollary 3 with z = 1.96), exactly: ⌊√(z²σ²)⌋."""
    s2 = _scale(sigma2, "sigma2")
    zz = parse_positive(z, "z")
    return floor_sqrt(zz * zz * s2)


@high_precision
def dgauss_moe_exact(sigma2: object, confidence: object = Fraction(95, 100)) -> int:
    """The smallest integer m ≥ 0 with P(|X| ≤ m) ≥ confidence, X ∼ N_Z(σ²) (exact summation)."""
    s2 = _scale(sigma2, "sigma2")
    conf = to_decimal(_confidence(confidence))
    if s2 == 0:
        return 0
    w = _dgauss_weights(s2)
    norm = w[0] + 2 * sum(w[1:], Decimal(0))
    inside = w[0]
    m = 0
    while inside / norm < conf:
        m += 1
        inside += 2 * w[m]
    return m


def dgauss_rho_for_moe(moe: object, constant: object = DG_CONSTANT_PAPER) -> Fraction:
    """SafeTab Corollary 4 (eq. 37): ρ = constant/⌊MOE⌋², constant 1.92 (paper) or 1.9208 = 1.96²/2. Exact."""
    m = _moe_int(moe)
    if m < 1:
        raise ValueError(f"moe={moe!r}: must be >= 1")
    return parse_positive(constant, "constant") / (m * m)


# --- CDFs and quantiles (SafeTab-P production zero suppression) --------------------------------------------

@high_precision
def geometric_cdf(t: int, scale: object) -> Decimal:
    """P(Y ≤ t) for Y ∼ L_Z(b): t ≥ 0: 1 − e^{−(t+1)/b}/(1 + e^{−1/b}); t < 0: e^{t/b}/(1 + e^{−1/b})
    (geometric series; consistent with SafeTab eq. 34). b = 0 → point mass at 0."""
    b = _scale(scale)
    if b == 0:
        return Decimal(1) if t >= 0 else Decimal(0)
    inv = to_decimal(1 / b)
    den = 1 + HP.exp(-inv)
    if t >= 0:
        return 1 - HP.exp(-(t + 1) * inv) / den
    return HP.exp(t * inv) / den


@high_precision
def dgauss_cdf(t: int, sigma2: object) -> Decimal:
    """P(X ≤ t) for X ∼ N_Z(σ²), by exact summation (σ² = 0 → point mass at 0)."""
    s2 = _scale(sigma2, "sigma2")
    if s2 == 0:
        return Decimal(1) if t >= 0 else Decimal(0)
    w = _dgauss_weights(s2)
    norm = w[0] + 2 * sum(w[1:], Decimal(0))
    head = w[0] + sum(w[1:], Decimal(0))  # P(X ≤ 0)·norm
    below = head + sum(w[1 : t + 1], Decimal(0)) if t >= 0 else sum(w[-t:], Decimal(0))
    return min(Decimal(1), below / norm)


def noise_quantile(mechanism: Mechanism, noise: object, p: object) -> int | None:
    """The smallest integer t with P(noise ≤ t) ≥ p, for noise N_Z(σ²) (``"dgauss"``, ``noise`` = σ²) or
    L_Z(b) (``"geometric"``, ``noise`` = b). ``p = 0`` → ``None`` (t = −∞); σ² or b = 0 (no noise) → 0.

    This is the SafeTab-P production zero-suppression threshold (spec safetab-p-production.md: T1 counts at or
    below t are dropped, t the ``zero_suppression_chance`` quantile of the query's noise). The discrete
    distributions have no exact p-quantile in general; the smallest t reaching p is the conservative choice
    (a true zero is suppressed with probability ≥ p).
    """
    prob = parse_rational(p, "p")
    if prob > 1:
        raise ValueError(f"p={p!r}: must be <= 1")
    if prob == 0:
        return None
    if prob == 1:
        raise ValueError(f"p={p!r}: the noise is unbounded, no finite quantile")
    target = to_decimal(prob)
    if mechanism == "geometric":
        def cdf(t: int) -> Decimal:
            return geometric_cdf(t, noise)
        spread = max(Fraction(1), _scale(noise))
    elif mechanism == "dgauss":
        s2 = _scale(noise, "sigma2")
        w = _dgauss_weights(s2) if s2 > 0 else [Decimal(1)]
        norm = w[0] + 2 * sum(w[1:], Decimal(0))
        half_above = sum(w[1:], Decimal(0))  # P(X ≥ 1)·norm

        def cdf(t: int) -> Decimal:
            if s2 == 0:
                return Decimal(1) if t >= 0 else Decimal(0)
            if t >= 0:
                return (w[0] + half_above + sum(w[1 : t + 1], Decimal(0))) / norm
            return sum(w[-t:], Decimal(0)) / norm
        spread = max(Fraction(1), s2)
    else:
        raise ValueError(f"mechanism={mechanism!r}: must be 'geometric' or 'dgauss'")
    lo, hi = -1, 1
    step = max(1, int(spread))
    while cdf(lo) >= target:
        lo -= step
        step *= 2
    step = max(1, int(spread))
    while cdf(hi) < target:
        hi += step
        step *= 2
    while hi - lo > 1:  # invariant: cdf(lo) < target <= cdf(hi)
        mid = (lo + hi) // 2
        if cdf(mid) >= target:
            hi = mid
        else:
            lo = mid
    return hi


# --- SafeTab level calibration (Table 4) and per-level MOEs (§5.3)

@dataclass(frozen=True)
class LevelCalibration:
    """Table 4 row for one MOE target: base (per Step-2 query), Step 2 = s·base, Total = s·base/(1−γ).

    Exact ``Fraction`` for the discrete Gaussian (rational constants); 50-digit ``Decimal`` for the geometric
    (ln 20 is transcendental). Round with :func:`round_rational` and a stated rule to obtain a budget.
    """

    mechanism: Mechanism
    moe: int
    stability: int
    gamma: Fraction
    base: Fraction | Decimal
    step2: Fraction | Decimal
    total: Fraction | Decimal


@high_precision
def safetab_level_calibration(moe: object, mechanism: Mechanism, *, stability: int = 9,
                              gamma: object = Fraction(1, 10),
                              constant: object = DG_CONSTANT_PAPER) -> LevelCalibration:
    """SafeTab App. F.1 with the 1/γ typo fixed (spec §6.2, W4): MOE → base → ×s → /(1−γ)."""
    m = _moe_int(moe)
    g = parse_fraction_open(gamma, "gamma")
    if isinstance(stability, bool) or not isinstance(stability, int) or stability < 1:
        raise ValueError(f"stability={stability!r}: must be an integer >= 1")
    if mechanism == "dgauss":
        base_f = dgauss_rho_for_moe(m, constant)
        return LevelCalibration(mechanism, m, stability, g, base_f, stability * base_f,
                                stability * base_f / (1 - g))
    if mechanism == "geometric":
        base_d = geometric_epsilon_for_moe(m)
        return LevelCalibration(mechanism, m, stability, g, base_d, stability * base_d,
                                stability * base_d / to_decimal(1 - g))
    raise ValueError(f"mechanism={mechanism!r}: must be 'geometric' or 'dgauss'")


@dataclass(frozen=True)
class BranchMoe:
    """95 % MOE of one SafeTab query kind at a level: the paper's floor formula and the exact half-width."""

    branch: str
    budget: Fraction
    formula: int
    exact: int


def safetab_level_moes(level_budget: object, mechanism: Mechanism, *, stability: int = 9,
                       gamma: object = Fraction(1, 10)) -> tuple[BranchMoe, ...]:
    """Per-level MOEs (SafeTab §5.1-5.2; spec §5.3): TotalOnly (ρ_i/s), Stage-1 total (γρ_i/s), Step-2 cell
    ((1−γ)ρ_i/s). Geometric: b = 1/budget; discrete Gaussian: σ² = 1/(2·budget)."""
    total = parse_budget(level_budget, "level_budget", allow_infinite=False)
    assert total is not None
    if total == 0:
        raise ValueError("level_budget=0: the level is not tabulated")
    g = parse_fraction_open(gamma, "gamma")
    per = total / stability
    out = []
    for branch, budget in (("total_only", per), ("stage1", g * per), ("step2", (1 - g) * per)):
        if mechanism == "geometric":
            b = 1 / budget
            out.append(BranchMoe(branch, budget, geometric_moe_paper(b), geometric_moe_exact(b)))
        elif mechanism == "dgauss":
            s2 = 1 / (2 * budget)
            out.append(BranchMoe(branch, budget, dgauss_moe_paper(s2), dgauss_moe_exact(s2)))
        else:
            raise ValueError(f"mechanism={mechanism!r}: must be 'geometric' or 'dgauss'")
    return tuple(out)


# --- PHSafe 90 % MOE (Table 10)

def phsafe_rho_for_moe(c: object, moe: object, z: object = PHSAFE_Z90) -> Fraction:
    """ρ = (z·c)²/(2·MOE²) exactly (PHSafe §7.1; spec §5, R13). c = 2τ+2 (Alg. 1) or 2 (Alg. 2)."""
    cc = parse_positive(c, "c")
    mm = parse_positive(moe, "moe")
    zz = parse_positive(z, "z")
    return (zz * cc) ** 2 / (2 * mm * mm)


@high_precision
def phsafe_moe(c: object, rho: object, z: object = PHSAFE_Z90) -> Decimal:
    """Achieved 90 % MOE z·σ = z·c/√(2ρ) of a PHSafe cell (spec §5, 'achieved MOE')."""
    cc = parse_positive(c, "c")
    r = None if rho is None else parse_budget(rho, "rho")
    zz = parse_positive(z, "z")
    if r is None:
        return Decimal(0)
    if r == 0:
        raise ValueError("rho=0: the level is not tabulated")
    return to_decimal(zz * cc) / HP.sqrt(to_decimal(2 * r))


# --- Eigen-Design error factors

@high_precision
def gaussian_error_factor(epsilon: object, delta: object) -> Decimal:
    """P(ε, δ) = 2 ln(2/δ)/ε² of the classic (ε, δ) Gaussian mechanism (Li–Miklau Prop. 4, Eq. 1)."""
    e = parse_positive(epsilon, "epsilon")
    d = parse_fraction_open(delta, "delta")
    return 2 * HP.ln(to_decimal(2 / d)) / to_decimal(e * e)


def laplace_error_factor(epsilon: object) -> Fraction:
    """P = 2/ε² (Laplace variance 2b², b = 1/ε; eigen-design §3.5)."""
    e = parse_positive(epsilon, "epsilon")
    return 2 / (e * e)


def zcdp_error_factor(rho: object) -> Fraction:
    """P = 1/(2ρ) (Gaussian σ² for a unit-L2 strategy under ρ-zCDP; eigen-design §7)."""
    r = parse_positive(rho, "rho")
    return 1 / (2 * r)

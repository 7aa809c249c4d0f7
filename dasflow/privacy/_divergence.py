"""Rényi divergences of the base mechanisms and conversions to (ε, δ)-DP (high-precision ``Decimal``).

Sources (SafeTab paper = Haney et al., "Differentially Private Algorithms for 2020 Census Detailed DHC Race &
Ethnicity", seeds/000; spec ``safetab-p.md`` §4.3, §4.6, §6.3):

* Rényi divergence (SafeTab Def. 3): D_α(P‖Q) = 1/(α−1) · ln E_{x∼P}[(P(x)/Q(x))^{α−1}], α > 1.
* ρ-zCDP (Def. 4): D_α ≤ ρα for every α > 1, so a ρ-zCDP mechanism is (α, ρα)-RDP for every α.
* Geometric (discrete Laplace) mechanism with ε = 1/b on a sensitivity-1 count:
  - the paper's Corollary 1 / eq. (17, 29), ``tau_paper``:
    τ(α, ε) = 1/(α−1) · ln[ (e^ε−1)/(e^ε+1) · ( 2α/(ε(2α−1)) e^{(α−1)ε} + 2(α−1)/(ε(2α−1)) e^{−αε} ) ].
    Its proof (Lemma 8, eqs. 12-16) integrates the discrete pmf over the real line; it is *not* an upper bound
    on the divergence of the discrete distributions (spec §4.3 WARNING, §7 W2) and is kept only to
    reproduce the paper's recipe.
  - the exact divergence of the discrete distributions, ``geometric_rdp_exact`` (spec §4.3; derived by summing
    the two geometric series x ≤ 0 and x ≥ 1 of Σ_x P(x)^α Q(x)^{1−α}):
    D_α = 1/(α−1) · ln[ (e^{αε} + e^{−(α−1)ε}) / (e^ε + 1) ].
    This is the sound one; accountants use it by default.
* Canonne–Kamath–Steinke conversion (SafeTab Lemma 4, eq. 6): (α, τ)-RDP ⇒ (ε, δ)-DP with
  ε = τ + [ ln(1/δ) + (α−1)·ln(1 − 1/α) − ln α ] / (α−1).
  Minimising over α for zCDP is SafeTab eq. (7); for the geometric RDP curve eq. (40). The paper minimises
  over the grid α ∈ {1.01, 1.02, …, 10.00} (App. F.2; F.2's "α ∈ (0, ∞)" is a typo, Lemma 4 needs α > 1) —
  :data:`ALPHA_GRID`. Every grid point gives a valid bound, so the grid minimum is sound (just not optimal).
* Bun–Steinke (SafeTab Lemma 5, eq. 8; Bun & Steinke 2016 Prop. 1.3): ρ-zCDP ⇒ (ρ + 2√(ρ ln(1/δ)), δ)-DP.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from dasflow.privacy._exact import (
    HP,
    RationalLike,
    high_precision,
    parse_fraction_open,
    parse_rational,
    to_decimal,
)

#: The paper's (ε, δ) target: δ = 10⁻¹⁰ (SafeTab §6.1; also used for PHSafe totals in the spec).
DELTA = Fraction(1, 10**10)
#: The α grid of SafeTab App. F.2: 1.01, 1.02, ..., 10.00 (900 points, exact rationals).
ALPHA_GRID: tuple[Fraction, ...] = tuple(Fraction(k, 100) for k in range(101, 1001))

GeometricDivergence = Literal["exact", "paper"]
_ONE = Decimal(1)


@dataclass(frozen=True)
class Conversion:
    """An (ε, δ)-DP guarantee derived from a budget, with the method that produced it.

    ``epsilon`` is a 50-digit ``Decimal`` (display/report only, never a budget). ``alpha`` is the minimising
    Rényi order for grid methods. ``sound`` is False only for the paper's τ-based geometric recipe, which
    is not a valid bound for the discrete mechanism (kept to document the paper's number).
    """

    epsilon: Decimal
    delta: Fraction
    method: str
    alpha: Fraction | None = None
    sound: bool = True

    def as_record(self) -> dict[str, object]:
        return {
            "epsilon": str(+self.epsilon.quantize(Decimal("1e-12"), context=HP)),
            "delta": str(self.delta),
            "method": self.method,
            "alpha": None if self.alpha is None else str(self.alpha),
            "sound": self.sound,
        }


def _alpha(alpha: RationalLike) -> Fraction:
    a = parse_rational(alpha, "alpha")
    if a <= 1:
        raise ValueError(f"alpha={alpha!r}: Rényi order must be > 1")
    return a


def _delta(delta: RationalLike) -> Fraction:
    return parse_fraction_open(delta, "delta")


@high_precision
def geometric_rdp_paper(alpha: RationalLike, epsilon: RationalLike) -> Decimal:
    """τ(α, ε) of SafeTab Corollary 1, eq. (17, 29) — the paper's (continuous-integral) RDP of
    BaseGeometric(·, ε).

    NOT an upper bound for the discrete mechanism (it understates it; spec §4.3); use only to reproduce the
    paper.
    """
    a = to_decimal(_alpha(alpha))
    eps_f = parse_rational(epsilon, "epsilon")
    if eps_f == 0:
        return Decimal(0)  # the limit ε → 0 of eq. (29): c·(t1 + t2) → α/(2α−1) + (α−1)/(2α−1) = 1
    e = to_decimal(eps_f)
    ee = HP.exp(e)
    c = HP.divide(ee - 1, ee + 1)
    two_a_1 = 2 * a - 1
    t1 = HP.divide(2 * a, e * two_a_1) * HP.exp((a - 1) * e)
    t2 = HP.divide(2 * (a - 1), e * two_a_1) * HP.exp(-a * e)
    return HP.divide(HP.ln(c * (t1 + t2)), a - 1)


@high_precision
def geometric_rdp_exact(alpha: RationalLike, epsilon: RationalLike) -> Decimal:
    """Exact D_α(L_Z(1/ε) ‖ L_Z(1/ε)+1) of the two-sided geometric distributions (sum over the integers).

    = 1/(α−1) · ln[(e^{αε} + e^{−(α−1)ε}) / (e^ε + 1)]; equals brute-force summation (tested). ε = 0 gives 0.
    """
    a = to_decimal(_alpha(alpha))
    eps_f = parse_rational(epsilon, "epsilon")
    if eps_f == 0:
        return Decimal(0)
    e = to_decimal(eps_f)
    num = HP.exp(a * e) + HP.exp(-(a - 1) * e)
    return HP.divide(HP.ln(HP.divide(num, HP.exp(e) + 1)), a - 1)


def geometric_rdp(alpha: RationalLike, epsilon: RationalLike,
                  divergence: GeometricDivergence = "exact") -> Decimal:
    """RDP of the sensitivity-1 geometric mechanism with parameter ε at order α (``exact`` or ``paper`` τ)."""
    if divergence == "exact":
        return geometric_rdp_exact(alpha, epsilon)
    if divergence == "paper":
        return geometric_rdp_paper(alpha, epsilon)
    raise ValueError(f"divergence={divergence!r}: must be 'exact' or 'paper'")


@high_precision
def cks_epsilon(rdp: Decimal, alpha: Fraction, delta: Fraction) -> Decimal:
    """SafeTab Lemma 4, eq. (6) (Canonne–Kamath–Steinke 2020): ε of (α, rdp)-RDP at δ."""
    a = to_decimal(alpha)
    d = to_decimal(delta)
    am1 = a - 1
    return rdp + HP.divide(-HP.ln(d) + am1 * HP.ln(_ONE - HP.divide(_ONE, a)) - HP.ln(a), am1)


#: A float copy of :data:`ALPHA_GRID` for the vectorised pre-pass of the grid minimisation.
ALPHA_GRID_FLOAT: npt.NDArray[np.float64] = np.array([float(a) for a in ALPHA_GRID])
#: Candidate margin of the float pre-pass: every α whose float ε is within this of the float minimum is
#: re-evaluated at 50 digits. Float errors of these smooth expressions are ~1e-13, far below the margin.
_PREPASS_MARGIN = 1e-6

FloatCurve = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]


def geometric_rdp_float(alphas: npt.NDArray[np.float64], epsilon: float,
                        divergence: GeometricDivergence = "exact") -> npt.NDArray[np.float64]:
    """Vectorised float version of :func:`geometric_rdp_exact` / :func:`geometric_rdp_paper` (log-sum-exp
    form, no overflow). Used only to locate the minimising α; reported values are recomputed at 50 digits."""
    a, e = alphas, float(epsilon)
    if e == 0:
        return np.zeros_like(a)
    out: npt.NDArray[np.float64]
    if divergence == "exact":
        out = (np.logaddexp(a * e, -(a - 1) * e) - np.logaddexp(e, 0.0)) / (a - 1)
        return out
    two_a_1 = 2 * a - 1
    log_t1 = np.log(2 * a / (e * two_a_1)) + (a - 1) * e
    log_t2 = np.log(2 * (a - 1) / (e * two_a_1)) - a * e
    out = (np.log(np.tanh(e / 2)) + np.logaddexp(log_t1, log_t2)) / (a - 1)
    return out


def _conversion_terms_float(alphas: npt.NDArray[np.float64], delta: float,
                            conversion: str) -> npt.NDArray[np.float64]:
    log_inv_delta = -float(np.log(delta))
    out: npt.NDArray[np.float64]
    if conversion == "mironov":
        out = log_inv_delta / (alphas - 1)
    else:
        out = (log_inv_delta + (alphas - 1) * np.log1p(-1 / alphas) - np.log(alphas)) / (alphas - 1)
    return out


@high_precision
def rdp_to_approx_dp(curve: Callable[[Fraction], Decimal], delta: RationalLike = DELTA,
                     alphas: Iterable[Fraction] = ALPHA_GRID, *, method: str = "rdp_cks_grid",
                     sound: bool = True, conversion: Literal["cks", "mironov"] = "cks",
                     float_curve: FloatCurve | None = None) -> Conversion:
    """min over ``alphas`` of eq. (6) applied to an RDP curve α ↦ D_α (SafeTab eq. 40 for the geometric
    curve).

    ``conversion="mironov"`` uses the older, looser ε = D_α + ln(1/δ)/(α−1) (Mironov 2017, Prop. 3) instead
    of CKS eq. (6). The first minimising α wins ties. ``curve`` must return an RDP bound at every α.

    ``float_curve`` (optional, the same curve vectorised in float64) makes the search fast: it ranks the
    whole grid in float and only the α within 1e-6 of the float minimum are evaluated with ``curve`` at 50
    digits. Every α yields a valid bound, so the reported (ε, α) is always a sound 50-digit value; the pre-pass
    can only matter if two grid points tie within 1e-6, and those are all re-evaluated exactly. A non-finite
    float value disables the pre-pass.
    """
    d = _delta(delta)
    if conversion not in ("cks", "mironov"):
        raise ValueError(f"conversion={conversion!r}: must be 'cks' or 'mironov'")
    grid = [_alpha(a) for a in alphas]
    if not grid:
        raise ValueError("alphas: empty grid")
    if float_curve is not None:
        grid_f = ALPHA_GRID_FLOAT if grid == list(ALPHA_GRID) else np.array([float(a) for a in grid])
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            values = float_curve(grid_f) + _conversion_terms_float(grid_f, float(d), conversion)
        if np.all(np.isfinite(values)):
            cutoff = float(values.min()) + _PREPASS_MARGIN
            grid = [a for a, v in zip(grid, values, strict=True) if v <= cutoff]
    best: tuple[Decimal, Fraction] | None = None
    for a in grid:
        if conversion == "cks":
            eps = cks_epsilon(curve(a), a, d)
        else:
            eps = curve(a) + HP.divide(-HP.ln(to_decimal(d)), to_decimal(a - 1))
        if best is None or eps < best[0]:
            best = (eps, a)
    assert best is not None
    return Conversion(best[0], d, method, best[1], sound)


@high_precision
def zcdp_to_approx_dp_analytic(rho: RationalLike, delta: RationalLike = DELTA) -> Conversion:
    """SafeTab Lemma 5, eq. (8) (Bun & Steinke 2016, Prop. 1.3): ε = ρ + 2√(ρ ln(1/δ)) = ρ + √(4ρ ln(1/δ))."""
    r = parse_rational(rho, "rho")
    d = _delta(delta)
    rd = to_decimal(r)
    eps = rd + 2 * HP.sqrt(rd * -HP.ln(to_decimal(d)))
    return Conversion(eps, d, "zcdp_analytic (Bun-Steinke 2016 Prop 1.3; SafeTab Lemma 5 eq 8)")


@high_precision
def zcdp_to_approx_dp_grid(rho: RationalLike, delta: RationalLike = DELTA,
                           alphas: Sequence[Fraction] = ALPHA_GRID) -> Conversion:
    """SafeTab eq. (7): min over the α grid of ρα + [ln(1/δ) + (α−1) ln(1−1/α) − ln α]/(α−1) (CKS 2020)."""
    r = parse_rational(rho, "rho")
    rd = to_decimal(r)
    rf = float(r)
    return rdp_to_approx_dp(lambda a: rd * to_decimal(a), delta, alphas, float_curve=lambda a: rf * a,
                            method="zcdp_cks_grid (CKS 2020 Prop 12; SafeTab eq 7, alpha in 1.01..10.00)")


def zcdp_to_approx_dp(rho: RationalLike, delta: RationalLike = DELTA,
                      method: Literal["best", "analytic", "grid"] = "best") -> Conversion:
    """ρ-zCDP → (ε, δ)-DP. ``best`` (default) returns the smaller of the analytic and the grid conversions,
    both valid; the returned ``method`` names the one used."""
    if method == "analytic":
        return zcdp_to_approx_dp_analytic(rho, delta)
    if method == "grid":
        return zcdp_to_approx_dp_grid(rho, delta)
    if method != "best":
        raise ValueError(f"method={method!r}: must be 'best', 'analytic' or 'grid'")
    a = zcdp_to_approx_dp_analytic(rho, delta)
    g = zcdp_to_approx_dp_grid(rho, delta)
    return g if g.epsilon < a.epsilon else a

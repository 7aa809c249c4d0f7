"""A small typed model of a composed privacy plan, and its exact composition.

A plan is a tree of three node kinds:

``Spend``
    One mechanism call family: a discrete Gaussian (``definition="zcdp"``, budget ρ) or a two-sided geometric
    (``definition="puredp"``, budget ε) answering a query of ``sensitivity`` Δ on the output of a
    transformation of ``stability`` c (PINQ; PHSafe Def. 6), reaching at most ``degree`` z
    disjoint-or-overlapping groups of one record (generalized parallel composition). Its noise is σ² =
    Δ²/(2ρ) (CKS 2020 Thm 14; SafeTab Alg. 5, PHSafe L3) or b = Δ/ε (SafeTab Alg. 4; Ghosh et al.). Its
    loss w.r.t. the protected dataset:
      - zCDP: z · c² · ρ   (stability scaling c² under zCDP: PHSafe Lemma 2; parallel composition with
        degree z: SafeTab Lemma 10, eqs. 25-28);
      - pure DP: z · c · ε (group privacy / PINQ stability; SafeTab Lemma 9, eqs. 19-23);
      - pure DP inside a zCDP account: z · (c·ε)²/2 (an ε-DP mechanism is ε²/2-zCDP, Bun & Steinke 2016
        Prop. 1.4; SafeTab §3 note), then Lemma 10 for the degree.
``Sequential``
    Adaptive sequential composition of its parts: losses add (SafeTab Lemmas 1-3; PHSafe L4).
``Parallel``
    Generalized parallel composition (SafeTab App. B.2, Lemmas 9, 10, 12): the parts run on subsets of a
    family of maximum degree z (each record reaches at most ``degree`` subsets, and each subset runs one of
    the parts), so the loss is z × max over parts — for ε, for ρ, and pointwise in α for RDP (SafeTab
    Theorem 2, eq. 30-32: ``s · max[τ(α, γρ_i/s) + τ(α, (1−γ)ρ_i/s), τ(α, ρ_i/s)]``).

``compose(plan)`` returns a :class:`Total`: the exact ρ (pure parts contribute ε²/2), the exact ε when every
spend is pure DP, and (ε, δ) conversions (δ = 10⁻¹⁰ unless given), each with its method named:
``puredp`` (δ = 0), ``zcdp_analytic`` (Bun–Steinke), ``zcdp_cks_grid`` (SafeTab eq. 7), and — when the plan
contains geometric spends — ``rdp_cks_grid`` over the plan's RDP curve with the exact discrete divergence
of the geometric mechanism (SafeTab eq. 40 with the sound divergence; the paper's τ is available through
:meth:`Total.rdp_conversion` with ``divergence="paper"`` and is marked unsound). ``Total.best`` is the
smallest sound ε. An infinite budget anywhere makes the total infinite (no conversion).

Neighbour relation: every budget in a plan is relative to one neighbour relation (add/remove one person for
SafeTab and PHSafe; change-one-record for TopDown). Converting between relations is explicit
(:func:`unbounded_to_bounded`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Literal, Union, overload

import numpy as np
import numpy.typing as npt

from dasflow.privacy._divergence import (
    ALPHA_GRID,
    ALPHA_GRID_FLOAT,
    DELTA,
    Conversion,
    GeometricDivergence,
    geometric_rdp,
    geometric_rdp_float,
    rdp_to_approx_dp,
    zcdp_to_approx_dp_analytic,
    zcdp_to_approx_dp_grid,
)
from dasflow.privacy._exact import (
    PRECISION,
    RationalLike,
    high_precision,
    parse_budget,
    parse_fraction_open,
    parse_positive,
    parse_rational,
    to_decimal,
)

Definition = Literal["zcdp", "puredp"]
DEFINITIONS: tuple[Definition, ...] = ("zcdp", "puredp")


def _opt_budget(value: object, name: str) -> Fraction | None:
    """``None`` (already-parsed infinite budget) passes through; anything else is parsed by
    ``parse_budget``."""
    return None if value is None else parse_budget(value, name)


def _check_definition(definition: str, name: str) -> Definition:
    if definition == "zcdp":
        return "zcdp"
    if definition == "puredp":
        return "puredp"
    raise ValueError(f"{name}={definition!r}: privacy definition must be 'zcdp' or 'puredp'")


@overload
def puredp_to_zcdp(epsilon: Fraction) -> Fraction: ...
@overload
def puredp_to_zcdp(epsilon: None) -> None: ...
def puredp_to_zcdp(epsilon: Fraction | None) -> Fraction | None:
    """ε-DP ⇒ (ε²/2)-zCDP (Bun & Steinke 2016, Prop. 1.4; SafeTab §3). ``None`` (infinite) stays infinite."""
    eps = _opt_budget(epsilon, "epsilon")
    return None if eps is None else eps * eps / 2


def stability_scale(budget: Fraction | None, stability: Fraction | int,
                    definition: Definition) -> Fraction | None:
    """Loss w.r.t. the protected data of a mechanism with ``budget`` run after a c-stable transformation.

    zCDP: c²·ρ (PHSafe Lemma 2, group privacy of zCDP); pure DP: c·ε (McSherry PINQ; group privacy).
    """
    b = _opt_budget(budget, "budget")
    c = parse_positive(stability, "stability")
    defn = _check_definition(definition, "definition")
    if b is None:
        return None
    return c * c * b if defn == "zcdp" else c * b


def parallel_compose(budget: Fraction | None, degree: int) -> Fraction | None:
    """Generalized parallel composition (SafeTab Lemmas 9, 10, 12): each call has ``budget`` and a record
    reaches at most ``degree`` = z calls ⇒ z·budget (the same rule for ε, ρ and RDP at fixed α)."""
    b = _opt_budget(budget, "budget")
    z = _degree(degree)
    return None if b is None else z * b


def unbounded_to_bounded(budget: Fraction | None, definition: Definition,
                         method: Literal["phsafe", "group"] = "phsafe") -> Fraction | None:
    """Loss under bounded neighbours (change one record = delete + add) from the unbounded (add/remove) loss.

    * ``phsafe`` (PHSafe Theorems 3-4): a delete plus an add move the count vector by at most c in the
      negative and c in the positive direction, so ‖Δ‖₂ ≤ √2·c: the same noise is 2ρ-zCDP (and 2ε-DP for
      the L1 analogue). Table 10's bounded column is exactly 2 × the unbounded one.
    * ``group`` (generic group privacy, group of 2): 4ρ-zCDP (k²ρ with k = 2), 2ε-DP.
    """
    b = _opt_budget(budget, "budget")
    defn = _check_definition(definition, "definition")
    if method not in ("phsafe", "group"):
        raise ValueError(f"method={method!r}: must be 'phsafe' or 'group'")
    if b is None:
        return None
    if defn == "puredp":
        return 2 * b
    return 2 * b if method == "phsafe" else 4 * b


def _degree(degree: object) -> int:
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"degree={degree!r}: must be an integer >= 1")
    return degree


@functools.lru_cache(maxsize=4096)
def _geometric_rdp_grid_float(epsilon: Fraction, divergence: GeometricDivergence) -> npt.NDArray[np.float64]:
    return geometric_rdp_float(ALPHA_GRID_FLOAT, float(epsilon), divergence)


@functools.lru_cache(maxsize=65536)
def _geometric_rdp_cached(alpha: Fraction, epsilon: Fraction, divergence: GeometricDivergence) -> Decimal:
    return geometric_rdp(alpha, epsilon, divergence)


@dataclass(frozen=True)
class Spend:
    """One planned mechanism (see the module docstring for the privacy argument of each field).

    ``budget``: ρ (zcdp) or ε (puredp) of one call w.r.t. the mechanism's own input; ``None`` = infinite (no
    noise). ``sensitivity``: L2 (zcdp) or L1 (puredp) sensitivity Δ of the query vector on that input.
    ``stability``: c of the transformation from the protected data. ``degree``: max number of calls one record
    reaches (generalized parallel composition). All are parsed exactly; bad values raise ``ValueError``.
    """

    definition: Definition
    budget: Fraction | None
    sensitivity: Fraction = Fraction(1)
    stability: Fraction = Fraction(1)
    label: str = ""
    degree: int = 1

    def __post_init__(self) -> None:
        tag = self.label or "spend"
        object.__setattr__(self, "definition", _check_definition(self.definition, f"{tag}.definition"))
        object.__setattr__(self, "budget", _opt_budget(self.budget, f"{tag}.budget"))
        object.__setattr__(self, "sensitivity", parse_positive(self.sensitivity, f"{tag}.sensitivity"))
        object.__setattr__(self, "stability", parse_positive(self.stability, f"{tag}.stability"))
        object.__setattr__(self, "degree", _degree(self.degree))

    @property
    def mechanism(self) -> str:
        return "discrete_gaussian" if self.definition == "zcdp" else "two_sided_geometric"

    def as_record(self) -> dict[str, object]:
        """A JSON-ready description (exact values as strings) for manifests and ledgers."""
        return {
            "label": self.label,
            "definition": self.definition,
            "mechanism": self.mechanism,
            "budget": "Infinity" if self.budget is None else str(self.budget),
            "sensitivity": str(self.sensitivity),
            "stability": str(self.stability),
            "degree": self.degree,
            "noise": str(self.noise()) if self.budget != 0 else None,
        }

    def noise(self) -> Fraction:
        """σ² = Δ²/(2ρ) (discrete Gaussian) or b = Δ/ε (two-sided geometric); 0 for an infinite budget."""
        if self.definition == "zcdp":
            return gaussian_sigma2(self.budget, self.sensitivity)
        return geometric_scale(self.budget, self.sensitivity)

    def epsilon_loss(self) -> Fraction | None:
        """Pure-DP loss z·c·ε (ValueError for a zCDP spend: the discrete Gaussian is not ε-DP for any ε)."""
        if self.definition != "puredp":
            raise ValueError(f"{self.label or 'spend'}: a zCDP spend has no pure-DP loss")
        return None if self.budget is None else self.degree * self.stability * self.budget

    def rho_loss(self) -> Fraction | None:
        """zCDP loss: z·c²·ρ, or z·(c·ε)²/2 for a pure-DP spend."""
        if self.budget is None:
            return None
        c = self.stability
        if self.definition == "zcdp":
            return self.degree * c * c * self.budget
        return self.degree * (c * self.budget) ** 2 / 2

    def rdp(self, alpha: Fraction, divergence: GeometricDivergence = "exact") -> Decimal | None:
        """RDP loss at order α (``None`` = infinite).

        zCDP: α·(z c² ρ). Geometric with Δ = 1 and c = 1: z·D_α (exact discrete divergence, or the paper's τ).
        Other pure-DP spends: z·min(cε, α(cε)²/2) (an ε-DP mechanism is (α, ε)-RDP and ε²/2-zCDP).
        """
        if self.budget is None:
            return None
        a = to_decimal(alpha)
        if self.definition == "zcdp":
            rho = self.rho_loss()
            assert rho is not None
            return a * to_decimal(rho)
        if self.sensitivity == 1 and self.stability == 1:
            return self.degree * _geometric_rdp_cached(alpha, self.budget, divergence)
        eps = to_decimal(self.stability * self.budget)
        return self.degree * min(eps, a * eps * eps / 2)

    def rdp_grid_float(self, divergence: GeometricDivergence = "exact") -> npt.NDArray[np.float64]:
        """:meth:`rdp` over :data:`ALPHA_GRID` in float64 (only to rank the grid: ``rdp_to_approx_dp``)."""
        a = ALPHA_GRID_FLOAT
        if self.budget is None:
            return np.full_like(a, np.inf)
        if self.definition == "zcdp":
            rho = self.rho_loss()
            assert rho is not None
            return a * float(rho)
        if self.sensitivity == 1 and self.stability == 1:
            return self.degree * _geometric_rdp_grid_float(self.budget, divergence)
        eps = float(self.stability * self.budget)
        return self.degree * np.minimum(eps, a * eps * eps / 2)


@dataclass(frozen=True)
class Sequential:
    """Adaptive sequential composition: losses add (SafeTab Lemmas 1-3)."""

    parts: tuple[Node, ...]
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))


@dataclass(frozen=True)
class Parallel:
    """Generalized parallel composition, degree z: loss = z × max over parts (SafeTab Lemmas 9, 10, 12)."""

    parts: tuple[Node, ...]
    degree: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(self.parts))
        if not self.parts:
            raise ValueError(f"{self.label or 'parallel'}.parts: empty")
        object.__setattr__(self, "degree", _degree(self.degree))


Node = Union[Spend, Sequential, Parallel]  # noqa: UP007  (a runtime alias used in annotations of dataclasses)


def spends(node: Node) -> Iterable[Spend]:
    """All leaves of a plan, depth first."""
    if isinstance(node, Spend):
        yield node
    else:
        for part in node.parts:
            yield from spends(part)


def _fold(node: Node, leaf: Callable[[Spend], Fraction | None]) -> Fraction | None:
    """Exact loss of a plan from its leaves' losses: sequential parts add; a parallel node of degree z costs
    z × its largest part (generalized parallel composition); ``None`` (infinite) absorbs everything."""
    if isinstance(node, Spend):
        return leaf(node)
    values = [_fold(p, leaf) for p in node.parts]
    if any(v is None for v in values):
        return None
    finite = [v for v in values if v is not None]
    if isinstance(node, Sequential):
        return sum(finite, Fraction(0))
    return node.degree * max(finite)


def _rho(node: Node) -> Fraction | None:
    return _fold(node, Spend.rho_loss)


def _eps(node: Node) -> Fraction | None:
    return _fold(node, Spend.epsilon_loss)


def _rdp(node: Node, alpha: Fraction, divergence: GeometricDivergence) -> Decimal | None:
    if isinstance(node, Spend):
        return node.rdp(alpha, divergence)
    values = [_rdp(p, alpha, divergence) for p in node.parts]
    if any(v is None for v in values):
        return None
    finite = [v for v in values if v is not None]
    if isinstance(node, Sequential):
        return sum(finite, Decimal(0))
    return node.degree * max(finite)


def _rdp_grid(node: Node, divergence: GeometricDivergence) -> npt.NDArray[np.float64]:
    if isinstance(node, Spend):
        return node.rdp_grid_float(divergence)
    values = [_rdp_grid(p, divergence) for p in node.parts]
    out: npt.NDArray[np.float64]
    if isinstance(node, Sequential):
        out = np.sum(values, axis=0) if values else np.zeros_like(ALPHA_GRID_FLOAT)
    else:
        out = node.degree * np.max(values, axis=0)
    return out


@dataclass(frozen=True)
class Total:
    """The composed loss of a plan.

    ``rho``: exact zCDP loss (pure parts as ε²/2); ``epsilon``: exact pure-DP loss if ``is_pure``; both
    ``None`` when ``is_infinite``. ``conversions``: the sound (ε, δ) conversions at ``delta``; ``best``:
    the smallest.
    """

    plan: Node
    rho: Fraction | None
    epsilon: Fraction | None
    is_pure: bool
    is_infinite: bool
    has_geometric: bool
    delta: Fraction
    conversions: tuple[Conversion, ...] = field(default=())

    @property
    def best(self) -> Conversion | None:
        sound = [c for c in self.conversions if c.sound]
        return min(sound, key=lambda c: c.epsilon) if sound else None

    @high_precision
    def rdp(self, alpha: RationalLike, divergence: GeometricDivergence = "exact") -> Decimal | None:
        """The plan's RDP curve at α (SafeTab Theorem 2 / eq. 39 for the geometric SafeTab plan)."""
        a = parse_rational(alpha, "alpha")
        if a <= 1:
            raise ValueError(f"alpha={alpha!r}: Rényi order must be > 1")
        return _rdp(self.plan, a, divergence)

    def rdp_conversion(self, delta: RationalLike | None = None,
                       divergence: GeometricDivergence = "exact",
                       conversion: Literal["cks", "mironov"] = "cks") -> Conversion:
        """SafeTab eq. (40): min over the α grid of CKS eq. (6) applied to the plan's RDP curve
        (``conversion="mironov"``: the looser ε = D_α + ln(1/δ)/(α−1), Mironov 2017 Prop. 3).

        ``divergence="paper"`` uses the paper's τ (eq. 29) — the recipe behind Table 2's RDP row; it is not a
        sound bound for the discrete mechanism and the result is marked ``sound=False``.
        """
        if self.is_infinite:
            raise ValueError("infinite budget: no (epsilon, delta) guarantee")
        d = self.delta if delta is None else delta

        def curve(alpha: Fraction) -> Decimal:
            value = _rdp(self.plan, alpha, divergence)
            assert value is not None
            return value

        name = "rdp_cks_grid" if conversion == "cks" else "rdp_mironov_grid"
        if divergence == "paper":
            return rdp_to_approx_dp(curve, d, ALPHA_GRID, sound=False, conversion=conversion,
                                    float_curve=lambda _a: _rdp_grid(self.plan, divergence),
                                    method=f"{name}_paper_tau (SafeTab Cor 1 eq 29 + Thm 2; NOT sound)")
        return rdp_to_approx_dp(curve, d, ALPHA_GRID, conversion=conversion,
                                float_curve=lambda _a: _rdp_grid(self.plan, divergence),
                                method=f"{name} (exact geometric divergence; SafeTab Thm 2 + eq 40)")

    def as_record(self) -> dict[str, object]:
        best = self.best
        return {
            "rho": "Infinity" if self.rho is None else str(self.rho),
            "epsilon_pure": (None if not self.is_pure
                             else "Infinity" if self.epsilon is None else str(self.epsilon)),
            "delta": str(self.delta),
            "conversions": [c.as_record() for c in self.conversions],
            "best": None if best is None else best.as_record(),
            "alpha_grid": "1.01, 1.02, ..., 10.00 (SafeTab App. F.2)",
            "precision_digits": PRECISION,
            "geometric_divergence": "exact discrete (default); paper tau only on request, marked unsound",
            "composition": "zcdp (pure-DP parts as eps^2/2)" if not self.is_pure else "puredp and zcdp",
        }


def _as_node(plan: Node | Iterable[Node]) -> Node:
    if isinstance(plan, Spend | Sequential | Parallel):
        return plan
    parts = tuple(plan)
    for p in parts:
        if not isinstance(p, Spend | Sequential | Parallel):
            raise ValueError(f"plan: {p!r} is not a Spend, Sequential or Parallel node")
    return Sequential(parts, label="plan")


@high_precision
def compose(plan: Node | Iterable[Node], delta: RationalLike = DELTA,
            *, rdp: bool = True) -> Total:
    """Compose a plan (a node, or an iterable of nodes composed sequentially); see the module docstring.

    ``rdp=False`` skips the RDP-grid conversion of geometric plans (it costs ~900 α evaluations).
    """
    node = _as_node(plan)
    d = parse_fraction_open(delta, "delta")
    leaves = list(spends(node))
    is_pure = all(s.definition == "puredp" for s in leaves)
    has_geometric = any(s.definition == "puredp" for s in leaves)
    rho = _rho(node)
    infinite = rho is None
    eps = _eps(node) if is_pure and not infinite else None
    conversions: list[Conversion] = []
    total = Total(node, rho, eps, is_pure, infinite, has_geometric, d)
    if not infinite:
        assert rho is not None
        if is_pure:
            assert eps is not None
            conversions.append(
                Conversion(to_decimal(eps), Fraction(0), "puredp (sequential composition, delta=0)"))
        conversions.append(zcdp_to_approx_dp_analytic(rho, d))
        conversions.append(zcdp_to_approx_dp_grid(rho, d))
        if has_geometric and rdp:
            conversions.append(total.rdp_conversion(d))
    return Total(node, rho, eps, is_pure, infinite, has_geometric, d, tuple(conversions))


def gaussian_sigma2(rho: object, sensitivity: object = 1) -> Fraction:
    """σ² = Δ²/(2ρ) of the discrete Gaussian that makes a sensitivity-Δ query ρ-zCDP (CKS 2020 Thm 14; SafeTab
    Alg. 5 with Δ = 1; PHSafe L3 with Δ = c = 2τ+2 or 2). Add/remove-neighbour calibration.

    ``rho`` = ``None``/``Infinity`` (infinite budget) → 0 (no noise). ``rho`` = 0 → ``ValueError`` (a zero
    budget means the measurement is not made). Exact ``Fraction``.
    """
    r = _opt_budget(rho, "rho")
    d = parse_positive(sensitivity, "sensitivity")
    if r is None:
        return Fraction(0)
    if r == 0:
        raise ValueError("rho=0: a zero budget means the measurement is not made (infinite noise)")
    return d * d / (2 * r)


def gaussian_sigma2_sq(rho: object, sensitivity_squared: object) -> Fraction:
    """σ² = Δ²/(2ρ) given Δ² directly (for irrational Δ such as √2).

    TopDown (spine spec §2, Lemma 4 / Theorem 1): change-one-record neighbours move one record between two
    cells of a query group, so Δ² = 2 and σ² = 1/(ρ·share) — never the add/remove 1/(2ρ).
    """
    r = _opt_budget(rho, "rho")
    d2 = parse_positive(sensitivity_squared, "sensitivity_squared")
    if r is None:
        return Fraction(0)
    if r == 0:
        raise ValueError("rho=0: a zero budget means the measurement is not made (infinite noise)")
    return d2 / (2 * r)


def geometric_scale(epsilon: object, sensitivity: object = 1) -> Fraction:
    """b = Δ/ε of the two-sided geometric P(k) ∝ exp(−|k|/b) that makes a sensitivity-Δ (L1) query ε-DP
    (SafeTab Alg. 4 / Lemma 6 with Δ = 1; Ghosh–Roughgarden–Sundararajan). ``None`` → 0 (no noise); 0 →
    ``ValueError``. Exact ``Fraction``."""
    e = _opt_budget(epsilon, "epsilon")
    d = parse_positive(sensitivity, "sensitivity")
    if e is None:
        return Fraction(0)
    if e == 0:
        raise ValueError("epsilon=0: a zero budget means the measurement is not made (infinite noise)")
    return d / e


def validate_shares(shares: Iterable[object], name: str, *, total: object = 1) -> tuple[Fraction, ...]:
    """Budget shares as exact positive rationals summing exactly to ``total`` (spine spec S4: β[l] > 0, Σβ
    = 1; α[i,l] > 0, Σα = 1). Float drift is rejected by the exact parse; a sum off by any amount raises."""
    parsed = tuple(parse_positive(s, f"{name}[{i}]") for i, s in enumerate(shares))
    want = parse_rational(total, "total")
    got = sum(parsed, Fraction(0))
    if got != want:
        raise ValueError(f"{name}: shares sum to {got} (= {float(got)!r}), not exactly {want}")
    return parsed



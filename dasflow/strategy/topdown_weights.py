"""Optimal budget shares α for TopDown's marginal queries (eigen-design.md §7, "weights for TopDown").

Setting. A geolevel measures candidate marginal queries ``Q_q`` (0/1 matrices that partition the cells of the
histogram, one row per cell of the marginal) over a Cartesian schema ``d_1 × … × d_k``. Query ``q`` receives
the share ``α_q`` of the geolevel's zCDP budget ρ: ``ρ_q = α_q ρ``, and is measured with the discrete
Gaussian of variance ``σ_q² = Δ²/(2 α_q ρ)``. Under add/remove-one neighbours one person changes exactly one
cell of every marginal, so ``Δ = 1`` for every candidate (replace-one doubles Δ² for every candidate alike).
Sequential composition gives ``Σ_q ρ_q = ρ`` exactly when ``Σ_q α_q = 1``.

Error. Weighted least squares over the measurements is the matrix mechanism with strategy rows
``sqrt(2 α_q ρ / Δ²) Q_q`` and unit noise, so the total squared error of a workload with Gram ``G = Σ_w ω_w
Q_wᵀQ_w`` is (Eq. 1) ``TSE = Δ²/(2ρ) · trace(G (Σ_q α_q Q_qᵀQ_q)⁻¹)``.

Structure (exact, not an approximation). Write ``P1_i = 11ᵀ/d_i`` and ``P⊥_i = I - P1_i``. For every subset
``T`` of attributes, ``V_T = ⊗_i (P⊥_i if i ∈ T else P1_i)`` is an orthogonal projector of rank
``∏_{i∈T}(d_i − 1)``, the ``V_T`` sum to ``I``, and a marginal over attributes ``S`` has ``Q_SᵀQ_S = Σ_{T⊆S}
c_S V_T`` with ``c_S = ∏_{i∉S} d_i``. All Grams are therefore simultaneously diagonal, and with ``s_T(α) =
Σ_{q ⊇ T} α_q c_q`` and ``g_T = Σ_{w ⊇ T} ω_w c_w``::

    f(α) = trace(G (Σ α_q Q_qᵀQ_q)⁻¹) = Σ_T g_T · rank(V_T) / s_T(α),

a convex function of at most ``2^k`` terms, minimised over the simplex. The singular value bound (Thm 2) of
the workload, over ALL Gaussian strategies of the same budget, is ``svdb = (Σ_T rank(V_T) sqrt(g_T))² / n``;
the report gives both so the restriction to marginal queries can be judged.

Exact rationals. The TopDown plan needs ``α_q`` as Fractions summing to exactly 1. The continuous optimum is
rounded to the grid ``1/denominator`` by largest remainders. Since ``s_T`` is linear in α with non-negative
coefficients, ``f(α^r) ≤ f(α*) / min_q(α^r_q / α*_q)`` over the kept queries: that a-priori bound and the
measured loss ``f(α^r)/f(α*) − 1`` are both reported. The optimum does not depend on ρ or on Δ (both are
common factors), so one share vector serves every budget.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from dasflow.errors import DasflowError, InputError

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "MarginalWeightPlan",
    "optimize_marginal_weights",
    "topdown_query_weights",
]


@dataclass(frozen=True)
class MarginalWeightPlan:
    """The optimal shares of one geolevel and how good they are.

    Objectives are ``f(α) = 2ρ/Δ² · TSE`` (budget-free); use :meth:`expected_tse` for a concrete ρ.
    """

    shares: dict[str, Fraction]
    continuous: dict[str, float]
    objective_continuous: float
    objective_rational: float
    objective_equal_shares: float
    lower_bound: float
    rounding_loss: float
    rounding_bound: float
    duality_gap: float
    per_table_rational: dict[str, float]
    cells: int
    workload_rows: int
    denominator: int
    dropped: tuple[str, ...]

    def expected_tse(self, rho: Fraction, sensitivity_squared: Fraction = Fraction(1)) -> float:
        """Total squared error of the workload (unconstrained WLS) when the geolevel spends ``rho``."""
        return float(sensitivity_squared) / (2.0 * float(rho)) * self.objective_rational

    def expected_rms(self, rho: Fraction, sensitivity_squared: Fraction = Fraction(1)) -> float:
        """Root mean squared error per workload answer (TSE / number of workload rows)."""
        return math.sqrt(self.expected_tse(rho, sensitivity_squared) / self.workload_rows)


def _schema(schema_shape: Mapping[str, int] | Sequence[tuple[str, int]]) -> tuple[list[str], list[int]]:
    items = list(schema_shape.items()) if isinstance(schema_shape, Mapping) else list(schema_shape)
    if not items:
        raise InputError("schema_shape: the schema has no attributes", column="schema_shape")
    if len(items) > 20:
        raise InputError("schema_shape: more than 20 attributes is not supported", column="schema_shape")
    names: list[str] = []
    sizes: list[int] = []
    for name, size in items:
        if not isinstance(size, int | np.integer) or isinstance(size, bool) or int(size) < 1:
            raise InputError(f"schema_shape: attribute {name!r} has size {size!r}; need an integer >= 1",
                             column=str(name))
        if name in names:
            raise InputError(f"schema_shape: attribute {name!r} repeats", column=str(name))
        names.append(str(name))
        sizes.append(int(size))
    return names, sizes


def _mask(attrs: Sequence[str] | str, names: list[str], what: str) -> int:
    if isinstance(attrs, str):
        attrs = [] if attrs in ("", "total") else (names if attrs == "detailed" else attrs.split("*"))
    mask = 0
    for a in attrs:
        a = a.strip()
        if a not in names:
            raise InputError(f"{what}: unknown attribute {a!r} (schema has {names})", column=what)
        mask |= 1 << names.index(a)
    return mask


def _named(specs: Mapping[str, Sequence[str] | str] | Sequence[Sequence[str] | str],
           names: list[str], what: str) -> dict[str, int]:
    out: dict[str, int] = {}
    if isinstance(specs, Mapping):
        for key, attrs in specs.items():
            out[str(key)] = _mask(attrs, names, f"{what}[{key}]")
    else:
        for attrs in specs:
            m = _mask(attrs, names, what)
            key = "*".join(names[i] for i in range(len(names)) if m >> i & 1) or "total"
            out[key] = m
    if not out:
        raise InputError(f"{what}: empty", column=what)
    return out


class _MarginalAlgebra:
    """The common eigenspaces V_T of all marginal Grams over one schema (see module docstring)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.k = len(sizes)
        self.n = math.prod(sizes)
        masks = np.arange(1 << self.k)
        bits = (masks[:, None] >> np.arange(self.k)[None, :]) & 1  # (2^k, k)
        d = np.asarray(sizes, dtype=np.float64)
        self.rank = np.prod(np.where(bits == 1, d - 1.0, 1.0), axis=1)  # rank(V_T)
        self.bits = bits
        self.masks = masks

    def scale(self, mask: int) -> float:
        """c_S = ∏_{i ∉ S} d_i: the eigenvalue of Q_SᵀQ_S on every V_T with T ⊆ S."""
        return float(math.prod(d for i, d in enumerate(self.sizes) if not mask >> i & 1))

    def cover(self, mask: int) -> npt.NDArray[np.bool_]:
        """Which T satisfy T ⊆ S."""
        return np.asarray((self.masks & ~mask) == 0, dtype=np.bool_)

    def spectrum(self, masks: list[int], weights: FloatArray) -> FloatArray:
        """Eigenvalue of Σ_q w_q Q_qᵀQ_q on each V_T."""
        out = np.zeros(1 << self.k)
        for m, w in zip(masks, weights, strict=True):
            out[self.cover(m)] += w * self.scale(m)
        return out


def optimize_marginal_weights(
    schema_shape: Mapping[str, int] | Sequence[tuple[str, int]],
    workload_marginals: Mapping[str, Sequence[str] | str] | Sequence[Sequence[str] | str],
    candidate_marginals: Mapping[str, Sequence[str] | str] | Sequence[Sequence[str] | str],
    *,
    workload_weights: Mapping[str, float | Fraction] | None = None,
    denominator: int = 10_000,
    gap_tolerance: float = 1e-7,
) -> MarginalWeightPlan:
    """Optimal zCDP shares α over ``candidate_marginals`` for the tables in ``workload_marginals``.

    A marginal is a sequence of attribute names (``[]`` or ``"total"`` = the total, ``"detailed"`` = every
    attribute, ``"a*b"`` = the a×b table). ``workload_weights`` weighs tables (default 1 each).
    Data-independent: nothing here reads a histogram. Raises :class:`InputError` if the candidates cannot
    answer the workload (some workload direction V_T is covered by no candidate) or the inputs are
    malformed.
    """
    names, sizes = _schema(schema_shape)
    if not isinstance(denominator, int) or denominator < 1:
        raise InputError(f"denominator must be a positive integer, got {denominator!r}", column="denominator")
    work = _named(workload_marginals, names, "workload_marginals")
    cand = _named(candidate_marginals, names, "candidate_marginals")
    if len(set(cand.values())) != len(cand):
        raise InputError("candidate_marginals: two candidates are the same marginal",
                         column="candidate_marginals")
    omega = np.ones(len(work))
    if workload_weights is not None:
        for key in workload_weights:
            if key not in work:
                raise InputError(f"workload_weights: {key!r} is not a workload table",
                                 column="workload_weights")
        omega = np.array([float(workload_weights.get(k, 1)) for k in work])
        if not np.all(np.isfinite(omega)) or np.any(omega <= 0):
            raise InputError("workload_weights must be finite and > 0", column="workload_weights")
    alg = _MarginalAlgebra(sizes)
    g = alg.spectrum(list(work.values()), omega)
    active = (g > 0) & (alg.rank > 0)
    cand_names = list(cand)
    cand_masks = [cand[c] for c in cand_names]
    # B[q, T] = c_q if T ⊆ q (restricted to active T): s = α @ B
    B = np.stack([np.where(alg.cover(m), alg.scale(m), 0.0) for m in cand_masks])[:, active]
    coef = (g * alg.rank)[active]
    uncovered = ~(B > 0).any(axis=0)
    if uncovered.any():
        t = alg.masks[active][np.argmax(uncovered)]
        attrs = [names[i] for i in range(alg.k) if t >> i & 1] or ["total"]
        raise InputError(
            "candidate_marginals cannot answer the workload: no candidate contains the attributes "
            f"{attrs} that the workload needs", column="candidate_marginals")
    k = len(cand_names)

    def f(a: FloatArray) -> float:
        s = a @ B
        if np.any(s <= 0):
            return math.inf
        return float(np.sum(coef / s))

    def grad(a: FloatArray) -> FloatArray:
        s = a @ B
        return np.asarray(-(B @ (coef / s**2)), dtype=np.float64)

    alpha = _solve_simplex(f, grad, k, B, coef)
    gap = _fw_gap(f, grad, alpha)
    if gap > gap_tolerance:
        raise DasflowError(f"share optimisation did not converge: relative duality gap {gap:.3g}")
    f_star = f(alpha)
    numerators = _round_to_grid(alpha, denominator, B)
    shares = {c: Fraction(int(numerators[i]), denominator)
              for i, c in enumerate(cand_names) if numerators[i] > 0}
    alpha_r = numerators / denominator
    f_r = f(alpha_r)
    kept = alpha > 0
    if np.any(kept & (alpha_r == 0)):
        # A query with a tiny optimal share was dropped: no a-priori bound, the measured loss is the report.
        bound = f_r / f_star - 1.0
    else:
        bound = float(1.0 / np.min(alpha_r[kept] / alpha[kept]) - 1.0)
    per_table: dict[str, float] = {}
    s_r = alpha_r @ B
    for wname, wmask in work.items():
        cov = alg.cover(wmask)[active]
        per_table[wname] = float(np.sum(alg.scale(wmask) * alg.rank[active][cov] / s_r[cov]))
    svdb = float(np.sum(alg.rank[active] * np.sqrt(g[active])) ** 2 / alg.n)
    rows = int(sum(alg.n / alg.scale(m) for m in work.values()))
    return MarginalWeightPlan(
        shares=shares,
        continuous={c: float(alpha[i]) for i, c in enumerate(cand_names)},
        objective_continuous=f_star,
        objective_rational=f_r,
        objective_equal_shares=f(np.full(k, 1.0 / k)),
        lower_bound=svdb,
        rounding_loss=f_r / f_star - 1.0,
        rounding_bound=bound,
        duality_gap=gap,
        per_table_rational=per_table,
        cells=alg.n,
        workload_rows=rows,
        denominator=denominator,
        dropped=tuple(c for i, c in enumerate(cand_names) if numerators[i] == 0),
    )


def topdown_query_weights(
    schema_shape: Mapping[str, int] | Sequence[tuple[str, int]],
    workload_marginals: Mapping[str, Sequence[str] | str] | Sequence[Sequence[str] | str],
    candidate_marginals: Mapping[str, Sequence[str] | str] | Sequence[Sequence[str] | str],
    *,
    workload_weights: Mapping[str, float | Fraction] | None = None,
    denominator: int = 10_000,
) -> dict[str, Fraction]:
    """``{query name: α_q}``, exact Fractions summing to exactly 1 (queries with α_q = 0 are omitted).

    See :func:`optimize_marginal_weights` for the optimisation, the error report and the rounding bound.
    """
    return optimize_marginal_weights(schema_shape, workload_marginals, candidate_marginals,
                                     workload_weights=workload_weights, denominator=denominator).shares


def _fw_gap(f: object, grad: object, a: FloatArray) -> float:
    """Relative Frank-Wolfe gap ``(∇f·α − min_q ∂_q f)/f(α) ≥ (f(α) − f*)/f(α)`` (f convex on the simplex)."""
    assert callable(f) and callable(grad)
    gr = grad(a)
    return float((gr @ a - gr.min()) / f(a))


def _solve_simplex(f: object, grad: object, k: int, B: FloatArray, coef: FloatArray) -> FloatArray:
    """Minimise ``f(α) = Σ_T coef_T / (αB)_T`` over the simplex by an active-set Newton method.

    On the current support S, Newton steps solve the equality-constrained problem (KKT system with the
    multiplier of Σα = 1); a ratio test drops a query whose share reaches 0; at a face optimum the query with
    the most negative reduced gradient (∂_q f < λ) re-enters. f is convex, so a point where no query violates
    the KKT conditions is the global optimum; the Frank-Wolfe gap certifies it afterwards.
    """
    assert callable(f) and callable(grad)
    a = np.full(k, 1.0 / k)
    support = np.ones(k, dtype=bool)
    for _ in range(200 + 20 * k):
        idx = np.where(support)[0]
        s = a @ B
        gr = grad(a)
        H = 2.0 * (B[idx] * (coef / s**3)) @ B[idx].T
        m = len(idx)
        # Jacobi-scaled KKT system: d = D d', D = diag(H)^(-1/2), for a well-conditioned solve.
        D = 1.0 / np.sqrt(np.maximum(np.diag(H), 1e-300))
        kkt = np.zeros((m + 1, m + 1))
        kkt[:m, :m] = H * D[:, None] * D[None, :]
        kkt[:m, m] = D
        kkt[m, :m] = D
        rhs = np.concatenate([-gr[idx] * D, [0.0]])
        sol = np.linalg.lstsq(kkt, rhs, rcond=1e-15)[0]
        for _refine in range(3):  # iterative refinement: the scaled KKT system can still be ill-conditioned
            sol = sol + np.linalg.lstsq(kkt, rhs - kkt @ sol, rcond=1e-15)[0]
        d = sol[:m] * D
        lam = -sol[m]
        dec = float(-gr[idx] @ d)
        spread = float(gr[idx].max() - gr[idx].min())
        if spread <= 1e-13 * abs(float(gr[idx].mean())) or dec <= 1e-30 * f(a):
            # face optimum: check the queries outside the support
            outside = np.where(~support)[0]
            if len(outside) == 0:
                break
            q = outside[np.argmin(gr[outside])]
            if gr[q] >= lam - 1e-13 * abs(lam):
                break
            support[q] = True
            # move a little mass onto q along the feasible descent direction e_q - α
            dirn = -a.copy()
            dirn[q] += 1.0
            t = 1.0
            f0 = f(a)
            while t > 1e-16 and not (f(a + t * dirn) < f0):
                t *= 0.5
            a = a + t * dirn
            continue
        neg = d < 0
        tmax = float(np.min(-a[idx][neg] / d[neg])) if neg.any() else math.inf
        t = min(1.0, tmax)
        f0 = f(a)
        # close to the optimum a pure Newton step is taken (an Armijo test would only see round-off)
        while t > 1e-16 and dec > 1e-10 * f0:
            trial = a.copy()
            trial[idx] += t * d
            trial = np.maximum(trial, 0.0)
            if f(trial) <= f0 - 1e-4 * t * dec:
                break
            t *= 0.5
        else:
            trial = a.copy()
            trial[idx] += t * d
            trial = np.maximum(trial, 0.0)
        a = trial
        zero = support & (a <= 1e-15)
        if zero.any() and zero.sum() < support.sum():
            support[zero] = False
            a[zero] = 0.0
        a = a / a.sum()
    return a


def _round_to_grid(alpha: FloatArray, denominator: int, B: FloatArray) -> npt.NDArray[np.int64]:
    """Largest-remainder rounding of α to integers summing to ``denominator``; the workload stays covered."""
    raw = alpha * denominator
    num = np.floor(raw).astype(np.int64)
    rest = int(denominator - num.sum())
    order = np.argsort(-(raw - num), kind="stable")
    num[order[:rest]] += 1
    # Every workload direction must stay covered: restore one grid step to the best-weighted lost query.
    while True:
        covered = (B[num > 0] > 0).any(axis=0) if (num > 0).any() else np.zeros(B.shape[1], dtype=bool)
        if covered.all():
            break
        need = ~covered
        cands = np.where((num == 0) & (B[:, need] > 0).any(axis=1))[0]
        q = cands[np.argmax(alpha[cands])]
        donor = int(np.argmax(num))
        if num[donor] <= 1:
            raise InputError(f"denominator {denominator} is too small to give every needed query a share",
                             column="denominator")
        num[donor] -= 1
        num[q] += 1
    return num

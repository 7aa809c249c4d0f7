"""Vectorised building blocks of the per-family estimation: weighted simplex projection and the exact integer
allocation. Both work on ``(K, C)`` arrays: K independent rows (one per parent cell with a positive count), C
child slots (padded; ``mask`` marks real children).

*Projection* (continuous): ``argmin Σ_c s_c (x_c − z_c)²`` s.t. ``x ≥ 0, Σ_c x_c = t``. KKT gives
``x_c = max(0, z_c − μ/s_c)``; μ is found exactly by sorting the breakpoints ``s_c z_c`` (the active set is a
prefix of that order).

*Integer allocation* (exact): ``argmin Σ_c w_c (x_c − z_c)²`` over non-negative integers with ``Σ_c x_c = t``.
The objective is separable convex, so an optimum takes the t cheapest unit increments
``Δ_c(k) = w_c(2k − 1 − 2z_c)`` (each child's increments increase with k). Child c has
``n_c(λ) = max(0, ⌊z_c + ½ + λ/(2w_c)⌋)`` increments of cost ≤ λ; λ is bracketed from the continuous
multiplier (λ* = −2μ; ``Σ n_c(λ* ∓ 4 max w)`` brackets t) and bisected, then the last increments are taken in
cost order (ties → lowest child slot). The result is an exact optimum up to floating-point ties.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


def weighted_simplex_projection(z: FloatArray, s: FloatArray, t: FloatArray,
                                mask: BoolArray) -> tuple[FloatArray, FloatArray]:
    """Row-wise projection (see module docstring). Returns ``(x, μ)``; rows with ``t = 0`` give ``x = 0``."""
    K = z.shape[0]
    s_safe = np.where(mask, s, 1.0)
    a = np.where(mask, s_safe * z, -np.inf)
    order = np.argsort(-a, axis=1, kind="stable")
    a_s = np.take_along_axis(a, order, axis=1)
    z_s = np.take_along_axis(np.where(mask, z, 0.0), order, axis=1)
    is_s = np.take_along_axis(np.where(mask, 1.0 / s_safe, 0.0), order, axis=1)
    cz = np.cumsum(z_s, axis=1)
    cis = np.cumsum(is_s, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        mu_k = (cz - t[:, None]) / cis
    valid = (a_s > mu_k) & np.isfinite(a_s)
    k = valid.sum(axis=1)
    k = np.maximum(k, 1)
    mu = mu_k[np.arange(K), k - 1]
    mu = np.where(np.isfinite(mu), mu, 0.0)
    x = np.where(mask, np.maximum(0.0, z - mu[:, None] / s_safe), 0.0)
    x[t <= 0] = 0.0
    return x, mu


def _counts(z: FloatArray, w: FloatArray, lam: FloatArray, mask: BoolArray) -> IntArray:
    n = np.floor(z + 0.5 + lam[:, None] / (2.0 * w))
    return np.where(mask, np.maximum(n, 0.0), 0.0).astype(np.int64)


def allocate_integer(z: FloatArray, w: FloatArray, t: IntArray, mask: BoolArray,
                     mu: FloatArray | None = None, iterations: int = 60) -> IntArray:
    """Row-wise exact integer allocation (see module docstring); every row sums to ``t`` exactly."""
    K, C = z.shape
    out = np.zeros((K, C), dtype=np.int64)
    if K == 0:
        return out
    w_safe = np.where(mask, w, 1.0)
    if mu is None:
        _, mu = weighted_simplex_projection(z, w_safe, t.astype(np.float64), mask)
    wmax = np.where(mask, w_safe, 0.0).max(axis=1)
    lam0 = -2.0 * mu
    lo = lam0 - 4.0 * wmax - 1.0
    hi = lam0 + 4.0 * wmax + 1.0
    for _ in range(200):  # widen until the bracket holds (a few steps at most)
        bad_lo = _counts(z, w_safe, lo, mask).sum(axis=1) >= t
        bad_hi = _counts(z, w_safe, hi, mask).sum(axis=1) < t
        if not (bad_lo.any() or bad_hi.any()):
            break
        span = (hi - lo)
        lo = np.where(bad_lo, lo - span, lo)
        hi = np.where(bad_hi, hi + span, hi)
    pos = t > 0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ge = _counts(z, w_safe, mid, mask).sum(axis=1) >= t
        hi = np.where(ge, mid, hi)
        lo = np.where(ge, lo, mid)
    x = _counts(z, w_safe, lo, mask)
    d = t - x.sum(axis=1)
    nxt = np.where(mask, w_safe * (2.0 * (x + 1) - 1.0 - 2.0 * z), np.inf)
    order = np.argsort(nxt, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(C), (K, C)), axis=1)
    x = x + ((rank < d[:, None]) & mask)
    x[~pos] = 0
    out[:] = x
    if not np.array_equal(out.sum(axis=1), np.where(pos, t, 0)):
        # Should be unreachable; let the caller log and use its fallback.
        raise ArithmeticError("integer allocation failed to meet the parent total")
    return out


def coupled_projection(z: FloatArray, s: FloatArray, t: FloatArray, mask: BoolArray, grp: IntArray,
                       totals: FloatArray, *, nu0: FloatArray | None = None, tol: float = 1e-8,
                       max_iter: int = 200) -> tuple[FloatArray, FloatArray]:
    """Projection onto the row simplices *and* group totals (the state invariants):
    ``argmin Σ s (x − z)²`` s.t. ``x ≥ 0`` (0 off ``mask``), ``Σ_c x_{k,c} = t_k`` per row and
    ``Σ_{grp = g} x = totals[g]`` per group (``grp = −1``: in no group).

    Dual method: for multipliers ν (one per group) the problem separates into the row projections of
    ``z − ν_{grp}/s`` (:func:`weighted_simplex_projection`); the dual is concave and piecewise quadratic in ν,
    maximised by semismooth Newton with its exact generalised Hessian ``−(diag(Σ_k a_k) − Σ_k a_k a_kᵀ/b_k)``
    (``a_{k,g}`` = Σ of 1/s over the row's active entries of group g, ``b_k`` over all active entries) and an
    Armijo line search. Returns ``(x, ν)``; raises ``ArithmeticError`` when the totals are not met to ``tol``
    (relative to the largest total) — e.g. infeasible totals."""
    n_g = int(totals.shape[0])
    s_safe = np.where(mask, s, 1.0)
    has = (grp >= 0) & mask
    gidx = np.where(has, grp, 0)
    flat_g = gidx[has]
    nu = np.zeros(n_g) if nu0 is None else nu0.astype(np.float64).copy()
    scale = max(1.0, float(np.abs(totals).max(initial=0.0)))

    def evaluate(v: FloatArray) -> tuple[FloatArray, FloatArray, float]:
        shift = np.where(has, v[gidx], 0.0) / s_safe
        x, _ = weighted_simplex_projection(z - shift, s_safe, t, mask)
        gsum = np.bincount(flat_g, weights=x[has], minlength=n_g) - totals
        d = np.where(mask, x - z, 0.0)
        val = 0.5 * float((s_safe * d * d).sum()) + float(v @ gsum)
        return x, gsum, val

    x, G, val = evaluate(nu)
    rows = np.broadcast_to(np.arange(z.shape[0])[:, None], z.shape)
    for _ in range(max_iter):
        if np.abs(G).max(initial=0.0) <= tol * scale:
            return x, nu
        act = (x > 0) & mask
        inv = np.where(act, 1.0 / s_safe, 0.0)
        b = inv.sum(axis=1)
        ga = act & has
        key = rows[ga] * n_g + gidx[ga]
        a = np.bincount(key, weights=inv[ga], minlength=z.shape[0] * n_g).reshape(z.shape[0], n_g)
        pos = b > 0
        hneg = np.diag(a.sum(axis=0)) - (a[pos] / b[pos][:, None]).T @ a[pos]
        ridge = 1e-12 * max(float(np.trace(hneg)), 1.0)
        step = np.linalg.lstsq(hneg + ridge * np.eye(n_g), G, rcond=None)[0]
        if not np.all(np.isfinite(step)) or float(step @ G) <= 0:
            step = G / max(float(np.abs(np.diag(hneg)).max(initial=0.0)), 1e-12)
        alpha = 1.0
        accepted = False
        for _ls in range(60):
            x2, G2, val2 = evaluate(nu + alpha * step)
            if val2 >= val + 1e-4 * alpha * float(step @ G) or np.abs(G2).max() < np.abs(G).max():
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            break
        nu = nu + alpha * step
        x, G, val = x2, G2, val2
    if np.abs(G).max(initial=0.0) <= tol * scale:
        return x, nu
    raise ArithmeticError(f"group totals not reachable (max gap {np.abs(G).max():.3g}); infeasible invariants?")


def round_network(xt: FloatArray, w: FloatArray, A: Any, b: IntArray) -> tuple[IntArray, bool]:
    """Integer ``x ≥ 0`` with ``A x = b`` exactly, minimising ``Σ w (x − x̃)²`` over ``x ∈ {⌊x̃⌋, ⌊x̃⌋+1}``
    (controlled rounding). ``A`` (sparse, 0/±1) is a network matrix here — every variable sits in one row
    constraint and at most one group constraint, a bipartite incidence, so totally unimodular: a feasible
    ``x̃`` guarantees an integer solution in that box and the LP optimum is integral. The squared loss is
    linear on the box (step cost ``w(1 − 2·frac)``); HiGHS' dual simplex (a vertex, hence integral) solves it,
    ``scipy.optimize.milp`` if a solution is not integral. If the box
    is infeasible (``x̃`` only approximately feasible) it widens to ``⌊x̃⌋ − 1 … ⌊x̃⌋ + 2`` with the exact
    convex step costs (the returned flag says so); ``ArithmeticError`` if that fails too."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, linprog, milp

    A = sparse.csc_matrix(A)
    xt = np.maximum(np.asarray(xt, dtype=np.float64), 0.0)
    f = np.floor(xt + 1e-9)
    phi = np.clip(xt - f, 0.0, 1.0)
    f = f.astype(np.int64)
    rhs = (np.asarray(b, dtype=np.int64) - A @ f).astype(np.float64)
    for ups, downs in ((1, 0), (2, 1)):
        cols = [A] * ups + [-A] * downs
        cost = [w * (2 * k - 1 - 2 * phi) for k in range(1, ups + 1)]
        cost += [w * (2 * k - 1 + 2 * phi) for k in range(1, downs + 1)]
        ub = [np.ones(f.size)] * ups + [(f >= k).astype(np.float64) for k in range(1, downs + 1)]
        M = sparse.hstack(cols, format="csc")
        c = np.concatenate(cost)
        ubs = np.concatenate(ub)
        # a basic optimal solution of the LP is integral (TU); the dual simplex without presolve returns one
        # quickly (HiGHS' MIP machinery on the same problem is ~300× slower). MILP only if it is not integral.
        res = linprog(c, A_eq=M, b_eq=rhs, bounds=np.stack([np.zeros(c.size), ubs], axis=1), method="highs-ds",
                      options={"presolve": False})
        if res.status != 0 or res.x is None:
            continue
        if np.abs(res.x - np.rint(res.x)).max(initial=0.0) > 1e-6:
            res = milp(c, integrality=np.ones(M.shape[1]), bounds=Bounds(0, ubs),
                       constraints=LinearConstraint(M, rhs, rhs))
            if res.status != 0 or res.x is None:
                continue
        steps = np.rint(res.x).astype(np.int64).reshape(ups + downs, f.size)
        x = f + steps[:ups].sum(axis=0) - steps[ups:].sum(axis=0)
        if np.array_equal(A @ x, np.asarray(b, dtype=np.int64)) and (x >= 0).all():
            return x, downs > 0
    raise ArithmeticError("controlled rounding: no integer solution meets the invariants")

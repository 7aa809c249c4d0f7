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


class SimplexProjector:
    """:func:`weighted_simplex_projection` for fixed ``(s, t, mask)`` applied to many points (the FISTA
    iterates of one batch).

    ``__call__`` is bit-identical to the one-shot projection:

    - The metric's constants are computed once.
    - The sort order of the previous call is reused for every row it still sorts — checked exactly, ties broken
      by the lower child slot as the stable sort breaks them; only the other rows are sorted again. The prefix
      sums of ``1/s`` depend on the order alone, so they are recomputed for the re-sorted rows only.
    - The breakpoint test ``a > μ_k`` is evaluated as ``−a < (t − Σz)/Σ(1/s)``: negation and the operand swap
      of a subtraction are exact in IEEE arithmetic, so it selects the same prefix; μ itself is then computed
      once per row exactly as the one-shot projection computes it.

    :meth:`vars` (the FISTA hot path) takes and returns only the variables (the ``mask`` entries, row-major) and
    sorts nothing: per row it solves ``Σ_c max(0, v_c − μ/s_c) = t`` by Newton's method on the left-hand side, a
    piecewise-linear, convex, decreasing function of μ (Michelot's active-set iteration; from either side of the
    root one step lands at or left of it, then the steps rise to it), started at the previous call's μ — between
    two close iterates the active set rarely changes, so one step and its check usually suffice. μ is final
    when the active set it gives is the one it was computed from: that is the KKT system of the projection, so
    the result is the projection (the same point as the sorting method's, up to floating-point rounding in
    μ's sums). A row still changing after ``NEWTON_STEPS`` steps (a rounding cycle between two active sets) is
    projected by the sorting method instead."""

    #: Newton steps per :meth:`vars` call before the rows still changing fall back to the sorting method
    NEWTON_STEPS = 50

    def __init__(self, s: FloatArray, t: FloatArray, mask: BoolArray) -> None:
        K, C = mask.shape
        self.shape = (K, C)
        self.mask = mask
        self.t = t
        self.s_safe = np.where(mask, s, 1.0)
        self.inv = np.where(mask, 1.0 / self.s_safe, 0.0).reshape(-1)
        self.base = (np.arange(K, dtype=np.int64) * C)[:, None]
        self.rows = np.arange(K)
        self.zero = t <= 0
        self.at = np.flatnonzero(mask)
        self.s_var = self.s_safe.reshape(-1)[self.at]
        self.row_var = self.at // max(C, 1)
        self.zero_var = self.zero[self.row_var]
        self.order: IntArray | None = None
        # ``__call__``'s sorted layout (made at its first call), transposed to (C, K): a row's prefix sums run
        # along axis 0, one vector add per slot (the same sequential additions per row as a row-wise cumsum,
        # without a per-row loop)
        self.idx: IntArray = np.zeros((0, K), dtype=np.int64)   # idx[j, r] = flat (K, C) index of rank j
        self.cis: FloatArray = np.zeros((0, K))
        self.later: BoolArray = np.zeros((0, K), dtype=bool)  # order[r, j+1] > order[r, j]
        # :meth:`vars`: the rows that hold variables (``starts``: each one's first variable), per variable its
        # row among them, 1/s, and whether its row is projected (t > 0; the others are 0)
        count = np.bincount(self.row_var, minlength=K)
        held = count > 0
        self._starts = (np.cumsum(count) - count)[held]
        self._held = np.flatnonzero(held)
        self._vrow = (np.cumsum(held) - 1)[self.row_var]
        self._inv_var = 1.0 / self.s_var
        self._t_held = t[held].astype(np.float64)
        self._live = ~self.zero_var
        self._live_held = self._t_held > 0
        self._some_zero = bool(self.zero_var.any())
        self._inv_sum = np.add.reduceat(self._inv_var, self._starts) if self._starts.size else np.zeros(0)
        self._mu_warm: FloatArray | None = None

    def _resort(self, key: FloatArray, rows: IntArray | None) -> None:
        sel = slice(None) if rows is None else rows
        order = np.argsort(key[sel], axis=1, kind="stable")
        if rows is None:
            K, C = self.shape
            self.order = order
            self.idx = np.zeros((C, K), dtype=np.int64)
            self.cis = np.zeros((C, K))
            self.later = np.zeros((max(C - 1, 0), K), dtype=bool)
        else:
            assert self.order is not None
            self.order[rows] = order
        idx = (order + self.base[sel]).T
        self.idx[:, sel] = idx
        self.cis[:, sel] = np.cumsum(self.inv[idx], axis=0)
        self.later[:, sel] = (order[:, 1:] > order[:, :-1]).T

    def _sorted_keys(self, key: FloatArray) -> FloatArray:
        """``key`` (K, C) sorted per row as ``argsort(key, kind="stable")`` sorts it, transposed to (C, K); the
        order is kept for the next call."""
        flat_key = key.reshape(-1)
        if self.order is None:
            self._resort(key, None)
            out: FloatArray = flat_key[self.idx]
            return out
        ks = flat_key[self.idx]
        ok = np.greater(ks[1:], ks[:-1])
        tie = np.equal(ks[1:], ks[:-1])
        np.logical_and(tie, self.later, out=tie)
        np.logical_or(ok, tie, out=ok)
        bad = np.flatnonzero(~ok.all(axis=0))
        if bad.size:
            self._resort(key, bad)
            ks[:, bad] = flat_key[self.idx[:, bad]]
        return ks

    def _mu(self, key: FloatArray, zm: FloatArray) -> FloatArray:
        """μ per row from the negated breakpoints ``key`` (+inf off the mask) and the masked point ``zm``."""
        ks = self._sorted_keys(key)
        cz = np.cumsum(zm.reshape(-1)[self.idx], axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            neg_mu = (self.t[None, :] - cz) / self.cis
            valid = ks < neg_mu
            if ks.size and (ks[0] == -np.inf).any():   # a breakpoint +inf: the one-shot test excludes it
                valid &= np.isfinite(ks)
            k = np.maximum(np.count_nonzero(valid, axis=0), 1)
            mu = (cz[k - 1, self.rows] - self.t) / self.cis[k - 1, self.rows]
        out: FloatArray = np.where(np.isfinite(mu), mu, 0.0)
        return out

    def __call__(self, z: FloatArray) -> tuple[FloatArray, FloatArray]:
        """``weighted_simplex_projection(z, s, t, mask)``."""
        mask = self.mask
        key = np.where(mask, -(self.s_safe * z), np.inf)
        mu = self._mu(key, np.where(mask, z, 0.0))
        x = np.where(mask, np.maximum(0.0, z - mu[:, None] / self.s_safe), 0.0)
        x[self.zero] = 0.0
        return x, mu

    def vars(self, v: FloatArray) -> FloatArray:
        """The projection of the point with variables ``v`` (zero off the mask), at the variables only (Newton's
        method on μ, warm-started; see the class docstring)."""
        st, inv, t = self._starts, self._inv_var, self._t_held
        if not st.size:
            return np.zeros_like(v)
        mu = self._mu_warm if self._mu_warm is not None else self._all_active(v)
        act: BoolArray | None = None
        for _ in range(self.NEWTON_STEPS):
            a, shift = self._active(v, mu)
            if act is not None and np.array_equal(a, act):
                break                                 # μ is the one its own active set gives: KKT holds
            # the active terms by a product with the mask (3x cheaper than a select): 1/s > 0, so ``inv · a`` is
            # exact; ``v · 0`` is a zero that may be -0.0 where the select gave +0.0, which changes a row's sum
            # only while it holds zeros alone, and then (sz - t) is -t for t > 0 either way (rows with t = 0
            # are set to 0 below): the same μ and projection, bit for bit
            sz = np.add.reduceat(v * a, st)
            si = np.add.reduceat(inv * a, st)
            with np.errstate(divide="ignore", invalid="ignore"):
                mu = np.where(si > 0, (sz - t) / si, 0.0)
            empty = (si == 0) & self._live_held
            if empty.any():  # μ at or beyond every breakpoint (right of the root, zero slope): restart from
                mu[empty] = self._all_active(v)[empty]   # the left, where every variable is active
            act = a
        else:
            mu = self._settle(v, mu, act)
            shift = mu[self._vrow] * inv
        self._mu_warm = mu
        x: FloatArray = np.subtract(v, shift, out=shift)
        np.maximum(x, 0.0, out=x)
        if self._some_zero:
            x[self.zero_var] = 0.0
        return x

    def _active(self, v: FloatArray, mu: FloatArray) -> tuple[BoolArray, FloatArray]:
        """The active variables — where ``x = max(0, v − m)``, ``m = μ·(1/s)``, is positive — in projected rows,
        and ``m`` per variable. ``v > m`` is the test (for finite values it holds exactly when ``v − m > 0``, so the
        active set is exactly where the returned projection is positive)."""
        shift: FloatArray = mu[self._vrow]
        shift *= self._inv_var
        a: BoolArray = np.greater(v, shift)
        if self._some_zero:
            a &= self._live
        return a, shift

    def _all_active(self, v: FloatArray) -> FloatArray:
        """μ per row with every variable active: ``f(μ) ≥ 0`` there, so it lies left of the root."""
        with np.errstate(divide="ignore", invalid="ignore"):
            out: FloatArray = (np.add.reduceat(v, self._starts) - self._t_held) / self._inv_sum
        return out

    def _settle(self, v: FloatArray, mu: FloatArray, act: BoolArray | None) -> FloatArray:
        """μ after the Newton steps ran out: the rows whose active set still changes get the sorting method's."""
        if act is None:
            return mu
        moving = np.logical_or.reduceat(self._active(v, mu)[0] != act, self._starts)
        if moving.any():
            rows = self._held[moving]
            zm = np.zeros(self.shape[0] * self.shape[1])
            zm[self.at] = v
            _, exact = weighted_simplex_projection(zm.reshape(self.shape)[rows], self.s_safe[rows], self.t[rows],
                                                   self.mask[rows])
            mu = mu.copy()
            mu[moving] = exact
        return mu


def _counts(z: FloatArray, w: FloatArray, lam: FloatArray, mask: BoolArray) -> IntArray:
    n = np.floor(z + 0.5 + lam[:, None] / (2.0 * w))
    return np.where(mask, np.maximum(n, 0.0), 0.0).astype(np.int64)


class _CountSums:
    """``_counts(z, w, lam, mask).sum(axis=1)`` for many λ, bit-identical: ``z + ½`` and ``2w`` computed once,
    the arrays transposed to (C, K) so the row sums are C vector adds, and the sums kept in float64 (sums of
    non-negative integers below 2**53 are exact)."""

    def __init__(self, z: FloatArray, w: FloatArray, mask: BoolArray) -> None:
        self.zh = np.ascontiguousarray(z.T) + 0.5
        self.w2 = 2.0 * np.ascontiguousarray(w.T)
        self.off = ~np.ascontiguousarray(mask.T)

    def __call__(self, lam: FloatArray) -> FloatArray:
        n = lam[None, :] / self.w2
        n += self.zh
        np.floor(n, out=n)
        np.maximum(n, 0.0, out=n)
        n[self.off] = 0.0
        out: FloatArray = n.sum(axis=0)
        return out


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
    sums = _CountSums(z, w_safe, mask)
    for _ in range(200):  # widen until the bracket holds (a few steps at most)
        bad_lo = sums(lo) >= t
        bad_hi = sums(hi) < t
        if not (bad_lo.any() or bad_hi.any()):
            break
        span = (hi - lo)
        lo = np.where(bad_lo, lo - span, lo)
        hi = np.where(bad_hi, hi + span, hi)
    pos = t > 0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ge = sums(mid) >= t
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

    onto = SimplexProjector(s_safe, t, mask)

    def evaluate(v: FloatArray) -> tuple[FloatArray, FloatArray, float]:
        shift = np.where(has, v[gidx], 0.0) / s_safe
        x, _ = onto(z - shift)
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

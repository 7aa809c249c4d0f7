"""Relaxed-QP baselines M_H-R and M_HC-R (Fioretto et al. Secs. 5 and 8): convex QP, then rounding.

M_H-R: min sum (x - noisy)^2 over all (level, region, column) subject to parent = sum of children per column,
x >= 0 and sum_j x[root, j] = n (Model 1 without integrality); each entry is then rounded to the nearest
integer. M_HC-R: the same on cumulative variables y (Model 2 without integrality): y[r, j] <= y[r, j+1], y >=
0, consistency per column, y[root, k] = n; rounded, then Lambda^{-1}. Rounding breaks consistency and
faithfulness; the callers count the violations (#CV, requirement V2) instead of hiding them.

Solvers. The default is Clarabel (``clarabel``; a primal-dual interior-point method with a sparse LDL
factorisation of the KKT system), the open analogue of the barrier QP the paper ran in Gurobi. The
problem is posed sparsely: Hessian 2I, one equality row per non-leaf (r, j) plus the n row, -I rows for x >= 0
(and one 2-entry row per monotonicity constraint for M_HC-R). ``solver="highs"`` keeps the former HiGHS path
for comparison only: HiGHS' QP solver is a primal active-set method that changes the active set one bound at a
time and keeps a *dense* factor of the reduced Hessian (null-space dimension ~ free variables - equality
rows, here ~ 10^4..10^6), so it runs out of time at k = 10 and out of memory (``std::bad_alloc``) at Census
scale, whatever the formulation. Clarabel works on the deviation d = x - anchor from a non-negative anchor
(the leaves' clipped noisy values and their tree sums), with the right-hand sides scaled to ~1e6: its relative
tolerances then act on noise-sized quantities (solving in x directly stops with duality gaps ~1e7 when n ~
1e8, and the unscaled cumulative problem is declared infeasible).

``solver="tree"`` (M_H-R only) is an independent exact solver of the same relaxed Model 1 that exploits its
structure: per column the QP is a tree problem coupled to the others only through the n row, and each subtree's
response to a price on its root is piecewise linear with one breakpoint per leaf (``_solve_tree_relaxed``). It
cross-checks Clarabel at full scale and shows what a structure-aware relaxation costs.

Certificate. ``QPResult.kkt`` is computed here from the returned primal x and dual z, independently of the
solver's own stopping test, in the units of the original problem: the largest primal residual (equality rows,
negativity, monotonicity), the stationarity residual ||2(x - t) + A'z||_inf, the most negative inequality
multiplier, and the duality gap f(x) - g(z+) where g is the exact Lagrangian dual function evaluated at the
multipliers with the inequality part clipped to >= 0 (a valid lower bound on the optimum, so the gap bounds
the sub-optimality of x up to its primal residual).

Privacy: post-processing of noisy arrays plus public n and tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from dasflow.postprocess.isotonic import cumulative_inverse
from dasflow.postprocess.tree_dp import TreeShape

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
QPSolver = Literal["clarabel", "highs", "tree"]

__all__ = ["KKTReport", "QPResult", "QPSolver", "relaxed_counts_qp", "relaxed_cumulative_qp", "round_half_up"]


@dataclass(frozen=True)
class KKTReport:
    """Optimality certificate of a relaxed solution (original units; see the module docstring)."""

    objective: float
    dual_bound: float
    primal_residual: float
    stationarity: float
    dual_infeasibility: float

    @property
    def gap(self) -> float:
        """Absolute duality gap f(x) - g(z+)."""
        return self.objective - self.dual_bound

    @property
    def relative_gap(self) -> float:
        return self.gap / max(1.0, abs(self.objective))


@dataclass(frozen=True)
class QPResult:
    """Relaxed solution per level (float), its rounding (int), solver status, solve seconds, certificate."""

    relaxed: tuple[FloatArray, ...]
    rounded: tuple[IntArray, ...]
    status: str
    seconds: float
    kkt: KKTReport | None = None


def round_half_up(x: FloatArray) -> IntArray:
    """Nearest integer, halves up (deterministic, unlike banker's rounding)."""
    out: IntArray = np.floor(x + 0.5).astype(np.int64)
    return out


def _offsets(shape: TreeShape, k: int) -> list[int]:
    off = [0]
    for s in shape.sizes:
        off.append(off[-1] + s * k)
    return off


def _consistency_rows(shape: TreeShape, k: int, off: list[int]) -> tuple[IntArray, IntArray, FloatArray]:
    """CSR pieces (row lengths, column indices, values) of x[l, r, j] - sum_{children} x[l+1, r', j] = 0."""
    lens: list[IntArray] = []
    idx: list[IntArray] = []
    val: list[FloatArray] = []
    for l in range(shape.levels - 1):
        starts = shape.child_starts(l)
        nchild = np.diff(np.r_[starts, shape.sizes[l + 1]]).astype(np.int64)
        # rows (r, j) in r-major order; row length 1 + nchild[r]
        rl = np.repeat(1 + nchild, k)
        r_of_row = np.repeat(np.arange(shape.sizes[l], dtype=np.int64), k)
        j_of_row = np.tile(np.arange(k, dtype=np.int64), shape.sizes[l])
        pos = np.arange(int(rl.sum()), dtype=np.int64) - np.repeat(np.r_[0, np.cumsum(rl)[:-1]], rl)
        r_e = np.repeat(r_of_row, rl)
        j_e = np.repeat(j_of_row, rl)
        child = starts[r_e] + pos - 1
        col = np.where(pos == 0, off[l] + r_e * k + j_e, off[l + 1] + child * k + j_e)
        lens.append(rl)
        idx.append(col)
        val.append(np.where(pos == 0, 1.0, -1.0))
    if not lens:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0)
    return np.concatenate(lens), np.concatenate(idx), np.concatenate(val)


@dataclass(frozen=True)
class _Problem:
    """min ||x - t||^2 s.t. A_eq x = b_eq, A_le x <= 0 (monotone rows), x >= 0."""

    target: FloatArray
    a_eq: sp.csr_matrix
    b_eq: FloatArray
    a_le: sp.csr_matrix  # may have 0 rows
    anchor: FloatArray  # a non-negative point near the optimum: the solver works on d = x - anchor


def _csr(lens: IntArray, cols: IntArray, vals: FloatArray, n_var: int) -> sp.csr_matrix:
    indptr = np.r_[0, np.cumsum(lens)].astype(np.int64)
    return sp.csr_matrix((vals, cols.astype(np.int64), indptr), shape=(int(lens.size), n_var))


def _certificate(p: _Problem, x: FloatArray, z_eq: FloatArray, z_le: FloatArray, z_nn: FloatArray) -> KKTReport:
    """Primal/dual residuals and the duality gap of (x, z) for the problem p (module docstring).

    Lagrangian: ||x - t||^2 + z_eq'(A_eq x - b_eq) + z_le'(A_le x) - z_nn'x with z_le, z_nn >= 0.
    """
    t = p.target
    r_eq = p.a_eq @ x - p.b_eq
    r_le = np.maximum(p.a_le @ x, 0.0) if p.a_le.shape[0] else np.zeros(0)
    primal = max(float(np.abs(r_eq).max(initial=0.0)), float(r_le.max(initial=0.0)), float(np.maximum(-x, 0).max()))
    grad = 2.0 * (x - t) + p.a_eq.T @ z_eq - z_nn
    if p.a_le.shape[0]:
        grad = grad + p.a_le.T @ z_le
    stat = float(np.abs(grad).max(initial=0.0))
    dual_inf = float(max(np.maximum(-z_le, 0).max(initial=0.0), np.maximum(-z_nn, 0).max(initial=0.0)))
    # exact dual function at (z_eq, z_le+, z_nn+): min_x ||x - t||^2 + w'x - z_eq'b_eq, w = A_eq'z + A_le'z - z_nn
    zl, zn = np.maximum(z_le, 0.0), np.maximum(z_nn, 0.0)
    w = p.a_eq.T @ z_eq - zn
    if p.a_le.shape[0]:
        w = w + p.a_le.T @ zl
    dual = float(w @ t - 0.25 * (w @ w) - z_eq @ p.b_eq)
    obj = float(((x - t) ** 2).sum())
    return KKTReport(obj, dual, primal, stat, dual_inf)


_TOL = (1e-9, 1e-10)  # absolute / relative duality-gap tolerances (on the deviation from the anchor)


def _solve_clarabel(p: _Problem, time_limit: float | None) -> tuple[FloatArray, str, float, KKTReport | None]:
    """Clarabel on d = x - anchor (targets t - anchor are noise-sized, so the IPM's relative tolerances act
    on the deviation instead of on counts of size ~n: solving in x directly leaves gaps of ~1e7 at n ~ 1e8)."""
    import clarabel  # the relaxed-QP baselines' interior-point solver (a declared dependency)

    n_var = p.target.size
    n_eq, n_le = p.a_eq.shape[0], p.a_le.shape[0]
    x0 = p.anchor
    a = sp.vstack([p.a_eq, p.a_le, -sp.identity(n_var, format="csr")], format="csc")
    b = np.r_[p.b_eq - p.a_eq @ x0, -(p.a_le @ x0) if n_le else np.zeros(0), x0]
    cones = [clarabel.ZeroConeT(n_eq)]
    if n_le:
        cones.append(clarabel.NonnegativeConeT(n_le))
    cones.append(clarabel.NonnegativeConeT(n_var))
    hess = sp.diags(np.full(n_var, 2.0), format="csc")
    settings = clarabel.DefaultSettings()
    settings.verbose = False
    settings.tol_gap_abs, settings.tol_gap_rel = _TOL
    if time_limit is not None:
        settings.time_limit = float(time_limit)
    t0 = time.perf_counter()
    # the -I rows' right-hand sides are the anchor (~n at the root); keep them ~1e6 (unscaled, the cumulative
    # problem is declared dual infeasible at n ~ 1e8)
    scale = max(1.0, float(np.abs(b).max(initial=0.0)) / 1e6)
    solver = clarabel.DefaultSolver(hess, -2.0 * (p.target - x0) / scale, a, b / scale, cones, settings)
    del a, b, hess
    sol = solver.solve()
    secs = time.perf_counter() - t0
    status = str(sol.status)
    x = x0 + scale * np.asarray(sol.x, dtype=np.float64)
    z = scale * np.asarray(sol.z, dtype=np.float64)
    if x.size != n_var or not np.all(np.isfinite(x)):
        return np.full(n_var, np.nan), status, secs, None
    kkt = _certificate(p, x, z[:n_eq], z[n_eq : n_eq + n_le], z[n_eq + n_le :])
    return x, status, secs, kkt


def _solve_highs(p: _Problem, time_limit: float | None) -> tuple[FloatArray, str, float, KKTReport | None]:
    import highspy

    n_var = p.target.size
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    a = sp.vstack([p.a_eq, p.a_le], format="csr")
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = n_var
    lp.num_row_ = int(a.shape[0])
    lp.col_cost_ = -2.0 * p.target
    lp.col_lower_ = np.zeros(n_var)
    lp.col_upper_ = np.full(n_var, inf)
    lp.row_lower_ = np.r_[p.b_eq, np.full(p.a_le.shape[0], -inf)]
    lp.row_upper_ = np.r_[p.b_eq, np.zeros(p.a_le.shape[0])]
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = a.indptr.astype(np.int32)
    lp.a_matrix_.index_ = a.indices.astype(np.int32)
    lp.a_matrix_.value_ = a.data
    hess = highspy.HighsHessian()
    hess.dim_ = n_var
    hess.format_ = highspy.HessianFormat.kTriangular
    hess.start_ = np.arange(n_var + 1, dtype=np.int32)
    hess.index_ = np.arange(n_var, dtype=np.int32)
    hess.value_ = np.full(n_var, 2.0)
    model = highspy.HighsModel()
    model.lp_ = lp
    model.hessian_ = hess
    h.passModel(model)
    t0 = time.perf_counter()
    h.run()
    secs = time.perf_counter() - t0
    status = h.modelStatusToString(h.getModelStatus())
    x = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if x.size != n_var:
        x = np.full(n_var, np.nan)
    return x, status, secs, None


def _seg_count_le(bp: FloatArray, off: IntArray, q: FloatArray) -> IntArray:
    """Per segment s (``bp[off[s]:off[s+1]]``, sorted): how many breakpoints are <= q[s]."""
    le = bp <= np.repeat(q, np.diff(off))
    cs = np.r_[0, np.cumsum(le)]
    out: IntArray = (cs[off[1:]] - cs[off[:-1]]).astype(np.int64)
    return out


@dataclass
class _Response:
    """Per node (column-major within a level) the response v(mu) = argmin_{v} C_r(v) - mu v of its subtree to a
    price mu from its parent: convex piecewise linear, 0 left of the first breakpoint. Breakpoints of node i are
    ``mu[off[i]:off[i+1]]`` (increasing) with value ``v`` and right slope ``s``; an internal node also keeps, per
    breakpoint, the price ``nu`` it passes to its children and the slope ``s_children`` of the children's total."""

    off: IntArray
    mu: FloatArray
    v: FloatArray
    s: FloatArray
    nu: FloatArray | None = None
    s_children: FloatArray | None = None
    nchild: IntArray | None = None


def _increments(rep: _Response) -> FloatArray:
    """Slope increment at every breakpoint (the first breakpoint of a node carries its whole slope)."""
    d: FloatArray = rep.s - np.r_[0.0, rep.s[:-1]]
    sz = np.diff(rep.off)
    first = rep.off[:-1][sz > 0]
    d[first] = rep.s[first]
    return d


def _solve_tree_relaxed(
    shape: TreeShape, noisy: list[npt.NDArray[np.generic]], total: int
) -> tuple[FloatArray, str, float, KKTReport | None]:
    """Exact relaxed Model 1 (M_H-R) by parametric tree responses, an independent structured solver.

    With a price mu on a node's value, min (v - t)^2 + Phi(v) - mu v is solved by v = S(nu), the children's
    total response to the price nu they receive, where nu + 2(S(nu) - t) = mu (stationarity). A leaf answers
    max(0, t + mu/2). So every response is piecewise linear with one breakpoint per leaf below it: bottom-up, a
    parent merges its children's breakpoints (one lexsort per level), sums their slopes and maps nu -> mu; the n
    row fixes the common price mu0 of the k roots (one sort over all root breakpoints); top-down, each node
    inverts its map at the price it receives. O(k |R| log(k |R|)); duals (the prices) give the certificate.
    """
    t0 = time.perf_counter()
    levels = shape.levels
    k = int(np.asarray(noisy[0]).shape[1])
    t = [np.asarray(a, dtype=np.float64).T.ravel() for a in noisy]  # node (r, j) -> j * n_l + r
    reps: list[_Response] = [None] * levels  # type: ignore[list-item]
    n_leaf = t[-1].size
    reps[-1] = _Response(np.arange(n_leaf + 1, dtype=np.int64), -2.0 * t[-1], np.zeros(n_leaf), np.full(n_leaf, 0.5))
    for l in range(levels - 2, -1, -1):
        ch = reps[l + 1]
        starts = (shape.child_starts(l)[None, :] + shape.sizes[l + 1] * np.arange(k, dtype=np.int64)[:, None]).ravel()
        n_par = starts.size
        nchild = np.diff(np.r_[starts, ch.off.size - 1]).astype(np.int64)
        csz = np.diff(ch.off)
        elem_par = np.repeat(np.repeat(np.arange(n_par, dtype=np.int64), nchild), csz)
        order = np.lexsort((ch.mu, elem_par))
        nu = ch.mu[order]
        psz = np.bincount(elem_par, minlength=n_par).astype(np.int64)
        off = np.r_[0, np.cumsum(psz)].astype(np.int64)
        heads = off[:-1][psz > 0]
        c = np.cumsum(_increments(ch)[order])
        s_sum = c - np.repeat(np.r_[0.0, c][off[:-1]], psz)  # slope of S right of each breakpoint
        inc = np.r_[0.0, s_sum[:-1]] * np.diff(np.r_[0.0, nu])
        inc[heads] = 0.0
        ci = np.cumsum(inc)
        total_s = ci - np.repeat(np.r_[0.0, ci][off[:-1]], psz)  # S at each breakpoint
        mu = nu + 2.0 * (total_s - np.repeat(t[l], psz))
        reps[l] = _Response(off, mu, total_s, s_sum / (1.0 + 2.0 * s_sum), nu, s_sum, nchild)
    root = reps[0]
    o = np.argsort(root.mu, kind="stable")
    mu_all = root.mu[o]
    slope_all = np.cumsum(_increments(root)[o])
    val_all = np.r_[0.0, np.cumsum(slope_all[:-1] * np.diff(mu_all))]
    b = max(0, int(np.searchsorted(val_all, float(total), side="right")) - 1)
    mu0 = float(mu_all[b] + (total - val_all[b]) / slope_all[b])
    xs: list[FloatArray] = []
    duals: list[FloatArray] = []
    prices = np.full(k, mu0)
    for l in range(levels):
        rep = reps[l]
        if l == levels - 1:
            xs.append(np.maximum(0.0, t[l] + prices / 2.0))
            break
        assert rep.nu is not None and rep.s_children is not None and rep.nchild is not None
        cnt = _seg_count_le(rep.mu, rep.off, prices)
        has = cnt > 0
        idx = rep.off[:-1] + np.maximum(cnt - 1, 0)
        nu_b, mu_b, s_b = rep.nu[idx], rep.mu[idx], rep.s_children[idx]
        nu = np.where(has, nu_b + (prices - mu_b) / (1.0 + 2.0 * s_b), prices + 2.0 * t[l])
        xs.append(np.where(has, rep.v[idx] + s_b * (nu - nu_b), 0.0))
        duals.append(nu)
        prices = np.repeat(nu, rep.nchild)
    secs = time.perf_counter() - t0
    # back to the level-major, r-major layout of counts_problem; row (l, r, j) carries the price nu of (l, r, j)
    x = np.concatenate([xi.reshape(k, -1).T.ravel() for xi in xs])
    z_rows = np.concatenate([d.reshape(k, -1).T.ravel() for d in duals])
    p = counts_problem(shape, noisy, total)
    z_eq = np.r_[z_rows, -mu0]
    z_nn = 2.0 * (x - p.target) + p.a_eq.T @ z_eq  # makes stationarity exact; its negative part is dual infeasibility
    return x, "Solved", secs, _certificate(p, x, z_eq, np.zeros(0), z_nn)


def _run(p: _Problem, time_limit: float | None, solver: QPSolver) -> tuple[FloatArray, str, float, KKTReport | None]:
    if solver == "tree":
        raise ValueError("solver 'tree' solves the relaxed Model 1 (M_H-R) only")
    if solver == "clarabel":
        return _solve_clarabel(p, time_limit)
    if solver == "highs":
        return _solve_highs(p, time_limit)
    raise ValueError(f"unknown QP solver {solver!r}")


def _split(x: FloatArray, shape: TreeShape, k: int, off: list[int]) -> tuple[FloatArray, ...]:
    return tuple(x[off[l] : off[l + 1]].reshape(shape.sizes[l], k) for l in range(shape.levels))


def _targets(shape: TreeShape, noisy: list[npt.NDArray[np.generic]]) -> tuple[int, list[int], FloatArray]:
    if len(noisy) != shape.levels:
        raise ValueError(f"need one noisy array per level ({shape.levels}), got {len(noisy)}")
    k = int(np.asarray(noisy[0]).shape[1])
    for l, a in enumerate(noisy):
        if np.asarray(a).shape != (shape.sizes[l], k):
            raise ValueError(f"level {l}: noisy array must have shape ({shape.sizes[l]}, {k})")
    off = _offsets(shape, k)
    target = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in noisy])
    if not np.all(np.isfinite(target)):
        raise ValueError("noisy values must be finite")
    return k, off, target


def _tree_sums(shape: TreeShape, leaf: FloatArray) -> FloatArray:
    """Flattened (level-major) values of every level given the leaves: parents = sums of children."""
    levels = [leaf]
    for l in range(shape.levels - 2, -1, -1):
        levels.append(np.add.reduceat(levels[-1], shape.child_starts(l), axis=0))
    return np.concatenate([a.ravel() for a in reversed(levels)])


def counts_problem(shape: TreeShape, noisy: list[npt.NDArray[np.generic]], total: int) -> _Problem:
    """The relaxed Model 1 (M_H-R) as data (also used by the tests' independent solves)."""
    k, off, target = _targets(shape, noisy)
    lens, cols, vals = _consistency_rows(shape, k, off)
    lens = np.r_[lens, k]
    cols = np.r_[cols, np.arange(k, dtype=np.int64)]
    vals = np.r_[vals, np.ones(k)]
    b = np.r_[np.zeros(lens.size - 1), float(total)]
    leaf = np.maximum(np.asarray(noisy[-1], dtype=np.float64), 0.0)
    anchor = _tree_sums(shape, leaf)
    return _Problem(target, _csr(lens, cols, vals, off[-1]), b, sp.csr_matrix((0, off[-1])), anchor)


def cumulative_problem(shape: TreeShape, noisy_cum: list[npt.NDArray[np.generic]], total: int) -> _Problem:
    """The relaxed Model 2 (M_HC-R) as data: consistency + y[root, k] = n, monotone rows y_j - y_{j+1} <= 0."""
    k, off, target = _targets(shape, noisy_cum)
    lens, cols, vals = _consistency_rows(shape, k, off)
    lens = np.r_[lens, 1]
    cols = np.r_[cols, k - 1]
    vals = np.r_[vals, 1.0]
    b = np.r_[np.zeros(lens.size - 1), float(total)]
    a_idx = np.arange(off[-1], dtype=np.int64).reshape(-1, k)[:, :-1].ravel()
    n_mono = a_idx.size
    le = _csr(np.full(n_mono, 2, dtype=np.int64), np.column_stack([a_idx, a_idx + 1]).ravel(),
              np.tile([1.0, -1.0], n_mono), off[-1])
    leaf = np.maximum.accumulate(np.maximum(np.asarray(noisy_cum[-1], dtype=np.float64), 0.0), axis=1)
    return _Problem(target, _csr(lens, cols, vals, off[-1]), b, le, _tree_sums(shape, leaf))


def relaxed_counts_qp(
    shape: TreeShape,
    noisy: list[npt.NDArray[np.generic]],
    total: int,
    time_limit: float | None = None,
    solver: QPSolver = "clarabel",
) -> QPResult:
    """M_H-R: relaxed Model 1, rounded entry-wise."""
    k = int(np.asarray(noisy[0]).shape[1])
    off = _offsets(shape, k)
    if solver == "tree":
        _targets(shape, noisy)
        sol, status, secs, kkt = _solve_tree_relaxed(shape, noisy, total)
    else:
        sol, status, secs, kkt = _run(counts_problem(shape, noisy, total), time_limit, solver)
    relaxed = _split(sol, shape, k, off)
    rounded = tuple(round_half_up(np.nan_to_num(r)) for r in relaxed)
    return QPResult(relaxed, rounded, status, secs, kkt)


def relaxed_cumulative_qp(
    shape: TreeShape,
    noisy_cum: list[npt.NDArray[np.generic]],
    total: int,
    time_limit: float | None = None,
    solver: QPSolver = "clarabel",
) -> QPResult:
    """M_HC-R: relaxed Model 2 on cumulative variables, rounded, then Lambda^{-1} (``rounded`` holds
    counts)."""
    k = int(np.asarray(noisy_cum[0]).shape[1])
    off = _offsets(shape, k)
    sol, status, secs, kkt = _run(cumulative_problem(shape, noisy_cum, total), time_limit, solver)
    relaxed = _split(sol, shape, k, off)
    rounded = tuple(
        np.asarray(cumulative_inverse(round_half_up(np.nan_to_num(r))), dtype=np.int64) for r in relaxed
    )
    return QPResult(relaxed, rounded, status, secs, kkt)

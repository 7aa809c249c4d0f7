"""The batch solver of top-down estimation (topdown-estimation.md): the root, and the families of any set of
parents at one level, solved together in batches of similar fanout.

Pure post-processing: every function here takes noisy answers, their variances and public facts (spine,
strategy, invariants) only.

Per family (parent p already estimated as integers ``t = x̂_p``; children c with measured answers
``y_{c,i}`` of query group i with variance ``v_{c,i}``):

1. **L2 step** ``argmin Σ_c Σ_i ‖Q_i x_c − y_{c,i}‖² / v_{c,i}`` s.t. ``x_c ≥ 0``, ``Σ_c x_c = t`` (cell by
   cell). Cells with ``t_j = 0`` force every child to 0 there, so only the pairs ``(p, j)`` with ``t_j > 0``
   carry variables: the problem is *sparse in the parent's support*. With the detailed histogram as the only
   query the problem separates per cell and the exact integer optimum is computed directly (no L2 step).
   Otherwise we use FISTA (accelerated projected gradient) in the metric ``D = diag(s_c)``
   (``s_c = Σ_i 1/v_{c,i}``): the projection onto ``{x ≥ 0, Σ_c x_c = t}`` in that metric is the exact
   weighted simplex projection of :mod:`solvers`, vectorised over all (parent, cell) rows of a batch. Step
   size 1/L per family with L the Gershgorin bound of ``D⁻¹H`` on the family's active variables; adaptive
   momentum restart; each family stops at its first iterate whose fixed-point residual is below ``tol``
   (absolute, persons), so its estimate does not depend on the other families of its batch, and the batch
   iterates on the families still working only. A family that
   reaches ``max_iter`` keeps its last feasible iterate and is logged (status ``max_iter``); a numerical
   failure falls back (logged) to the projection of the detailed answers (status ``fallback``).
2. **Rounding** ``argmin Σ_c s_c (x_c − x̃_c)²`` over non-negative integers with ``Σ_c x_c = t`` exactly, per
   (parent, cell): the exact integer allocation of :mod:`solvers`. Children therefore sum to the parent in
   every cell by construction, and non-negativity holds.

Root: the same L2 step over all cells with the invariant ``Σ_j x_j = N`` (total population, configurable) —
the projection then runs across cells — followed by the exact integer allocation of N over cells. Without a
total invariant, x ≥ 0 only and the integer step is per-cell rounding (the exact optimum of the separable
rounding objective).

Invariants (:class:`Constraints`, all public): the root total; per-state totals at the level whose units nest
in states (level 1 under a US root, where a state may be split into AIAN/non-AIAN units: the sum of a state's
units is held) — the L2 step there projects onto the row simplices *and* the state totals
(:func:`solvers.coupled_projection`) and the rounding is a controlled rounding on the bipartite (cell, state)
network (:func:`solvers.round_network`, exact integers); structural zeros (cells a unit's blocks cannot hold,
e.g. HHGQ = household in a block without housing units) are never variables at any level, and a root that
the states could not share out under them is excluded by solving the root lifted over state classes.

Levels are processed in order; within a level, families are independent: :func:`estimate_families` maps over
any subset of parents (the DAG's unit of parallel work), batching families of similar fanout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.io.arrays import unique
from dasflow.products.topdown.model import (
    Constraints,
    EstimatorOptions,
    FamilyResult,
    FloatArray,
    GroupAnswers,
    Histogram,
    IntArray,
    root_total,
)
from dasflow.products.topdown.solvers import (
    SimplexProjector,
    allocate_integer,
    coupled_projection,
    round_network,
    weighted_simplex_projection,
)
from dasflow.products.topdown.spine import Spine

log = logging.getLogger(__name__)


def _merge_status(a: dict[str, int], b: Mapping[str, int]) -> None:
    for k, v in b.items():
        a[k] = a.get(k, 0) + v


class _Ops:
    """Sparse query operators on a flat variable vector (one variable per (pair, child slot)).

    A group whose rows are one variable each (the detailed query: one row per child and cell) needs no
    scatter-add: its residual is computed per variable as ``v − y`` — the additions ``np.bincount`` performs
    into its zero-initialised rows, up to the sign of a zero (:meth:`grad`) — so the gradient is bit-identical
    either way."""

    def __init__(self, var_child: IntArray, var_cell: IntArray, groups: Sequence[GroupAnswers],
                 weights: Sequence[FloatArray]) -> None:
        self.idx: list[IntArray] = []
        self.y: list[FloatArray] = []
        self.w: list[FloatArray] = []
        self.nrow: list[int] = []
        for g, wg in zip(groups, weights, strict=True):
            rows = g.row_index[var_cell]
            key = var_child * g.n_rows + rows
            uk, inv = np.unique(key, return_inverse=True)
            self.idx.append(inv.astype(np.int64))
            self.y.append(g.gather(uk // g.n_rows, uk % g.n_rows))
            self.w.append(wg[np.unique(inv, return_index=True)[1]])
            self.nrow.append(int(uk.size))
        # per group: (weight, answer) per variable when each row holds exactly one variable, else None
        self.direct: list[tuple[FloatArray, FloatArray] | None] = [
            (w[idx], y[idx]) if n == idx.size else None
            for idx, y, w, n in zip(self.idx, self.y, self.w, self.nrow, strict=True)]

    def subset(self, keep: IntArray) -> _Ops:
        """The operators on the variables ``keep`` (ascending) alone; every query row holding one of them must
        hold only kept variables (whole families), so each row's sum runs over the same variables in the same
        order."""
        sub = object.__new__(_Ops)
        sub.idx, sub.y, sub.w, sub.nrow, sub.direct = [], [], [], [], []
        for idx, y, w, n, direct in zip(self.idx, self.y, self.w, self.nrow, self.direct, strict=True):
            rows = idx[keep]
            used = np.zeros(n, dtype=bool)
            used[rows] = True
            at = np.flatnonzero(used)
            sub.idx.append((np.cumsum(used) - 1)[rows])
            sub.y.append(y[at])
            sub.w.append(w[at])
            sub.nrow.append(int(at.size))
            sub.direct.append(None if direct is None else (direct[0][keep], direct[1][keep]))
        return sub

    def grad(self, v: FloatArray) -> FloatArray:
        """``Σ_groups Aᵀ W (A v − y)``, one temporary per group (in-place products and sums). A direct group's
        residual ``v − y`` differs from ``(0.0 + v) − y`` only in the sign of a zero, which adding it to
        ``out`` (a +0.0 start plus finite terms: never -0.0) cannot show."""
        out = np.zeros_like(v)
        for idx, y, w, n, direct in zip(self.idx, self.y, self.w, self.nrow, self.direct, strict=True):
            if direct is not None:
                d = np.subtract(v, direct[1])
                d *= direct[0]
                out += d
                continue
            r = np.bincount(idx, weights=v, minlength=n).astype(np.float64, copy=False)  # float64 already
            r -= y
            r *= w
            out += r[idx]
        return out

    def objective(self, v: FloatArray) -> float:
        tot = 0.0
        for idx, y, w, n in zip(self.idx, self.y, self.w, self.nrow, strict=True):
            r = np.bincount(idx, weights=v, minlength=n) - y
            tot += float((w * r * r).sum())
        return tot

    def row_sum_bound(self, s_var: FloatArray) -> FloatArray:
        """Gershgorin row sums of D⁻¹H per variable."""
        out = np.zeros(s_var.shape[0])
        for idx, w, n in zip(self.idx, self.w, self.nrow, strict=True):
            cnt = np.bincount(idx, minlength=n).astype(np.float64)
            out += (w * cnt)[idx]
        return out / s_var


def _segments(family_of_var: IntArray, n_fam: int) -> tuple[npt.NDArray[np.bool_], IntArray]:
    """Families with variables and the start of each one's run (variables are grouped by family)."""
    starts = np.searchsorted(family_of_var, np.arange(n_fam))
    nonempty = starts < family_of_var.size
    return nonempty, starts[nonempty]


#: the iteration goes on without the stopped families once they hold this share of its variables
COMPACT_SHARE = 0.25


def _fista(v0: FloatArray, ops: _Ops, s_var: FloatArray, step: FloatArray, family_of_var: IntArray,
           n_fam: int, project: Any, opts: EstimatorOptions,
           restrict: Callable[[IntArray], tuple[_Ops, FloatArray, FloatArray, Any]] | None = None,
           ) -> tuple[FloatArray, IntArray, int]:
    """FISTA with per-family momentum and restart in the D-metric. Returns (x, converged flag per family,
    iterations).

    Every family stops at its first iterate whose fixed-point residual is within ``tol``: that iterate is its
    estimate, whatever else its batch holds (the families are independent problems: per-family step, momentum,
    restart and residual, and a row-wise projection). ``restrict(families)`` gives the operators, metric, step
    and projection of those families alone (ascending indices): once the stopped families hold
    ``COMPACT_SHARE`` of the working variables the iteration continues on the others only — each of their
    iterates is the same, bit for bit, since a family's arithmetic never reads another family's variables."""
    out = v0.copy()
    converged = np.zeros(n_fam, dtype=bool)
    fams = np.arange(n_fam)                  # the working families (batch indices) …
    var_at = np.arange(v0.size)              # … and their variables' places in ``out``
    x = v0.copy()
    yv = v0.copy()
    tk = np.ones(n_fam)
    stopped = np.zeros(n_fam, dtype=bool)    # per working family
    size = np.bincount(family_of_var, minlength=n_fam)  # variables per working family
    held = 0                                 # variables of the stopped working families
    nonempty, st = _segments(family_of_var, n_fam)
    unit_step = bool((step == 1.0).all())  # 1.0 · g is g bit for bit: skip the product
    it = 0
    for it in range(1, opts.max_iter + 1):  # noqa: B007
        g = ops.grad(yv)   # a fresh array: updated in place to yv − step·g / s (same operations, same order)
        if not unit_step:
            np.multiply(step, g, out=g)
        np.divide(g, s_var, out=g)
        x_new = project(np.subtract(yv, g, out=g))
        diff = x_new - yv
        res = np.zeros(fams.size)
        res[nonempty] = np.maximum.reduceat(np.abs(diff), st)
        newly = (res <= opts.tol) & ~stopped
        if newly.any():
            sel = newly[family_of_var]
            out[var_at[sel]] = x_new[sel]
            converged[fams[newly]] = True
            stopped |= newly
            held += int(size[newly].sum())
            if stopped.all():
                break
        t_new = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * tk * tk))
        mom = (tk - 1.0) / t_new
        dx = x_new - x
        inner = np.zeros(fams.size)
        inner[nonempty] = np.add.reduceat(diff * dx, st)
        restart = inner > 0
        mom = np.where(restart, 0.0, mom)
        t_new = np.where(restart, 1.0, t_new)
        yv = x_new + mom[family_of_var] * dx
        x = x_new
        tk = t_new
        if restrict is not None and held and held >= COMPACT_SHARE * family_of_var.size:
            keep, on = ~stopped, ~stopped[family_of_var]
            fams, var_at = fams[keep], var_at[on]
            ops, s_var, step, project = restrict(fams)
            x, yv, tk, size = x[on], yv[on], tk[keep], size[keep]
            family_of_var = (np.cumsum(keep) - 1)[family_of_var[on]]
            stopped = np.zeros(fams.size, dtype=bool)
            held = 0
            nonempty, st = _segments(family_of_var, fams.size)
            unit_step = bool((step == 1.0).all())
    if not stopped.all():  # max_iter: the last iterate of the families still working
        sel = ~stopped[family_of_var]
        out[var_at[sel]] = x[sel]
    return out, converged.astype(np.int64), it


def _group_weights(groups: Sequence[GroupAnswers], child: IntArray) -> list[FloatArray]:
    return [1.0 / g.variance[g.position(child)] for g in groups]


def estimate_families(spine: Spine, level: int, parents: IntArray, parent_hist: Histogram,
                      groups: Sequence[GroupAnswers], opts: EstimatorOptions | None = None, *,
                      constraints: Constraints | None = None) -> FamilyResult:
    """Estimate the children (at ``level``) of the given parents (at ``level − 1``), all independent.

    ``parent_hist`` must hold the integer histograms of (at least) these parents; ``groups`` are the query
    groups measured at ``level``. Children sum to their parent exactly in every cell. ``constraints``: the
    children's structural zeros are fixed at 0 (they are never variables); at the state level each state's
    units sum to the state's total exactly (coupled projection in the L2 step, controlled rounding after).
    """
    opts = opts or EstimatorOptions()
    order, fan, first_child, unmeasured_parents = spine.families(level)
    parents = unique(parents.astype(np.int64))
    sel = np.isin(parent_hist.unit, parents)
    p_unit, p_cell, p_cnt = parent_hist.unit[sel], parent_hist.cell[sel], parent_hist.count[sel]
    status: dict[str, int] = {}
    out_u: list[IntArray] = []
    out_c: list[IntArray] = []
    out_n: list[IntArray] = []
    iters = 0
    # single-child families: the child equals the parent (Observation 1)
    single = fan[p_unit] == 1
    if single.any():
        out_u.append(order[first_child[p_unit[single]]])
        out_c.append(p_cell[single])
        out_n.append(p_cnt[single])
    n_single = int(np.count_nonzero(fan[parents] == 1))
    if n_single:
        status["single_child"] = n_single
        if single.any() and constraints is not None and (constraints.has_zeros or constraints.has_states):
            only = Histogram(order[first_child[p_unit[single]]], p_cell[single], p_cnt[single])
            if not constraints.allowed_cells(level, only.unit, only.cell).all() or \
                    _state_gap(only, constraints, level):
                raise ValueError(f"level {spine.levels[level]}: an only child cannot equal its parent under the "
                                 "invariants (structural zeros or state total inconsistent with the parent)")
    multi_p = parents[fan[parents] > 1]
    bad = multi_p[np.isin(multi_p, unmeasured_parents)]
    if bad.size:
        raise ValueError(f"level {spine.levels[level]}: an unmeasured child has siblings (parent {bad[0]}); "
                         "the spine's bypass guarantees this cannot happen")
    # batches of parents with similar fanout, bounded by the number of variables
    if multi_p.size:
        nnz_par = np.bincount(p_unit, minlength=spine.n_units(level - 1))
        ordp = multi_p[np.argsort(fan[multi_p], kind="stable")]
        cost = nnz_par[ordp] * fan[ordp]
        cum = np.cumsum(cost)
        batch_id = (cum // max(opts.batch_vars, 1)).astype(np.int64)
        # a new batch also whenever fanout grows by > 2× (limits padding)
        for b in unique(batch_id):
            bp = ordp[batch_id == b]
            for sub in _split_by_fanout(bp, fan):
                res = _solve_batch(spine, level, sub, p_unit, p_cell, p_cnt, fan, first_child, order, groups,
                                   opts, constraints)
                out_u.append(res.hist.unit)
                out_c.append(res.hist.cell)
                out_n.append(res.hist.count)
                _merge_status(status, res.status)
                iters = max(iters, res.iterations)
    if out_u:
        u = np.concatenate(out_u)
        c = np.concatenate(out_c)
        n = np.concatenate(out_n)
    else:
        u = c = n = np.zeros(0, dtype=np.int64)
    keep = n > 0
    u, c, n = u[keep], c[keep], n[keep]
    srt = np.lexsort((c, u))
    return FamilyResult(Histogram(u[srt], c[srt], n[srt]), status, iters)


def _state_gap(hist: Histogram, constraints: Constraints, level: int) -> bool:
    """True if some state all of whose units are in ``hist`` (only children) has a different total."""
    if not (constraints.has_states and level == constraints.state_level):
        return False
    assert constraints.state_of_unit is not None and constraints.state_totals is not None
    units = unique(hist.unit)
    st = constraints.state_of_unit[units]
    st = unique(st[st >= 0])
    if st.size == 0:
        return False
    members = np.isin(constraints.state_of_unit, st)
    whole = st[~np.isin(st, constraints.state_of_unit[np.flatnonzero(members)[~np.isin(
        np.flatnonzero(members), units)]])]
    hs = constraints.state_of_unit[hist.unit]
    sums = np.bincount(hs[hs >= 0], weights=hist.count[hs >= 0], minlength=constraints.state_totals.size)
    return bool((sums[whole].astype(np.int64) != constraints.state_totals[whole]).any())


def _split_by_fanout(bp: IntArray, fan: IntArray) -> list[IntArray]:
    out: list[IntArray] = []
    start = 0
    f = fan[bp]
    for i in range(1, bp.size + 1):
        if i == bp.size or f[i] > 2 * f[start]:
            out.append(bp[start:i])
            start = i
    return out


def _solve_batch(spine: Spine, level: int, bp: IntArray, p_unit: IntArray, p_cell: IntArray, p_cnt: IntArray,
                 fan: IntArray, first_child: IntArray, order: IntArray, groups: Sequence[GroupAnswers],
                 opts: EstimatorOptions, constraints: Constraints | None = None) -> FamilyResult:
    bp = np.sort(bp)
    sel = np.isin(p_unit, bp)
    pu, pc, t = p_unit[sel], p_cell[sel], p_cnt[sel]
    K = pu.size
    if K == 0:
        return FamilyResult(Histogram(*(np.zeros(0, np.int64),) * 3), {"solved_empty": bp.size})
    C = int(fan[bp].max())
    slot = np.arange(C)
    mask = slot[None, :] < fan[pu][:, None]
    child = np.where(mask, order[np.minimum(first_child[pu][:, None] + slot[None, :],
                                            order.size - 1)], 0).astype(np.int64)
    real = mask.copy()
    if constraints is not None and constraints.has_zeros:
        mask &= constraints.allowed_cells(level, child, pc[:, None])
        stuck = ~mask.any(axis=1) & (t > 0)
        if stuck.any():
            raise ValueError(f"level {spine.levels[level]}: cell {pc[stuck][0]} of parent {pu[stuck][0]} is a "
                             "structural zero in every child but not in the parent estimate")
    grp = np.full((K, C), -1, dtype=np.int64)
    gtot = np.zeros(0)
    if constraints is not None and constraints.has_states and level == constraints.state_level:
        assert constraints.state_of_unit is not None and constraints.state_totals is not None
        su = np.where(real, constraints.state_of_unit[child], -1)
        present = unique(su[su >= 0])
        grp = np.where(mask & (su >= 0), np.searchsorted(present, np.maximum(su, 0)), -1)
        gtot = constraints.state_totals[present].astype(np.float64)
    coupled = gtot.size > 0
    fam_index = np.searchsorted(bp, pu)
    var_child = child[mask]
    var_cell = np.broadcast_to(pc[:, None], (K, C))[mask]
    var_fam = np.broadcast_to(fam_index[:, None], (K, C))[mask]
    weights = _group_weights(groups, var_child)
    s_var = np.sum(weights, axis=0)
    S = np.ones((K, C))
    S[mask] = s_var
    det = [i for i, g in enumerate(groups) if g.detailed]
    tf = t.astype(np.float64)
    status: dict[str, int] = {}
    iters = 0
    if det:
        g = groups[det[0]]
        z0 = np.zeros((K, C))
        z0[mask] = g.gather(var_child, g.row_index[var_cell])
    else:
        z0 = np.where(mask, (tf / np.maximum(fan[pu], 1))[:, None], 0.0)
    nu_hold = [np.zeros(gtot.size)]

    def feasible(zm: FloatArray, metric: FloatArray) -> FloatArray:
        """Projection onto the family constraints (row simplices; state totals when coupled)."""
        if not coupled:
            xs, _ = weighted_simplex_projection(zm, metric, tf, mask)
            return xs
        xs, nu_hold[0] = coupled_projection(zm, metric, tf, mask, grp, gtot, nu0=nu_hold[0])
        return xs

    if len(groups) == 1 and det:
        W = np.ones((K, C))
        W[mask] = weights[0]
        Z = feasible(z0, W) if coupled else z0   # coupled: the exact WLS optimum is the W-metric projection
        status["exact"] = bp.size
    else:
        x0 = feasible(z0, S)
        try:
            ops = _Ops(var_child, var_cell, groups, weights)
            # metric D = diag(Gershgorin row sums of H): H ⪯ D (non-negative symmetric H), so step 1 in
            # the D-metric is a valid FISTA step and the projection is the D-weighted simplex projection
            d_var = ops.row_sum_bound(np.ones(var_child.size))
            DM = np.ones((K, C))
            DM[mask] = d_var

            onto = None if coupled else SimplexProjector(DM, tf, mask)  # DM is fixed: reuse sort orders
            var_row = np.broadcast_to(np.arange(K)[:, None], (K, C))[mask]
            restrict = None
            if not coupled:  # rows (families) are independent: the iteration may drop stopped families
                def restrict(keep: IntArray) -> tuple[_Ops, FloatArray, FloatArray, Any]:
                    rows = np.isin(fam_index, keep)
                    on = rows[var_row]
                    sub = SimplexProjector(DM[rows], tf[rows], mask[rows])
                    return ops.subset(np.flatnonzero(on)), d_var[on], np.ones(int(on.sum())), sub.vars

            def project(v: FloatArray) -> FloatArray:
                if onto is not None:
                    return onto.vars(v)
                M = np.zeros((K, C))
                M[mask] = v
                out: FloatArray = feasible(M, DM)[mask]
                return out

            v, conv, iters = _fista(x0[mask], ops, d_var, np.ones(var_child.size), var_fam, bp.size,
                                    project, opts, restrict)
            if not np.all(np.isfinite(v)):
                raise FloatingPointError("non-finite iterate")
            nconv = int(conv.sum())
            status["converged"] = nconv
            if nconv < bp.size:
                status["max_iter"] = bp.size - nconv
                log.warning("topdown %s: %d families reached max_iter=%d; using the last feasible iterate",
                            spine.levels[level], bp.size - nconv, opts.max_iter)
            Z = np.zeros((K, C))
            Z[mask] = v
        except (FloatingPointError, ValueError, ArithmeticError) as exc:
            log.warning("topdown %s: L2 solve failed (%s); fallback = projection of the detailed answers",
                        spine.levels[level], exc)
            Z = x0
            status["fallback"] = bp.size
        W = S
    X = _round_coupled(Z, W, t, mask, grp, gtot, status) if coupled else allocate_integer(Z, W, t, mask)
    nz = X > 0
    return FamilyResult(Histogram(child[nz], np.broadcast_to(pc[:, None], (K, C))[nz], X[nz]), status, iters)


def _round_coupled(Z: FloatArray, W: FloatArray, t: IntArray, mask: npt.NDArray[np.bool_], grp: IntArray,
                   gtot: FloatArray, status: dict[str, int]) -> IntArray:
    """Controlled rounding of a family batch under row sums ``t`` and the state totals (exact integers)."""
    from scipy import sparse

    K, C = Z.shape
    vr, vc = np.nonzero(mask)
    g = grp[vr, vc]
    nv = vr.size
    ing = np.flatnonzero(g >= 0)
    A = sparse.coo_matrix((np.ones(nv + ing.size), (np.concatenate([vr, K + g[ing]]),
                                                     np.concatenate([np.arange(nv), ing]))),
                          shape=(K + gtot.size, nv))
    b = np.concatenate([t, np.rint(gtot).astype(np.int64)])
    x, widened = round_network(Z[mask], W[mask], A, b)
    if widened:
        status["rounding_widened"] = status.get("rounding_widened", 0) + 1
        log.warning("topdown: controlled rounding needed the widened box (L2 point only approximately feasible)")
    X = np.zeros((K, C), dtype=np.int64)
    X[mask] = x
    return X



def _state_classes(constraints: Constraints | None, root_mask: int) -> tuple[IntArray, IntArray] | None:
    """States grouped by the codes their blocks allow (``(masks, totals)``), when some state cannot hold
    some code the root can (then not every root histogram with the right total can be split into the
    states: the root solve must be restricted to those that can). ``None`` when every split is possible."""
    if constraints is None or not (constraints.has_states and constraints.has_zeros) or \
            constraints.state_level < 1:
        return None
    al = constraints.allowed[constraints.state_level]
    assert al is not None and constraints.state_of_unit is not None and constraints.state_totals is not None
    n_st = constraints.state_totals.size
    smask = np.zeros(n_st, dtype=np.int64)
    ok = constraints.state_of_unit >= 0
    np.bitwise_or.at(smask, constraints.state_of_unit[ok], al[ok])
    dead = np.flatnonzero((smask == 0) & (constraints.state_totals > 0))
    if dead.size:
        raise ValueError(f"state {constraints.state_labels[dead[0]]}: positive total but no housing unit or "
                         "group quarters in any block")
    need = constraints.state_totals > 0
    if ((smask[need] & root_mask) == root_mask).all():
        return None
    masks, inv = np.unique(smask, return_inverse=True)
    return masks.astype(np.int64), np.bincount(inv, weights=constraints.state_totals).astype(np.int64)


def estimate_root(spine: Spine, groups: Sequence[GroupAnswers], n_cells: int, total: int | None,
                  opts: EstimatorOptions | None = None, *, constraints: Constraints | None = None) -> FamilyResult:
    """Root histogram: L2 step over all cells (x ≥ 0, Σx = total if given) then exact integer rounding.

    ``constraints``: the root's structural zeros are fixed at 0; state totals make the root total their sum
    (checked against ``total``). When structural zeros keep some state from holding some code, the root is
    solved *lifted* over state classes (variables ``X_{k,j}`` ≥ 0 per class k of states with equal allowed
    codes, ``Σ_j X_{k,j}`` = the class total, the objective on ``x_j = Σ_k X_{k,j}``): exactly the L2 optimum
    over root histograms the states can share out, so the state-level problem is always feasible; the
    rounding is then the controlled rounding of the lifted variables."""
    opts = opts or EstimatorOptions()
    total = root_total(total, constraints)
    cells = np.arange(n_cells, dtype=np.int64)
    root = np.zeros(n_cells, dtype=np.int64)
    allowed = (constraints.allowed_cells(0, root, cells) if constraints is not None
               else np.ones(n_cells, dtype=bool))
    weights = _group_weights(groups, root)
    s = float(np.sum([w[0] for w in weights]))
    det = [i for i, g in enumerate(groups) if g.detailed]
    status: dict[str, int] = {}
    if det:
        g = groups[det[0]]
        z0 = g.gather(root, g.row_index[cells])
    else:
        z0 = np.full(n_cells, (total or 0) / max(int(allowed.sum()), 1))
    z0 = np.where(allowed, z0, 0.0)
    classes = None
    if constraints is not None and total is not None:
        code = constraints.cell_code
        rmask = int(np.bitwise_or.reduce(np.left_shift(1, code[allowed]))) if code is not None and \
            allowed.any() else 0
        classes = _state_classes(constraints, rmask)
    if classes is not None and constraints is not None:
        x = _root_lifted(groups, weights, z0, allowed, classes, int(total or 0), s, opts, status,
                         constraints)
        return FamilyResult(Histogram.from_dense(np.zeros(1, dtype=np.int64), x[None, :]), status,
                            status.pop("_iters", 0))
    mask = allowed[None, :]
    S = np.full((1, n_cells), s)
    if not (len(groups) == 1 and det):
        ops = _Ops(root, cells, groups, weights)
        d = ops.row_sum_bound(np.ones(n_cells))   # Gershgorin metric, as in the family solve
        S = d[None, :]

    onto: list[SimplexProjector] = []  # built at the first call, with the final metric S

    def project(v: FloatArray) -> FloatArray:
        if total is None:
            clipped: FloatArray = np.where(allowed, np.maximum(v, 0.0), 0.0)
            return clipped
        if not onto:
            onto.append(SimplexProjector(S, np.array([float(total)]), mask))
        row: FloatArray = np.zeros(v.shape)
        row[allowed] = onto[0].vars(v[allowed])
        return row

    iters = 0
    if len(groups) == 1 and det:
        z = z0
        status["exact"] = 1
        w = float(weights[0][0])
    else:
        v, conv, iters = _fista(project(z0), ops, S[0], np.ones(n_cells),
                                np.zeros(n_cells, dtype=np.int64), 1, project, opts)
        status["converged" if conv[0] else "max_iter"] = 1
        z = v
        w = s
    if total is None:
        x = np.where(allowed, np.maximum(np.floor(z + 0.5), 0), 0).astype(np.int64)
    else:
        if total > 0 and not allowed.any():
            raise ValueError("root: every cell is a structural zero but the invariant total is positive")
        x = allocate_integer(z[None, :], np.full((1, n_cells), w), np.array([total], dtype=np.int64),
                             mask)[0]
    return FamilyResult(Histogram.from_dense(np.zeros(1, dtype=np.int64), x[None, :]), status, iters)


def _root_lifted(groups: Sequence[GroupAnswers], weights: Sequence[FloatArray], z0: FloatArray,
                 allowed: npt.NDArray[np.bool_], classes: tuple[IntArray, IntArray], total: int, s: float,
                 opts: EstimatorOptions, status: dict[str, int], constraints: Constraints) -> IntArray:
    """Root solve over state classes (see :func:`estimate_root`); returns the integer root histogram."""
    from scipy import sparse

    masks, ktot = classes
    assert constraints.cell_code is not None
    n_cells = z0.size
    M = ((masks[:, None] >> constraints.cell_code[None, :]) & 1).astype(bool) & allowed[None, :]
    vk, vj = np.nonzero(M)
    nv = vk.size
    lifted = np.zeros(nv, dtype=np.int64)
    ops = _Ops(lifted, vj, groups, [w[vj] for w in weights])
    d = ops.row_sum_bound(np.ones(nv))
    DM = np.ones(M.shape)
    DM[M] = d
    kt = ktot.astype(np.float64)

    onto = SimplexProjector(DM, kt, M)

    def project(v: FloatArray) -> FloatArray:
        return onto.vars(v)

    share = kt[vk] / max(float(total), 1.0)
    v, conv, iters = _fista(project(np.maximum(z0[vj], 0.0) * share), ops, d, np.ones(nv),
                            np.zeros(nv, dtype=np.int64), 1, project, opts)
    status["lifted_" + ("converged" if conv[0] else "max_iter")] = 1
    status["_iters"] = iters
    xt = np.bincount(vj, weights=v, minlength=n_cells)
    # controlled rounding: variables X (cost 0) and x_j (cost s·(1 − 2 frac)); Σ_j X_kj = N_k, Σ_k X_kj = x_j
    cols = np.concatenate([np.arange(nv), np.arange(nv), nv + np.arange(n_cells)])
    rows = np.concatenate([vk, masks.size + vj, masks.size + np.arange(n_cells)])
    vals = np.concatenate([np.ones(nv), np.ones(nv), -np.ones(n_cells)])
    A = sparse.coo_matrix((vals, (rows, cols)), shape=(masks.size + n_cells, nv + n_cells))
    b = np.concatenate([ktot, np.zeros(n_cells, dtype=np.int64)])
    w = np.concatenate([np.zeros(nv), np.full(n_cells, s)])
    sol, widened = round_network(np.concatenate([v, xt]), w, A, b)
    if widened:
        status["rounding_widened"] = 1
        log.warning("topdown root: controlled rounding needed the widened box")
    x: IntArray = sol[nv:]
    return x

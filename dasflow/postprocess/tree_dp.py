"""Exact integer tree dynamic program (Fioretto, Van Hentenryck & Zhu, AIJ 2021, Sec. 7, Algorithm 1).

Problem (Model 1 restricted to domain windows). A balanced hierarchy with L levels (level 0 = one root region)
and k independent *columns* (group sizes, or any cells): find integers ``x[l][r, j] >= 0`` minimising

    sum_{l, r, j} cost_l(x[l][r, j] - noisy[l][r, j])                   (cost = w*(.)^2 or w*|.|)

subject to ``x[l][r, j] = sum_{children r'} x[l+1][r', j]`` for every non-leaf (r, j), optionally ``sum_j
x[0][0, j] = total`` (the dummy root n_0 of the paper's tree T_G; ``total=None`` leaves it free), and ``x``
inside per-node domain windows ``[max(0, noisy - m), noisy + m]``. A level may carry no measurement
(``noisy=None``): it then has no cost term and no own window (the TopDown "detailed-only" case).

Algorithm. Every cost table C_r (optimal subtree cost given x_r = v) is convex piecewise linear over an
integer interval (Lemma 5 / Thm 3), so it is stored as ``(lo, C_r(lo), sorted forward slopes)``. The infimal
convolution Phi_r of the children's tables is the sorted *merge* of their slope lists starting from ``sum lo``
(the greedy of Eq. 7): Phi_r(sum lo + K) = sum C_child(lo) + (sum of the K smallest slopes). C_r adds the
node's own slopes on its window. This is Algorithm 1; no (min,+) convolution is ever formed. Two merge
kernels, both exact:

* generic: a lexsort of the concatenated slope lists of each parent (any real slopes; L1 or L2; any weights);
* counting (production path for integer noisy leaves with L2 cost and one weight per level): a leaf's slopes
  are ``w*(2t+1)`` for consecutive integers ``t = v - noisy``, so each parent's merged list is a histogram
  over ``t`` built from interval end-points (difference array) -- a counting sort, O(#children + slope range)
  per parent, never materialising the leaf tables.

Top-down: a parent with value v takes the K = v - sum lo smallest merged slopes; with s* the K-th smallest,
each child gets ``lo + #(its slopes < s*)`` plus a share of the ties at s* (first children first), which is
exactly the greedy assignment, so the children sum to v and sum C_child(x_child) = Phi_r(v) (O4).

Windows (footnote 2; requirement O5). ``m = ceil(multiplier * Var)`` per level (``window_radius``); the window
is ``[max(0, noisy - m), max(noisy, 0) + m]`` (centred on the nearest non-negative point, so a very negative
noisy value does not make it empty). After a solve, any node whose value touches an edge of its own window (the
lower edge only when it is > 0, 0 being the true bound) is widened -- a leaf doubles its radius, an internal
node drops its own window (its domain is then the range its children reach) -- infeasible columns double every
radius, and the problem is re-solved. At
the fixed point the windowed optimum is the unbounded optimum: the constraint matrix (tree equalities + the
n_0 row) is totally unimodular, so the Graver basis consists of {0,+-1} circuits and, the objective being
separable convex, an integer point with no improving circuit step is optimal (Murota;
Hemmecke-Onn-Weismantel); a point strictly inside every window has every circuit step inside the windows,
where it is optimal.

Memory (C2): columns are processed in chunks; phase 1 keeps only each column's root table, the n_0 merge picks
the root values, phase 2 recomputes a chunk's tables and assigns it top-down. ``column_root_tables``,
``assign_roots`` and ``assign_columns`` expose the phases so an orchestrator can map chunks as independent
tasks (C3).

Privacy: this is post-processing. Every function takes only noisy arrays and public facts (tree, total,
windows).

Usage (e.g. as the exact integer oracle for a detailed-only TopDown subproblem)::

    shape = TreeShape((np.zeros(n_states, np.int64), county_parent))    # balanced, children contiguous
    costs = [LevelCost(None),                                          # unmeasured levels: no cost
             LevelCost(None),
             LevelCost(noisy_counties, radius=window_radius(var, 1.0), weight=1.0, kind="l2")]
    sol = solve_tree(shape, costs, total=n)        # sol.values[l]: (regions_l, k) int64, sol.objective
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from dasflow.io.arrays import unique

CostKind = Literal["l2", "l1"]
IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "CostKind",
    "LevelCost",
    "Tables",
    "TreeShape",
    "TreeSolution",
    "assign_columns",
    "assign_roots",
    "column_root_tables",
    "level_tables",
    "solve_tree",
    "window_radius",
]


#: Radius meaning "no own window" (the node's domain is then what its children can reach).
UNBOUNDED = 1 << 40


def window_radius(variance: float, multiplier: float) -> int:
    """Domain-window radius m = ceil(multiplier * Var) (the paper's radius scales with the variance)."""
    if variance < 0 or multiplier <= 0 or not math.isfinite(variance * multiplier):
        raise ValueError(f"window radius needs variance >= 0, multiplier > 0; got {variance}, {multiplier}")
    return max(1, math.ceil(multiplier * variance))


@dataclass(frozen=True)
class TreeShape:
    """A balanced hierarchy: ``parents[l - 1][i]`` = index (at level l - 1) of the parent of node i of level
    l.

    Level 0 has exactly one node. Every parent array must be non-decreasing (children of a parent contiguous)
    and every node of levels 0..L-2 must have at least one child (all leaves at depth L - 1).
    """

    parents: tuple[IntArray, ...]

    def __post_init__(self) -> None:
        prev = 1
        for l, par in enumerate(self.parents, start=1):
            p = np.asarray(par)
            if p.ndim != 1 or p.size == 0:
                raise ValueError(f"level {l}: parent array must be 1-D and non-empty")
            if np.any(np.diff(p) < 0):
                raise ValueError(f"level {l}: parent indices must be non-decreasing (children contiguous)")
            if p[0] != 0 or p[-1] != prev - 1 or np.any(np.diff(p) > 1):
                raise ValueError(f"level {l}: every node of level {l - 1} needs >= 1 child (balanced tree)")
            prev = p.size

    @property
    def sizes(self) -> tuple[int, ...]:
        """Number of nodes per level, root level first."""
        return (1, *(int(p.size) for p in self.parents))

    @property
    def levels(self) -> int:
        return len(self.parents) + 1

    def child_starts(self, level: int) -> IntArray:
        """Index of the first child (at ``level + 1``) of every node of ``level``."""
        par = np.asarray(self.parents[level], dtype=np.int64)
        return np.flatnonzero(np.r_[True, par[1:] != par[:-1]]).astype(np.int64)


@dataclass(frozen=True)
class LevelCost:
    """The cost term of one level: ``weight * (x - noisy)^2`` (l2) or ``weight * |x - noisy|`` (l1).

    ``noisy`` has shape (nodes of the level, columns); ``None`` = the level is unmeasured (no cost, no
    window). ``radius`` is the window radius (scalar or per-node array of the same shape; required with
    ``noisy``).
    """

    noisy: npt.NDArray[np.float64] | IntArray | None
    radius: int | IntArray | None = None
    weight: float = 1.0
    kind: CostKind = "l2"

    def __post_init__(self) -> None:
        if self.weight <= 0 or not math.isfinite(self.weight):
            raise ValueError("cost weight must be positive and finite")
        if self.kind not in ("l2", "l1"):
            raise ValueError(f"unknown cost kind {self.kind!r}")
        if self.noisy is not None:
            if self.radius is None:
                raise ValueError("a measured level needs a window radius")
            if np.any(np.asarray(self.radius) < 1):
                raise ValueError("window radius must be >= 1")
            if not np.all(np.isfinite(np.asarray(self.noisy, dtype=np.float64))):
                raise ValueError("noisy values must be finite")


@dataclass
class Tables:
    """A batch of convex piecewise-linear cost tables over integer intervals ``[lo, lo + size]``.

    ``slopes[offsets[b]:offsets[b+1]]`` are C_b(v+1) - C_b(v), non-decreasing; ``f0`` = C_b(lo). Infeasible
    tables (empty domain) have ``feasible = False`` and size 0.
    """

    lo: IntArray
    size: IntArray
    f0: FloatArray
    slopes: FloatArray
    feasible: BoolArray
    offsets: IntArray = field(init=False)

    def __post_init__(self) -> None:
        self.offsets = np.concatenate([[0], np.cumsum(self.size)]).astype(np.int64)

    def values(self, b: int) -> FloatArray:
        """The full table of entry b: C(lo), C(lo+1), ... (test/diagnostic helper)."""
        s = self.slopes[self.offsets[b] : self.offsets[b + 1]]
        return np.concatenate([[self.f0[b]], self.f0[b] + np.cumsum(s)])


@dataclass(frozen=True)
class TreeSolution:
    """Optimal integer values per level (shape (nodes, columns)), objective, widening rounds, final radii."""

    values: tuple[IntArray, ...]
    objective: float
    widenings: int
    radii: tuple[IntArray | None, ...]


# --------------------------------------------------------------------------------------------- helpers


def _seg_arange(sizes: IntArray) -> IntArray:
    """Concatenation of arange(s) for s in sizes."""
    total = int(sizes.sum())
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return np.arange(total, dtype=np.int64) - np.repeat(starts, sizes)


def _own_cost(v: IntArray, c: FloatArray, weight: float, kind: CostKind) -> FloatArray:
    d = v.astype(np.float64) - c
    return weight * (d * d if kind == "l2" else np.abs(d))


def _own_slope(v: IntArray, c: FloatArray, weight: float, kind: CostKind) -> FloatArray:
    if kind == "l2":
        return weight * (2.0 * (v.astype(np.float64) - c) + 1.0)
    d = v.astype(np.float64) - c
    return weight * (np.abs(d + 1.0) - np.abs(d))


def _window(c: FloatArray, m: IntArray) -> tuple[IntArray, IntArray]:
    """[max(0, c - m), max(c, 0) + m]: centred on the nearest non-negative point, so never empty."""
    lo = np.maximum(0.0, np.floor(c - m)).astype(np.int64)
    hi = np.ceil(np.maximum(c, 0.0) + m).astype(np.int64)
    return lo, hi


@dataclass(frozen=True)
class _Own:
    """The own-cost data of one level restricted to a chunk of columns, flattened column-major."""

    c: FloatArray | None
    m: IntArray | None
    weight: float
    kind: CostKind
    integral: bool


def _level_own(cost: LevelCost, n_nodes: int, cols: IntArray) -> _Own:
    if cost.noisy is None:
        return _Own(None, None, cost.weight, cost.kind, False)
    noisy = np.asarray(cost.noisy)
    if noisy.ndim != 2 or noisy.shape[0] != n_nodes:
        raise ValueError(f"noisy array must have shape ({n_nodes}, k), got {noisy.shape}")
    c = noisy[:, cols].astype(np.float64).T.ravel()
    rad = np.broadcast_to(np.asarray(cost.radius, dtype=np.int64), noisy.shape)
    m = rad[:, cols].T.ravel().astype(np.int64)
    integral = bool(np.issubdtype(noisy.dtype, np.integer))
    return _Own(c, m, cost.weight, cost.kind, integral)


# --------------------------------------------------------------------------------------------- kernels


def _leaf_tables(own: _Own) -> Tables:
    """Materialised leaf tables (generic path)."""
    assert own.c is not None and own.m is not None
    lo, hi = _window(own.c, own.m)
    feasible = hi >= lo
    size = np.where(feasible, hi - lo, 0).astype(np.int64)
    v = np.repeat(lo, size) + _seg_arange(size)
    slopes = _own_slope(v, np.repeat(own.c, size), own.weight, own.kind)
    f0 = _own_cost(lo, own.c, own.weight, own.kind)
    return Tables(lo, size, f0, slopes, feasible)


@dataclass
class _Merge:
    """What the top-down phase needs from a merge: generic (sorted merged slopes) or counting (histograms)."""

    sum_lo: IntArray
    starts: IntArray  # first child of each parent
    merged: FloatArray | None = None
    moff: IntArray | None = None
    # counting kernel
    counting: _CountingSlopes | None = None
    a: IntArray | None = None
    b: IntArray | None = None


def _parent_from_phi(
    phi_lo: FloatArray,
    sum_lo: IntArray,
    sum_hi: IntArray,
    feasible: BoolArray,
    own: _Own,
    slope_at: _SlopeAt,
) -> Tables:
    """C_r = Phi_r + own cost on (own window) cap [sum lo, sum hi]; ``slope_at`` reads the merged slopes."""
    if own.c is not None:
        assert own.m is not None
        wlo, whi = _window(own.c, own.m)
        newlo = np.maximum(wlo, sum_lo)
        newhi = np.minimum(whi, sum_hi)
    else:
        newlo, newhi = sum_lo.copy(), sum_hi.copy()
    feasible = feasible & (newlo <= newhi)
    newlo = np.where(feasible, newlo, sum_lo)
    size = np.where(feasible, newhi - newlo, 0).astype(np.int64)
    k0 = newlo - sum_lo
    f0 = phi_lo + slope_at.prefix(k0)
    slopes = slope_at.window(k0, size)
    if own.c is not None:
        v = np.repeat(newlo - np.r_[0, np.cumsum(size)[:-1]], size) + np.arange(int(size.sum()), dtype=np.int64)
        slopes = slopes + _own_slope(v, np.repeat(own.c, size), own.weight, own.kind)
        f0 = f0 + _own_cost(newlo, own.c, own.weight, own.kind)
    return Tables(newlo, size, np.where(feasible, f0, np.inf), slopes, feasible)


class _SlopeAt:
    """Random access into the per-parent merged slope sequences."""

    def prefix(self, k: IntArray) -> FloatArray:  # sum of the first k merged slopes of each parent
        raise NotImplementedError

    def at(self, rows: IntArray, q: IntArray) -> FloatArray:  # merged slope number q of parent ``rows``
        raise NotImplementedError

    def window(self, k0: IntArray, size: IntArray) -> FloatArray:
        """Concatenated merged slopes k0_p .. k0_p + size_p - 1 of every parent p."""
        raise NotImplementedError


class _GenericSlopes(_SlopeAt):
    def __init__(self, merged: FloatArray, moff: IntArray) -> None:
        self.merged, self.moff = merged, moff
        self.cum = np.concatenate([[0.0], np.cumsum(merged)])

    def prefix(self, k: IntArray) -> FloatArray:
        return np.asarray(self.cum[self.moff[:-1] + k] - self.cum[self.moff[:-1]], dtype=np.float64)

    def at(self, rows: IntArray, q: IntArray) -> FloatArray:
        out: FloatArray = self.merged[self.moff[rows] + q]
        return out

    def window(self, k0: IntArray, size: IntArray) -> FloatArray:
        first = self.moff[:-1] + k0 - np.r_[0, np.cumsum(size)[:-1]]
        idx = np.repeat(first, size) + np.arange(int(size.sum()), dtype=np.int64)
        out: FloatArray = self.merged[idx]
        return out


class _CountingSlopes(_SlopeAt):
    """Ragged histograms over t (slope w*(2t+1)), one row per parent, stored flat.

    Row p covers t in [tmin_p, tmin_p + width_p) at flat positions roff[p]..roff[p+1]; ``ccz``/``cslz`` are the
    global cumulative counts / slope sums with a leading 0, so row p's merged position q (0-based) sits at the
    first flat index f with ccz[f + 1] > ccz[roff[p]] + q.
    """

    def __init__(self, cnt: IntArray, roff: IntArray, tmin: IntArray, weight: float) -> None:
        self.roff, self.tmin, self.weight = roff, tmin, weight
        widths = np.diff(roff)
        # t value of every flat histogram slot: tmin_p + (f - roff_p)
        tv = np.repeat(tmin - roff[:-1], widths)
        tv += np.arange(tv.size, dtype=np.int64)
        self.ccz = np.zeros(cnt.size + 1, dtype=np.int64)
        np.cumsum(cnt, out=self.ccz[1:])
        self.cc = self.ccz[1:]
        slope = tv.astype(np.float64)
        del tv
        slope *= 2.0 * weight
        slope += weight
        slope *= cnt
        self.cslz = np.zeros(cnt.size + 1, dtype=np.float64)
        np.cumsum(slope, out=self.cslz[1:])
        self.base = self.ccz[roff[:-1]]

    def tindex(self, rows: IntArray, q: IntArray) -> IntArray:
        """Flat index of merged position q (0-based) of each row."""
        out: IntArray = np.searchsorted(self.cc, self.base[rows] + q, side="right").astype(np.int64)
        return out

    def _slope(self, rows: IntArray, flat: IntArray) -> FloatArray:
        out: FloatArray = self.weight * (2.0 * (self.tmin[rows] + (flat - self.roff[rows])) + 1.0)
        return out

    def prefix(self, k: IntArray) -> FloatArray:
        out = np.zeros(k.size, dtype=np.float64)
        pos = k > 0
        r = np.flatnonzero(pos).astype(np.int64)
        f = self.tindex(r, k[pos] - 1)
        start = self.roff[r]
        before_cnt = self.ccz[f] - self.ccz[start]
        before_sum = self.cslz[f] - self.cslz[start]
        out[pos] = before_sum + (k[pos] - before_cnt) * self._slope(r, f)
        return out

    def at(self, rows: IntArray, q: IntArray) -> FloatArray:
        return self._slope(rows, self.tindex(rows, q))

    def window(self, k0: IntArray, size: IntArray) -> FloatArray:
        """Expand only the histogram slots that cover each window (two binary searches per parent, then a
        repeat of every slot's slope by its count clipped to the window)."""
        rows = np.flatnonzero(size > 0).astype(np.int64)
        if rows.size == 0:
            return np.zeros(0, dtype=np.float64)
        q_lo = k0[rows]
        q_hi = q_lo + size[rows]
        first = self.tindex(rows, q_lo)
        last = self.tindex(rows, q_hi - 1)
        nslot = last - first + 1
        slot = np.repeat(first - np.r_[0, np.cumsum(nslot)[:-1]], nslot) + np.arange(int(nslot.sum()), dtype=np.int64)
        g_lo = np.repeat(self.base[rows] + q_lo, nslot)
        g_hi = np.repeat(self.base[rows] + q_hi, nslot)
        cnt = np.minimum(self.ccz[slot + 1], g_hi) - np.maximum(self.ccz[slot], g_lo)
        srow = np.repeat(rows, nslot)
        out: FloatArray = np.repeat(self._slope(srow, slot), cnt)
        return out


def _sort_per_parent(slopes: FloatArray, sum_size: IntArray) -> FloatArray:
    """Sort ``slopes`` within each parent's contiguous block (block sizes ``sum_size``).

    Integral slopes (the production case: integer noisy values, integer weights) are sorted in ONE flat
    ``np.sort`` of the key ``slope - min + parent * span``: integers below 2^53, so the float keys are exact and
    subtracting the offsets back returns the slopes bit for bit. Anything else falls back to a lexsort.
    """
    if slopes.size == 0:
        return slopes.copy()
    lo = float(slopes.min())
    span = float(slopes.max()) - lo + 1.0
    n_par = sum_size.size
    if math.isfinite(span) and span * n_par < 2.0**52 and bool(np.all(slopes == np.floor(slopes))):
        offs = np.repeat(np.arange(n_par, dtype=np.float64) * span - lo, sum_size)
        key = slopes + offs
        key.sort()
        key -= offs
        return key
    elem_parent = np.repeat(np.arange(n_par, dtype=np.int64), sum_size)
    out: FloatArray = slopes[np.lexsort((slopes, elem_parent))]
    return out


def _merge_generic(child: Tables, starts: IntArray, n_parents: int) -> tuple[_Merge, _GenericSlopes]:
    sum_size = np.add.reduceat(child.size, starts) if child.size.size else np.zeros(n_parents, dtype=np.int64)
    merged = _sort_per_parent(child.slopes, sum_size)
    moff = np.concatenate([[0], np.cumsum(sum_size)]).astype(np.int64)
    info = _Merge(sum_lo=np.add.reduceat(child.lo, starts), starts=starts, merged=merged, moff=moff)
    return info, _GenericSlopes(merged, moff)


def _merge_counting(
    leaf: _Own, starts: IntArray, n_parents: int
) -> tuple[_Merge, _CountingSlopes, Tables]:
    """Counting-sort merge of implicit quadratic leaf tables (integer noisy, l2): slope w*(2t+1)."""
    assert leaf.c is not None and leaf.m is not None
    lo, hi = _window(leaf.c, leaf.m)
    feasible = hi >= lo
    hi = np.where(feasible, hi, lo)
    c = leaf.c.astype(np.int64)
    a, b = lo - c, hi - c  # t in [a, b)
    nchild = np.diff(np.r_[starts, lo.size])
    child_parent = np.repeat(np.arange(n_parents, dtype=np.int64), nchild)
    tmin = np.minimum.reduceat(a, starts)
    widths = np.maximum.reduceat(b, starts) - tmin
    roff = np.concatenate([[0], np.cumsum(widths)]).astype(np.int64)
    doff = roff + np.arange(n_parents + 1, dtype=np.int64)  # one spare slot per row for the -1 end-points
    base = doff[child_parent] - tmin[child_parent]
    n_slots = int(doff[-1])
    diff = np.bincount(base + a, minlength=n_slots) - np.bincount(base + b, minlength=n_slots)
    keep = np.ones(n_slots, dtype=bool)
    keep[doff[1:] - 1] = False
    cnt = np.cumsum(diff)[keep].astype(np.int64)  # every row's diff sums to 0: the global cumsum is per row
    slopes = _CountingSlopes(cnt, roff, tmin, leaf.weight)
    info = _Merge(sum_lo=np.add.reduceat(lo, starts), starts=starts, counting=slopes, a=a, b=b)
    f0 = _own_cost(lo, leaf.c, leaf.weight, leaf.kind)
    leaves = Tables(lo, (hi - lo).astype(np.int64), f0, np.zeros(0), feasible)
    return info, slopes, leaves


def _counting_ok(own: _Own) -> bool:
    return own.c is not None and own.kind == "l2" and own.integral


# --------------------------------------------------------------------------------------------- phases


def _chunk_levels(
    shape: TreeShape, costs: Sequence[LevelCost], cols: IntArray, keep: bool
) -> tuple[list[Tables], list[_Merge], list[_Own]]:
    """Bottom-up for a chunk of columns. Returns per-level tables (level 0 = the column roots) and merges."""
    nl = shape.levels
    kc = cols.size
    owns = [_level_own(costs[l], shape.sizes[l], cols) for l in range(nl)]
    if owns[-1].c is None:
        raise ValueError("the leaf level must be measured (it bounds every domain)")
    tables: list[Tables] = [None] * nl  # type: ignore[list-item]
    merges: list[_Merge] = [None] * (nl - 1)  # type: ignore[list-item]
    for l in range(nl - 1, 0, -1):
        n_par = shape.sizes[l - 1]
        starts_one = shape.child_starts(l - 1)
        # column-major flattening: node (r, j) -> j * n_l + r; children of (p, j) stay contiguous
        starts = (starts_one[None, :] + shape.sizes[l] * np.arange(kc, dtype=np.int64)[:, None]).ravel()
        slope_at: _SlopeAt
        if l == nl - 1 and _counting_ok(owns[l]):
            info, slope_at, child = _merge_counting(owns[l], starts, n_par * kc)
            feas_c = child.feasible
            phi_lo = np.add.reduceat(child.f0, starts)
            sum_size = np.add.reduceat(child.size, starts)
            if l == nl - 1:
                tables[l] = child
        else:
            if l == nl - 1:
                tables[l] = _leaf_tables(owns[l])
            child = tables[l]
            info, slope_at = _merge_generic(child, starts, n_par * kc)
            feas_c = child.feasible
            phi_lo = np.add.reduceat(child.f0, starts)
            sum_size = np.add.reduceat(child.size, starts)
        feas_p = np.logical_and.reduceat(feas_c, starts)
        sum_lo = info.sum_lo
        tables[l - 1] = _parent_from_phi(phi_lo, sum_lo, sum_lo + sum_size, feas_p, owns[l - 1], slope_at)
        merges[l - 1] = info
        if not keep and l < nl - 1:
            tables[l] = None  # type: ignore[call-overload]
            merges[l] = None  # type: ignore[call-overload]
    if nl == 1:
        tables[0] = _leaf_tables(owns[0])
    return tables, merges, owns


def _assign_from_merge(x_par: IntArray, info: _Merge, child: Tables) -> IntArray:
    """Top-down step: children values realising Phi_parent(x_par) (greedy smallest slopes, ties in order)."""
    starts = info.starts
    n_par = starts.size
    nchild = np.diff(np.r_[starts, child.lo.size])
    child_parent = np.repeat(np.arange(n_par, dtype=np.int64), nchild)
    k = x_par - info.sum_lo
    if info.merged is not None:
        assert info.moff is not None
        total = np.diff(info.moff)
        if np.any(k < 0) or np.any(k > total):
            raise AssertionError("parent value outside its Phi domain")
        kpos = k > 0
        sstar = np.full(n_par, -np.inf)
        sstar[kpos] = info.merged[info.moff[:-1][kpos] + k[kpos] - 1]
        elem_parent = np.repeat(child_parent, child.size)
        elem_child = np.repeat(np.arange(child.lo.size, dtype=np.int64), child.size)
        thr = sstar[elem_parent]
        less = np.bincount(elem_child, weights=(child.slopes < thr), minlength=child.lo.size).astype(np.int64)
        eq = np.bincount(elem_child, weights=(child.slopes == thr), minlength=child.lo.size).astype(np.int64)
    else:
        cs = info.counting
        assert info.a is not None and info.b is not None and cs is not None
        kpos = k > 0
        rows = np.flatnonzero(kpos).astype(np.int64)
        flat = cs.tindex(rows, k[kpos] - 1)
        tstar = np.full(n_par, np.iinfo(np.int64).min // 4, dtype=np.int64)
        tstar[kpos] = cs.tmin[rows] + (flat - cs.roff[rows])
        ts = tstar[child_parent]
        less = np.clip(ts - info.a, 0, info.b - info.a)
        eq = ((info.a <= ts) & (ts < info.b) & kpos[child_parent]).astype(np.int64)
    rem = k - np.add.reduceat(less, starts)
    cum = np.cumsum(eq)
    before = cum - eq
    prior = before - np.repeat(before[starts], nchild)
    give = np.clip(rem[child_parent] - prior, 0, eq)
    x = child.lo + less + give
    if np.any(np.add.reduceat(x, starts) != x_par):
        raise AssertionError("top-down assignment does not sum to the parent (ties exhausted)")
    res: IntArray = x.astype(np.int64)
    return res


def _argmin(t: Tables) -> IntArray:
    """Smallest minimiser of each table: lo + #(slopes < 0)."""
    idx = np.repeat(np.arange(t.lo.size, dtype=np.int64), t.size)
    neg = np.bincount(idx, weights=(t.slopes < 0), minlength=t.lo.size).astype(np.int64)
    return t.lo + neg


def column_root_tables(
    shape: TreeShape, costs: Sequence[LevelCost], cols: IntArray
) -> Tables:
    """Phase 1 (bottom-up) for a chunk of columns: the cost table of each column's root, nothing else kept."""
    tables, _, _ = _chunk_levels(shape, costs, np.asarray(cols, dtype=np.int64), keep=False)
    return tables[0]


def _concat_tables(parts: Sequence[Tables]) -> Tables:
    return Tables(
        np.concatenate([p.lo for p in parts]),
        np.concatenate([p.size for p in parts]),
        np.concatenate([p.f0 for p in parts]),
        np.concatenate([p.slopes for p in parts]),
        np.concatenate([p.feasible for p in parts]),
    )


def assign_roots(roots: Tables, total: int | None) -> IntArray | None:
    """The n_0 merge (barrier): root value per column so that they sum to ``total`` at minimum cost.

    Returns None when infeasible (some column infeasible, or total outside [sum lo, sum hi]).
    """
    if not np.all(roots.feasible):
        return None
    if total is None:
        return _argmin(roots)
    starts = np.zeros(1, dtype=np.int64)
    info, _ = _merge_generic(roots, starts, 1)
    if total < int(info.sum_lo[0]) or total > int(info.sum_lo[0]) + int(roots.size.sum()):
        return None
    return _assign_from_merge(np.array([total], dtype=np.int64), info, roots)


def assign_columns(
    shape: TreeShape, costs: Sequence[LevelCost], cols: IntArray, root_values: IntArray
) -> list[IntArray]:
    """Phase 2 for a chunk: recompute its tables and assign top-down from the given root values.

    Returns per-level arrays of shape (nodes, len(cols)).
    """
    cols = np.asarray(cols, dtype=np.int64)
    tables, merges, _ = _chunk_levels(shape, costs, cols, keep=True)
    kc = cols.size
    x = np.asarray(root_values, dtype=np.int64)
    out = [x.reshape(kc, 1).T.copy()]
    for l in range(1, shape.levels):
        x = _assign_from_merge(x, merges[l - 1], tables[l])
        out.append(x.reshape(kc, shape.sizes[l]).T.copy())
    return out


def level_tables(shape: TreeShape, costs: Sequence[LevelCost], cols: IntArray) -> list[Tables]:
    """All materialised cost tables of a chunk (tests/diagnostics; the leaf level may be implicit)."""
    tables, _, _ = _chunk_levels(shape, costs, np.asarray(cols, dtype=np.int64), keep=True)
    return tables


def _chunks(
    shape: TreeShape, costs: Sequence[LevelCost], k: int, budget: int, subset: IntArray | None = None
) -> list[IntArray]:
    """Split columns (all, or ``subset``) so a chunk's tables hold about ``budget`` slope entries."""
    per_col = np.zeros(k, dtype=np.float64)
    for l, cost in enumerate(costs):
        if cost.noisy is not None:
            rad = np.broadcast_to(np.asarray(cost.radius, dtype=np.float64), np.asarray(cost.noisy).shape)
            # the counting leaf kernel materialises per-parent histograms, not leaf tables
            factor = 1.0 if l < len(costs) - 1 else 1.0 / max(1, shape.sizes[l] // shape.sizes[max(0, l - 1)])
            per_col += 2.0 * np.minimum(rad, 1e7).sum(axis=0) * factor
    cols = np.arange(k, dtype=np.int64) if subset is None else np.asarray(subset, dtype=np.int64)
    out: list[IntArray] = []
    cur: list[int] = []
    acc = 0.0
    for j in cols:
        if cur and acc + per_col[j] > budget:
            out.append(np.asarray(cur, dtype=np.int64))
            cur, acc = [], 0.0
        cur.append(int(j))
        acc += per_col[j]
    if cur:
        out.append(np.asarray(cur, dtype=np.int64))
    return out


def _with_radii(costs: Sequence[LevelCost], radii: Sequence[IntArray | None]) -> list[LevelCost]:
    return [
        LevelCost(c.noisy, r, c.weight, c.kind) if c.noisy is not None else c
        for c, r in zip(costs, radii, strict=True)
    ]


def _select_tables(t: Tables, idx: IntArray) -> Tables:
    sl = [t.slopes[t.offsets[i] : t.offsets[i + 1]] for i in idx]
    return Tables(t.lo[idx], t.size[idx], t.f0[idx], np.concatenate(sl) if sl else np.zeros(0), t.feasible[idx])


def _merge_root_parts(parts: dict[int, Tables], k: int) -> Tables:
    return _concat_tables([parts[j] for j in range(k)])


def solve_tree(
    shape: TreeShape,
    costs: Sequence[LevelCost],
    total: int | None = None,
    *,
    max_widenings: int = 60,
    chunk_entries: int = 20_000_000,
) -> TreeSolution:
    """Exact optimum of the windowed problem, widened until it is the unbounded optimum (module docstring).

    ``costs[l]`` is the cost of level l (root level first); all measured levels share the column count k.
    Widening rounds are incremental: only the columns whose windows changed are rebuilt, and only the columns
    whose tables or root value changed are re-assigned.
    """
    if len(costs) != shape.levels:
        raise ValueError(f"need one LevelCost per level ({shape.levels}), got {len(costs)}")
    k = next(int(np.asarray(c.noisy).shape[1]) for c in costs if c.noisy is not None)
    if total is not None and total < 0:
        raise ValueError("total must be >= 0")
    radii: list[IntArray | None] = [
        None
        if c.noisy is None
        else np.broadcast_to(np.asarray(c.radius, dtype=np.int64), np.asarray(c.noisy).shape).copy()
        for c in costs
    ]
    values: list[IntArray] = [np.zeros((s, k), dtype=np.int64) for s in shape.sizes]
    root_parts: dict[int, Tables] = {}
    prev_rv = np.full(k, -1, dtype=np.int64)
    dirty = np.arange(k, dtype=np.int64)
    for rounds in range(max_widenings + 1):
        cur = _with_radii(costs, radii)
        chunks = _chunks(shape, cur, k, chunk_entries, dirty)
        cache: dict[bytes, tuple[list[Tables], list[_Merge]]] = {}
        for ch in chunks:
            tabs, merges, _ = _chunk_levels(shape, cur, ch, keep=len(chunks) == 1)
            if len(chunks) == 1:
                cache[ch.tobytes()] = (tabs, merges)
            for i, j in enumerate(ch):
                root_parts[int(j)] = _select_tables(tabs[0], np.array([i]))
        roots = _merge_root_parts(root_parts, k)
        rv = assign_roots(roots, total)
        if rv is None:
            bad = np.flatnonzero(~roots.feasible)
            if bad.size == 0:
                bad = np.arange(k, dtype=np.int64)
            for r in radii:
                if r is not None:
                    r[:, bad] = np.minimum(r[:, bad] * 2, UNBOUNDED)
            dirty = bad.astype(np.int64)
            continue
        redo = unique(np.concatenate((dirty, np.flatnonzero(rv != prev_rv)))).astype(np.int64)
        for ch in _chunks(shape, cur, k, chunk_entries, redo):
            hit = cache.get(ch.tobytes())
            if hit is not None:
                tabs, merges = hit
                x = rv[ch]
                part = [x.reshape(ch.size, 1).T.copy()]
                for l in range(1, shape.levels):
                    x = _assign_from_merge(x, merges[l - 1], tabs[l])
                    part.append(x.reshape(ch.size, shape.sizes[l]).T.copy())
            else:
                part = assign_columns(shape, cur, ch, rv[ch])
            for l in range(shape.levels):
                values[l][:, ch] = part[l]
        cache.clear()
        prev_rv = rv
        touched_cols: list[IntArray] = []
        for l, c in enumerate(cur):
            if c.noisy is None:
                continue
            r = radii[l]
            assert r is not None
            lo, hi = _window(np.asarray(c.noisy, dtype=np.float64)[:, redo], r[:, redo])
            sub = values[l][:, redo]
            touch = ((sub == lo) & (lo > 0)) | (sub == hi)
            if np.any(touch):
                # a leaf doubles its radius; an internal node drops its own window (its domain is then the
                # range its children can reach, already bounded by their windows)
                rr = r[:, redo]
                rr[touch] = np.minimum(rr[touch] * 2, UNBOUNDED) if l == shape.levels - 1 else UNBOUNDED
                r[:, redo] = rr
                touched_cols.append(redo[np.flatnonzero(touch.any(axis=0))])
        if not touched_cols:
            return TreeSolution(tuple(values), objective(values, costs), rounds, tuple(radii))
        dirty = unique(np.concatenate(touched_cols)).astype(np.int64)
    raise RuntimeError(f"tree DP did not reach an interior optimum after {max_widenings} widenings")


def objective(values: Sequence[IntArray], costs: Sequence[LevelCost]) -> float:
    """Model 1 objective of an assignment."""
    tot = 0.0
    for x, c in zip(values, costs, strict=True):
        if c.noisy is not None:
            tot += float(_own_cost(x, np.asarray(c.noisy, dtype=np.float64), c.weight, c.kind).sum())
    return tot

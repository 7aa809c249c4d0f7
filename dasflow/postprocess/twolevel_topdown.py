"""The paper's TopDown baseline (Fioretto et al. Sec. 10): two consecutive levels at a time, L2 then rounding.

Root: x_root = argmin ||x - noisy_root||^2 s.t. sum_j x_j = n, x >= 0 (a simplex projection), rounded keeping
the sum. Then level by level: with the parents fixed (integers), each (parent r, column j) group of children
is the L2 projection of their noisy values onto {x >= 0, sum = x_parent[r, j]} -- the two-level QP decomposes
exactly into these per-column simplex projections because its constraints never couple columns -- and is
rounded by largest remainder (floor, then +1 to the largest fractional parts, ties by index), which keeps
every sum. The result is consistent, non-negative, integral and faithful (0 violations); it is not optimal for
Model 1.

This is the baseline "as the paper describes it", not the 2020 DAS TopDown (see dasflow.products.topdown).
Privacy: post-processing of noisy arrays plus public n and tree.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dasflow.postprocess.tree_dp import TreeShape

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

__all__ = ["largest_remainder", "project_simplex_groups", "twolevel_topdown"]


def project_simplex_groups(y: FloatArray, group: IntArray, total: FloatArray) -> FloatArray:
    """Per group g: argmin ||x - y_g||^2 s.t. x >= 0, sum x = total[g] >= 0 (``group`` non-decreasing ids)."""
    y = np.asarray(y, dtype=np.float64)
    g = np.asarray(group, dtype=np.int64)
    s = np.asarray(total, dtype=np.float64)
    if np.any(s < 0):
        raise ValueError("simplex totals must be non-negative")
    order = np.lexsort((-y, g))
    ys = y[order]
    gs = g[order]
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    sizes = np.diff(np.r_[starts, gs.size])
    cs = np.cumsum(ys)
    cs_in = cs - np.repeat(np.r_[0.0, cs[starts[1:] - 1]], sizes)
    rank = np.arange(ys.size) - np.repeat(starts, sizes) + 1
    tau_cand = (cs_in - s[gs]) / rank
    ok = ys - tau_cand > 0
    # rho = largest rank with ok; tau = tau_cand at rho (every group has rank 1 ok unless total == 0)
    rho_pos = np.maximum.reduceat(np.where(ok, np.arange(ys.size), -1), starts)
    tau = np.where(rho_pos >= 0, tau_cand[np.maximum(rho_pos, 0)], np.inf)
    x_sorted = np.maximum(ys - np.repeat(tau, sizes), 0.0)
    out = np.empty_like(y)
    out[order] = x_sorted
    return out


def largest_remainder(x: FloatArray, group: IntArray, total: IntArray) -> IntArray:
    """Integers per group summing to ``total[g]``: floor(x) plus 1 for the largest fractional parts."""
    x = np.asarray(x, dtype=np.float64)
    g = np.asarray(group, dtype=np.int64)
    fl = np.floor(x).astype(np.int64)
    frac = x - fl
    n_groups = int(np.asarray(total).size)
    rem = np.asarray(total, dtype=np.int64) - np.bincount(g, weights=fl, minlength=n_groups).astype(np.int64)
    order = np.lexsort((np.arange(x.size), -frac, g))
    gs = g[order]
    starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    sizes = np.diff(np.r_[starts, gs.size])
    rank = np.arange(x.size) - np.repeat(starts, sizes)
    add = np.zeros(x.size, dtype=np.int64)
    add[order] = (rank < rem[gs]).astype(np.int64)
    out: IntArray = fl + add
    if np.any(out < 0) or np.any(np.bincount(g, weights=out, minlength=n_groups) != total):
        raise ArithmeticError("largest-remainder rounding could not keep the group totals")
    return out


def twolevel_topdown(shape: TreeShape, noisy: list[npt.NDArray[np.generic]], total: int) -> list[IntArray]:
    """TopDown baseline: per-level arrays (regions, k) of consistent non-negative integers summing to
    ``total``."""
    root = np.asarray(noisy[0], dtype=np.float64).ravel()
    k = root.size
    g0 = np.zeros(k, dtype=np.int64)
    x0 = largest_remainder(project_simplex_groups(root, g0, np.array([float(total)])), g0, np.array([total]))
    out: list[IntArray] = [x0.reshape(1, k)]
    for l in range(1, shape.levels):
        par = np.asarray(shape.parents[l - 1], dtype=np.int64)
        n_par = shape.sizes[l - 1]
        y = np.asarray(noisy[l], dtype=np.float64)  # (n_l, k)
        # groups (j, parent) in column-major order so every group's children are contiguous
        yf = y.T.ravel()
        grp = (np.arange(k, dtype=np.int64)[:, None] * n_par + par[None, :]).ravel()
        tot = out[-1].T.ravel()
        xf = project_simplex_groups(yf, grp, tot.astype(np.float64))
        xi = largest_remainder(xf, grp, tot)
        out.append(xi.reshape(k, shape.sizes[l]).T.copy())
    return out

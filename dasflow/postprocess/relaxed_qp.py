"""Relaxed-QP baselines M_H-R and M_HC-R (Fioretto et al. Secs. 5 and 8): convex QP with HiGHS, then rounding.

M_H-R: min sum (x - noisy)^2 over all (level, region, column) subject to parent = sum of children per column,
x >= 0 and sum_j x[root, j] = n (Model 1 without integrality); each entry is then rounded to the nearest
integer. M_HC-R: the same on cumulative variables y (Model 2 without integrality): y[r, j] <= y[r, j+1], y >=
0, consistency per column, y[root, k] = n; rounded, then Lambda^{-1}. Rounding breaks consistency and
faithfulness; the callers count the violations (#CV, requirement V2) instead of hiding them.

The QP is solved by HiGHS (``highspy``; interior/active-set QP) with an optional time limit;
``QPResult.status`` reports whether the optimum was reached. Privacy: post-processing of noisy arrays plus
public n and tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import highspy
import numpy as np
import numpy.typing as npt

from dasflow.postprocess.isotonic import cumulative_inverse
from dasflow.postprocess.tree_dp import TreeShape

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

__all__ = ["QPResult", "relaxed_counts_qp", "relaxed_cumulative_qp", "round_half_up"]


@dataclass(frozen=True)
class QPResult:
    """Relaxed solution per level (float), its rounding (int), solver status and solve seconds."""

    relaxed: tuple[FloatArray, ...]
    rounded: tuple[IntArray, ...]
    status: str
    seconds: float


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
    return np.concatenate(lens), np.concatenate(idx), np.concatenate(val)


def _solve(
    n_var: int,
    target: FloatArray,
    lens: IntArray,
    cols: IntArray,
    vals: FloatArray,
    row_lo: FloatArray,
    row_hi: FloatArray,
    time_limit: float | None,
    solver: str | None = None,
) -> tuple[FloatArray, str, float]:
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    if solver is not None:
        h.setOptionValue("solver", solver)
    if time_limit is not None:
        h.setOptionValue("time_limit", float(time_limit))
    lp = highspy.HighsLp()
    lp.num_col_ = n_var
    lp.num_row_ = int(lens.size)
    lp.col_cost_ = -2.0 * target
    lp.col_lower_ = np.zeros(n_var)
    lp.col_upper_ = np.full(n_var, highspy.kHighsInf)
    lp.row_lower_ = row_lo
    lp.row_upper_ = row_hi
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.r_[0, np.cumsum(lens)].astype(np.int32)
    lp.a_matrix_.index_ = cols.astype(np.int32)
    lp.a_matrix_.value_ = vals
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
    sol = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if sol.size != n_var:
        sol = np.full(n_var, np.nan)
    return sol, status, secs


def _split(x: FloatArray, shape: TreeShape, k: int, off: list[int]) -> tuple[FloatArray, ...]:
    return tuple(x[off[l] : off[l + 1]].reshape(shape.sizes[l], k) for l in range(shape.levels))


def relaxed_counts_qp(
    shape: TreeShape, noisy: list[npt.NDArray[np.generic]], total: int, time_limit: float | None = None
) -> QPResult:
    """M_H-R: relaxed Model 1 solved by HiGHS, rounded entry-wise."""
    k = int(np.asarray(noisy[0]).shape[1])
    off = _offsets(shape, k)
    target = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in noisy])
    lens, cols, vals = _consistency_rows(shape, k, off)
    n_cons = lens.size
    lens = np.r_[lens, k]
    cols = np.r_[cols, np.arange(k, dtype=np.int64)]
    vals = np.r_[vals, np.ones(k)]
    lo = np.r_[np.zeros(n_cons), float(total)]
    sol, status, secs = _solve(off[-1], target, lens, cols, vals, lo, lo.copy(), time_limit)
    relaxed = _split(sol, shape, k, off)
    rounded = tuple(round_half_up(np.nan_to_num(r)) for r in relaxed)
    return QPResult(relaxed, rounded, status, secs)


def relaxed_cumulative_qp(
    shape: TreeShape, noisy_cum: list[npt.NDArray[np.generic]], total: int, time_limit: float | None = None
) -> QPResult:
    """M_HC-R: relaxed Model 2 on cumulative variables, rounded, then Lambda^{-1} (``rounded`` holds
    counts)."""
    k = int(np.asarray(noisy_cum[0]).shape[1])
    off = _offsets(shape, k)
    target = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in noisy_cum])
    lens, cols, vals = _consistency_rows(shape, k, off)
    n_eq = lens.size
    # y[root, k] = n, then monotone rows y[r, j] - y[r, j+1] <= 0
    a_idx = np.arange(off[-1], dtype=np.int64).reshape(-1, k)[:, :-1].ravel()
    n_mono = a_idx.size
    lens = np.r_[lens, 1, np.full(n_mono, 2, dtype=np.int64)]
    cols = np.r_[cols, k - 1, np.column_stack([a_idx, a_idx + 1]).ravel()]
    vals = np.r_[vals, 1.0, np.tile([1.0, -1.0], n_mono)]
    lo = np.r_[np.zeros(n_eq), float(total), np.full(n_mono, -highspy.kHighsInf)]
    hi = np.r_[np.zeros(n_eq), float(total), np.zeros(n_mono)]
    sol, status, secs = _solve(off[-1], target, lens, cols, vals, lo, hi, time_limit)
    relaxed = _split(sol, shape, k, off)
    rounded = tuple(
        np.asarray(cumulative_inverse(round_half_up(np.nan_to_num(r))), dtype=np.int64) for r in relaxed
    )
    return QPResult(relaxed, rounded, status, secs)

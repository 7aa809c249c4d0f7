"""Cumulative operator, isotonic regression (PAVA) and exact integer isotonic regression.

``cumulative``/``cumulative_inverse`` are Lambda and Lambda^{-1} of Fioretto et al. Sec. 8 along the last axis
(requirement O8). ``isotonic_nonneg`` is step 2 of Algorithm 2 (M_DPC): the L2 projection of each row onto
``0 <= x_1 <= ... <= x_k`` -- the pool-adjacent-violators algorithm (scipy's C implementation of PAVA), then a
clip at 0, which is exact because a box-constrained L2 isotonic regression is the clipped unconstrained one.

``integer_isotonic`` solves ``min sum_b w_b (y_b - a_b)^2`` over *integers* with ``lower <= y_1 <= ... <= y_B
<= upper``. By the threshold theorem for convex separable problems over a chain (Hochbaum & Queyranne 2003),
the integer optimum satisfies ``y_b >= t`` iff the continuous optimum satisfies ``y_b >= t - 1/2``, so
``floor(y_cont + 1/2)`` is an integer optimum. The rounding is done in exact integer arithmetic on each pooled
block (sum of w*a over the block divided by its weight), so no float decides a tie.

Privacy: pure post-processing of noisy arrays.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import isotonic_regression

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

__all__ = ["cumulative", "cumulative_inverse", "integer_isotonic", "isotonic_nonneg"]


def cumulative(c: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """Lambda(c)_j = sum_{i <= j} c_i along the last axis (dtype preserved)."""
    arr = np.asarray(c)
    out: npt.NDArray[np.generic] = np.cumsum(arr, axis=-1, dtype=arr.dtype)
    return out


def cumulative_inverse(lam: npt.ArrayLike) -> npt.NDArray[np.generic]:
    """Lambda^{-1}: c_j = Lambda_j - Lambda_{j-1} with Lambda_0 = 0, along the last axis."""
    arr = np.asarray(lam)
    out: npt.NDArray[np.generic] = np.diff(arr, axis=-1, prepend=np.zeros_like(arr[..., :1]))
    return out


def isotonic_nonneg(y: npt.ArrayLike) -> FloatArray:
    """Row-wise argmin ||x - y||_2 s.t. 0 <= x_1 <= ... <= x_k (PAVA + clip), for a 1-D or 2-D array."""
    arr = np.atleast_2d(np.asarray(y, dtype=np.float64))
    out = np.empty_like(arr)
    for i in range(arr.shape[0]):  # one C-level PAVA per region; loops over regions, not records
        out[i] = isotonic_regression(arr[i], increasing=True).x
    np.maximum(out, 0.0, out=out)
    res: FloatArray = out.reshape(np.shape(y)) if np.ndim(y) == 1 else out
    return res


def integer_isotonic(
    targets: npt.ArrayLike, weights: npt.ArrayLike, lower: int, upper: int
) -> IntArray:
    """Exact integer L2 isotonic regression with bounds (module docstring).

    ``targets`` are the block means' numerators: pass integer ``sums`` (sum of the targets pooled in block b)
    and integer ``weights`` (their count); the block target is sums/weights.
    """
    sums = np.asarray(targets, dtype=np.int64)
    w = np.asarray(weights, dtype=np.int64)
    if sums.shape != w.shape or sums.ndim != 1:
        raise ValueError("targets and weights must be 1-D of equal length")
    if np.any(w <= 0):
        raise ValueError("weights must be positive")
    if lower > upper:
        raise ValueError("lower bound exceeds upper bound")
    if sums.size == 0:
        return np.zeros(0, dtype=np.int64)
    means = sums.astype(np.float64) / w
    cont = isotonic_regression(means, weights=w.astype(np.float64), increasing=True).x
    # pooled blocks = runs of equal fitted values; redo their means exactly in integers
    run_start = np.r_[True, cont[1:] != cont[:-1]]
    starts = np.flatnonzero(run_start)
    s_run = np.add.reduceat(sums, starts)
    w_run = np.add.reduceat(w, starts)
    rounded = np.floor_divide(2 * s_run + w_run, 2 * w_run)  # floor(S/W + 1/2), exact
    rounded = np.clip(rounded, lower, upper)
    out: IntArray = np.repeat(rounded, np.diff(np.r_[starts, sums.size])).astype(np.int64)
    if np.any(np.diff(out) < 0):
        raise ArithmeticError("float PAVA pooling disagrees with the exact block means")
    return out

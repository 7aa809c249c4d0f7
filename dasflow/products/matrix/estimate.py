"""Least-squares estimation from noisy marginals, exact in the marginal eigenbasis (no n × n matrix).

Measurements ``y_q = Q_q x + N_Z(0, σ_q²)``. The weighted least-squares estimate solves
``X x̂ = r`` with ``X = Σ_q Q_qᵀQ_q / σ_q²`` and ``r = Σ_q Q_qᵀ y_q / σ_q²``. With the projectors ``V_T`` of
:mod:`dasflow.strategy.topdown_weights` (``Q_SᵀQ_S = Σ_{T⊆S} c_S V_T``), ``X = Σ_T s_T V_T`` with
``s_T = Σ_{q ⊇ T} c_q/σ_q²``, so ``x̂ = Σ_{T: s_T > 0} V_T r / s_T`` (the minimum-norm solution; directions
no measurement covers are left at 0 and no workload table reads them). ``V_T`` is applied axis by axis
(centre along the axes in T, average along the others): O(2^k · k · n) time. Post-processing only: it reads
noisy measurements and public configuration, never the histogram.

The unconstrained estimate is unbiased and its error is exactly Eq. 1: the variance of every cell of the
table over attributes ``w`` is ``Σ_{T⊆w, s_T>0} c_w rank(V_T) / s_T`` divided by the table's number of cells
(all cells of a marginal have the same variance, by symmetry of the ``V_T`` under relabelling levels).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

__all__ = ["broadcast_back", "marginal_of", "table_variance", "wls_estimate"]


def marginal_of(hist: npt.NDArray[np.floating] | npt.NDArray[np.integer], keep: Sequence[int]) -> FloatArray:
    """Q_S x: sum over the axes not in ``keep``."""
    other = tuple(i for i in range(hist.ndim) if i not in keep)
    return np.asarray(hist.sum(axis=other), dtype=np.float64)


def broadcast_back(values: FloatArray, keep: Sequence[int], shape: Sequence[int]) -> FloatArray:
    """Q_Sᵀ y: every cell gets the value of the marginal cell it falls in."""
    idx = [slice(None) if i in keep else np.newaxis for i in range(len(shape))]
    return np.asarray(np.broadcast_to(values[tuple(idx)], tuple(shape)), dtype=np.float64)


def _project(v: FloatArray, tmask: int) -> FloatArray:
    out = v
    for i in range(v.ndim):
        mean = out.mean(axis=i, keepdims=True)
        out = out - mean if tmask >> i & 1 else np.broadcast_to(mean, out.shape)
    return np.asarray(out, dtype=np.float64)


def _scale(shape: Sequence[int], keep: Sequence[int]) -> float:
    return float(math.prod(d for i, d in enumerate(shape) if i not in keep))


def _spectrum(shape: Sequence[int], queries: Sequence[tuple[Sequence[int], float]]) -> FloatArray:
    """s_T = Σ_{q ⊇ T} c_q w_q for every attribute subset T (bit mask)."""
    k = len(shape)
    s = np.zeros(1 << k)
    masks = np.arange(1 << k)
    for keep, w in queries:
        qmask = sum(1 << i for i in keep)
        s[(masks & ~qmask) == 0] += w * _scale(shape, keep)
    return s


def wls_estimate(shape: Sequence[int], measurements: Sequence[tuple[Sequence[int], FloatArray, float]]
                 ) -> FloatArray:
    """x̂ from ``(keep axes, noisy marginal array, σ²)`` triples (σ² > 0)."""
    r = np.zeros(tuple(shape))
    for keep, y, s2 in measurements:
        r += broadcast_back(np.asarray(y, dtype=np.float64), keep, shape) / s2
    s = _spectrum(shape, [(keep, 1.0 / s2) for keep, _, s2 in measurements])
    x = np.zeros(tuple(shape))
    for t in range(1 << len(shape)):
        if s[t] > 0 and all(shape[i] > 1 for i in range(len(shape)) if t >> i & 1):
            x += _project(r, t) / s[t]
    return x


def table_variance(shape: Sequence[int], keep: Sequence[int], sigma2: Sequence[tuple[Sequence[int], float]]
                   ) -> float:
    """Expected variance of every cell of the marginal over ``keep`` (unconstrained WLS, Eq. 1)."""
    s = _spectrum(shape, [(q, 1.0 / v) for q, v in sigma2])
    wmask = sum(1 << i for i in keep)
    total = 0.0
    for t in range(1 << len(shape)):
        if t & ~wmask:
            continue
        rank = math.prod(shape[i] - 1 for i in range(len(shape)) if t >> i & 1)
        if rank == 0:
            continue
        if s[t] <= 0:
            return math.inf
        total += _scale(shape, keep) * rank / s[t]
    cells = math.prod(shape[i] for i in keep)
    return total / cells

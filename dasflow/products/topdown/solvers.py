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

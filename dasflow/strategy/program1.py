"""Program 1 (query weighting, Thm 1) solved through its closed-form dual (eigen-design.md §3.1, route ii).

Primal. Design queries i = 1..k with costs ``c_i > 0`` and a non-negative matrix ``M`` (k × n): choose weights
``t ≥ 0`` minimising ``Σ_i c_i t_i^{-r}`` subject to ``Σ_i t_i M_ij ≤ 1`` for every column j.

* (ε, δ) / zCDP (L2): ``t_i = u_i = λ_i²``, ``M = Q ∘ Q``, ``r = 1``: every column of ``A = diag(λ) Q`` has
  squared L2 norm ≤ 1 (sensitivity 1); the objective is ``trace(G (AᵀA)⁻¹)`` for an orthogonal (or any
  invertible, with ``c_i = (Q⁻ᵀ G Q⁻¹)_ii``) design set (Thm 1).
* ε-DP (L1, Sec. 3.5): ``t_i = λ_i``, ``M = |Q|``, ``r = 2``: columns have L1 norm ≤ 1, objective
  ``Σ c_i/λ_i²``.

Dual. With multipliers ``μ ≥ 0`` (one per column) and ``b = M μ``, minimising the Lagrangian over t gives
``t_i(μ) = (r c_i / b_i)^{1/(r+1)}`` and the concave dual ``g(μ) = Σ_i (c_i t_i^{-r} + b_i t_i) − Σ_j μ_j``
with gradient ``Mᵀ t(μ) − 1`` (r = 1: ``g = 2 Σ sqrt(c_i b_i) − Σ μ``, the spec's form). We maximise g with
L-BFGS-B over ``log μ``, recover ``t(μ)``, scale it to feasibility (``max_j (Mᵀt)_j = 1``) and report the
primal value, the dual value and the relative duality gap ``(primal − dual)/primal``: by weak duality the
optimum lies in ``[dual, primal]`` whatever the solver did, so the gap is a convergence certificate. ``c`` is
normalised to ``max c = 1`` internally.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import optimize

from dasflow.strategy._blas import single_threaded_blas

FloatArray = npt.NDArray[np.float64]

__all__ = ["ConvergenceError", "WeightingResult", "solve_weighting"]

#: Up to this many design queries (or twice as many when they are at most half the columns: low rank) Program 1
#: is solved by a primal log-barrier Newton method (k × k Hessians, O(k² n) per step: precise for low-rank
#: workloads, where the n-variable dual stalls, e.g. gap 1.5e-3 for 2-way range marginals 8×16×16, rank 473);
#: otherwise by L-BFGS-B on the dual. Both report the same weak-duality certificate.
PRIMAL_NEWTON_MAX_QUERIES = 400


class ConvergenceError(RuntimeError):
    """Program 1 did not reach the requested duality gap (raised only with ``strict=True``)."""


@dataclass(frozen=True)
class WeightingResult:
    """A feasible weighting ``t`` (max column load exactly 1) with its optimality certificate."""

    t: FloatArray
    primal: float
    dual: float
    gap: float
    converged: bool
    iterations: int
    max_load: float


def _t_of_b(c: FloatArray, b: FloatArray, r: int) -> FloatArray:
    return np.asarray((r * c / b) ** (1.0 / (r + 1)), dtype=np.float64)


def _primal(c: FloatArray, t: FloatArray, r: int) -> float:
    return float(np.sum(c * t ** (-float(r))))


def solve_weighting(
    c: npt.ArrayLike,
    M: npt.ArrayLike,
    *,
    power: int = 1,
    gap_tol: float = 1e-8,
    max_iter: int = 20000,
    strict: bool = False,
) -> WeightingResult:
    """Solve Program 1 (see module docstring). ``M`` has shape (k, n); returns weights of length k.

    ``converged`` is ``gap <= gap_tol``; with ``strict=True`` a larger gap raises :class:`ConvergenceError`.
    """
    c0 = np.asarray(c, dtype=np.float64).ravel()
    Mm = np.asarray(M, dtype=np.float64)
    if Mm.ndim != 2 or Mm.shape[0] != c0.size:
        raise ValueError(f"M must be (k, n) with k = len(c) = {c0.size}; got {Mm.shape}")
    if np.any(c0 <= 0) or not np.all(np.isfinite(c0)):
        raise ValueError("costs c must be finite and > 0 (drop zero-eigenvalue queries first)")
    if np.any(Mm < 0):
        raise ValueError("M must be non-negative")
    if np.any(Mm.sum(axis=1) <= 0):
        raise ValueError("every design query must touch at least one column")
    with single_threaded_blas():
        k, n = Mm.shape
        if k <= PRIMAL_NEWTON_MAX_QUERIES or (2 * k <= n and k <= 2 * PRIMAL_NEWTON_MAX_QUERIES):
            best = _solve_barrier(c0, Mm, int(power), gap_tol)
            if not best.converged:
                alt = _solve(c0, Mm, int(power), gap_tol, max_iter)
                best = alt if alt.gap < best.gap else best
        else:
            best = _solve(c0, Mm, int(power), gap_tol, max_iter)
    if strict and not best.converged:
        raise ConvergenceError(f"Program 1 stopped at relative duality gap {best.gap:.3g} > {gap_tol:.3g}")
    return best


def _solve(c0: FloatArray, Mm: FloatArray, r: int, gap_tol: float, max_iter: int) -> WeightingResult:
    scale = float(c0.max())
    cn = c0 / scale
    n = Mm.shape[1]
    Mt = np.ascontiguousarray(Mm.T)
    tiny = 1e-300

    def neg_dual(z: FloatArray) -> tuple[float, FloatArray]:
        # μ = exp(z) keeps every multiplier positive, so b > 0 and t(μ) stays finite.
        mu = np.exp(z)
        b = np.maximum(Mm @ mu, tiny)
        t = _t_of_b(cn, b, r)
        g = float(np.sum(cn * t ** (-float(r)) + b * t) - mu.sum())
        return -g, np.asarray(-mu * (Mt @ t - 1.0), dtype=np.float64)

    # Start: the best multiple of the all-ones multiplier (closed form for that one-dimensional dual).
    rs = Mm.sum(axis=1)
    if r == 1:
        a0 = (float(np.sum(np.sqrt(cn * rs))) / n) ** 2
    else:
        a0 = float(np.sum(cn ** (1.0 / 3.0) * rs ** (2.0 / 3.0)) / n) ** 3
    z = np.full(n, np.log(max(a0, 1e-300)))
    best: WeightingResult | None = None
    iterations = 0
    state = {"nit": 0}

    def check(intermediate_result: optimize.OptimizeResult) -> None:
        # Stop as soon as the certificate is good enough (every 10 iterations; costs two mat-vecs).
        state["nit"] += 1
        if state["nit"] % 10 == 0:
            fin = _finish(cn, Mm, Mt, np.exp(intermediate_result.x), r, scale, 0, gap_tol)
            if fin.converged:
                raise StopIteration

    for _attempt in range(3):
        state["nit"] = 0
        res = optimize.minimize(
            neg_dual, z, jac=True, method="L-BFGS-B", callback=check,
            options={"maxiter": max_iter, "maxcor": 30, "ftol": 1e-17, "gtol": 1e-15, "maxfun": 2 * max_iter},
        )
        iterations += int(res.nit)
        z = np.asarray(res.x, dtype=np.float64)
        cand = _finish(cn, Mm, Mt, np.exp(z), r, scale, iterations, gap_tol)
        if best is None or cand.gap < best.gap:
            best = cand
        if best.converged or res.nit <= 1:
            break
    assert best is not None
    return best


def _finish(cn: FloatArray, M: FloatArray, Mt: FloatArray, mu: FloatArray, r: int, scale: float,
            iterations: int, gap_tol: float) -> WeightingResult:
    b = np.maximum(M @ mu, 1e-300)
    t = _t_of_b(cn, b, r)
    dual = float(np.sum(cn * t ** (-float(r)) + b * t) - mu.sum())
    load = Mt @ t
    t = t / float(load.max())
    primal = _primal(cn, t, r)
    gap = max((primal - dual) / primal, 0.0)
    return WeightingResult(t=t, primal=primal * scale, dual=dual * scale, gap=gap, converged=gap <= gap_tol,
                           iterations=iterations, max_load=float((Mt @ t).max()))


def _solve_barrier(c0: FloatArray, M: FloatArray, r: int, gap_tol: float) -> WeightingResult:
    """Primal path-following: minimise ``τ f(t) − Σ_j log(1 − (Mᵀt)_j)`` by damped Newton, τ ×10 per stage.

    On the central path ``μ_j = 1/(τ s_j)`` is dual feasible, so every stage yields a certificate.
    """
    scale = float(c0.max())
    cn = c0 / scale
    Mt = np.ascontiguousarray(M.T)
    t = np.full(cn.size, 0.5 / float(np.max(M.sum(axis=0))))
    n = M.shape[1]

    def f(x: FloatArray) -> float:
        return float(np.sum(cn * x ** (-float(r))))

    tau = n / f(t)
    best: WeightingResult | None = None
    iterations = 0
    for _stage in range(40):
        for _ in range(100):
            slack = 1.0 - Mt @ t
            inv = 1.0 / slack
            grad = tau * (-r * cn * t ** (-float(r) - 1.0)) + M @ inv
            H = (M * inv**2) @ Mt
            H[np.diag_indices_from(H)] += tau * r * (r + 1) * cn * t ** (-float(r) - 2.0)
            try:
                d = -np.linalg.solve(H, grad)
            except np.linalg.LinAlgError:
                d = -np.linalg.lstsq(H, grad, rcond=None)[0]
            dec = float(-grad @ d)
            iterations += 1
            if dec / 2.0 <= 1e-12:
                break
            step = 1.0
            neg = d < 0
            if neg.any():
                step = min(step, 0.99 * float(np.min(-t[neg] / d[neg])))
            dm = Mt @ d
            pos = dm > 0
            if pos.any():
                step = min(step, 0.99 * float(np.min(slack[pos] / dm[pos])))
            phi0 = tau * f(t) - float(np.sum(np.log(slack)))
            accepted = False
            while step > 1e-14:
                tn = t + step * d
                sn = 1.0 - Mt @ tn
                if np.all(tn > 0) and np.all(sn > 0):
                    phi = tau * f(tn) - float(np.sum(np.log(sn)))
                    if phi <= phi0 - 0.25 * step * dec:
                        accepted = True
                        break
                step *= 0.5
            if not accepted:  # no progress possible at this τ (round-off): go to the next stage
                break
            t = tn
        mu = 1.0 / (tau * (1.0 - Mt @ t))
        cand = _finish(cn, M, Mt, mu, r, scale, iterations, gap_tol)
        # the barrier iterate itself, scaled to full load, is the better primal point
        tt = t / float((Mt @ t).max())
        primal = _primal(cn, tt, r)
        if primal * scale < cand.primal:
            gap = max((primal - cand.dual / scale) / primal, 0.0)
            cand = WeightingResult(t=tt, primal=primal * scale, dual=cand.dual, gap=gap,
                                   converged=gap <= gap_tol, iterations=iterations,
                                   max_load=float((Mt @ tt).max()))
        if best is None or cand.gap < best.gap:
            best = cand
        if best.converged:
            break
        tau *= 10.0
    assert best is not None
    return best

"""Eigen-Design (Program 2) and its reductions (eigen-design.md §3.2-3.3, §4).

``eigen_design(workload)`` is data-independent: it reads the workload's Gram ``G = WᵀW`` and options only,
never a histogram (E16); the result is cached by a hash of (G, options). Steps:

1. ``G = Qᵀ diag(s) Q`` (``eigh``; Kronecker workloads factorise, ``G = ⊗G_i`` has eigenvectors ``⊗Q_i``);
   eigen-queries with ``s_i <= tol · max s`` are dropped (low rank, §4.1: they carry no workload).
2. Program 1 with ``c_i = s_i`` and ``M = Q ∘ Q`` (:func:`dasflow.strategy.program1.solve_weighting`) gives
   ``u``; ``A' = diag(sqrt u) Q`` has every column's squared norm ≤ 1 (L2 sensitivity 1).
3. Completion (steps 4-5): a diagonal row ``sqrt(1 − ||A'_j||²)`` tops every column up to norm 1. The L2
   sensitivity stays 1, ``AᵀA`` grows in PSD order, so the error can only fall.

Privacy: the returned strategy has L2 sensitivity ``Δ₂(A) = max_j ||A_j|| = 1`` (add/remove neighbours) — the
value any mechanism must calibrate to is :attr:`EigenStrategy.sensitivity`, computed on the FINAL completed A.

Reductions (§4.2): ``method="principal"`` weights the top ``fraction`` of eigen-queries individually and the
rest with one shared weight; ``method="separation"`` solves Program 1 per group of ``group_size``
eigen-queries (sorted by eigenvalue) and then a second Program 1 over one factor per group. BLAS runs
single-threaded inside (see :mod:`dasflow.strategy._blas`: on a shared 2-core machine that is 5-30x faster
than two spinning threads)."""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.linalg

from dasflow.strategy._blas import single_threaded_blas
from dasflow.strategy.error import row_normalized
from dasflow.strategy.program1 import WeightingResult, solve_weighting
from dasflow.strategy.workloads import DenseWorkload, KronWorkload, Workload

FloatArray = npt.NDArray[np.float64]
Method = Literal["full", "principal", "separation"]

__all__ = ["EigenStrategy", "eigen_decompose", "eigen_design", "sqrt_strategy"]


@dataclass(frozen=True)
class EigenStrategy:
    """A weighted eigen-query strategy ``A = [diag(sqrt u) Q ; diag(sqrt pad)]`` (zero pad rows omitted)."""

    Q: FloatArray
    u: FloatArray
    pad: FloatArray
    eigenvalues: FloatArray
    method: str
    solve: WeightingResult | None
    info: dict[str, float] = field(default_factory=dict)

    @property
    def cells(self) -> int:
        return int(self.Q.shape[1])

    def gram(self, completed: bool = True) -> FloatArray:
        """AᵀA (completed, or A'ᵀA' before completion)."""
        X = (self.Q.T * self.u) @ self.Q
        if completed:
            X[np.diag_indices_from(X)] += self.pad
        return np.asarray(X, dtype=np.float64)

    def matrix(self, completed: bool = True) -> FloatArray:
        """The strategy's rows, dense."""
        A = np.sqrt(self.u)[:, None] * self.Q
        if not completed:
            return np.asarray(A, dtype=np.float64)
        idx = np.where(self.pad > 0)[0]
        D = np.zeros((idx.size, self.cells))
        D[np.arange(idx.size), idx] = np.sqrt(self.pad[idx])
        return np.asarray(np.vstack([A, D]), dtype=np.float64)

    def column_norms_squared(self, completed: bool = True) -> FloatArray:
        load = (self.Q * self.Q).T @ self.u
        return np.asarray(load + self.pad if completed else load, dtype=np.float64)

    @property
    def sensitivity(self) -> float:
        """L2 sensitivity of the final (completed) strategy: max column norm."""
        return float(math.sqrt(float(self.column_norms_squared().max())))

    def trace_term(self, G: FloatArray, completed: bool = True) -> float:
        """trace(G (AᵀA)⁺); with unit sensitivity this is TSE / P (Eq. 1)."""
        return _trace_inv(G, self.gram(completed))

    def tse(self, G: FloatArray, P: float = 1.0, completed: bool = True) -> float:
        """Total squared error P · Δ₂(A)² · trace(G (AᵀA)⁺)."""
        sens2 = float(self.column_norms_squared(completed).max())
        return P * sens2 * self.trace_term(G, completed)


def _trace_inv(G: FloatArray, X: FloatArray) -> float:
    """trace(G X⁺) for symmetric PSD X: Cholesky when X is positive definite, else an eigen pseudo-inverse."""
    with single_threaded_blas():
        try:
            c = scipy.linalg.cho_factor(X, check_finite=False)
            Xi = scipy.linalg.cho_solve(c, np.eye(X.shape[0]), check_finite=False)
            cond_ok = bool(np.all(np.isfinite(Xi)))
        except np.linalg.LinAlgError:
            cond_ok = False
        if not cond_ok or float(np.min(np.diag(c[0])) ** 2) < 1e-12 * float(np.max(np.diag(X))):
            w, V = scipy.linalg.eigh(X, driver="evd", check_finite=False)
            keep = w > 1e-10 * float(w.max())
            Xi = (V[:, keep] / w[keep]) @ V[:, keep].T
        return float(np.sum(Xi * G))


def eigen_decompose(workload: Workload | FloatArray) -> tuple[FloatArray, FloatArray]:
    """Eigenvalues ``s`` (descending) and eigen-queries ``Q`` (rows) of G; Kronecker workloads factorise."""
    with single_threaded_blas():
        if isinstance(workload, KronWorkload):
            s = np.ones(1)
            Q = np.ones((1, 1))
            for g in workload.factor_grams():
                w, V = scipy.linalg.eigh(g, driver="evd", check_finite=False)
                s = np.kron(s, w)
                Q = np.kron(Q, V.T)
        else:
            G = workload.gram() if isinstance(workload, Workload) else np.asarray(workload, dtype=np.float64)
            if G.ndim != 2 or G.shape[0] != G.shape[1]:
                raise ValueError(f"G must be square, got {G.shape}")
            if not np.allclose(G, G.T, rtol=1e-10, atol=1e-12 * float(np.abs(G).max() or 1.0)):
                raise ValueError("G must be symmetric (a Gram matrix WᵀW)")
            s, V = scipy.linalg.eigh(G, driver="evd", check_finite=False)
            Q = V.T
    order = np.argsort(-s, kind="stable")
    return np.asarray(s[order], dtype=np.float64), np.ascontiguousarray(Q[order])


def sqrt_strategy(workload: Workload | FloatArray, tol: float = 1e-10) -> EigenStrategy:
    """A_l of Thm 2's intuition: eigen-queries weighted so that AᵀA ∝ G^{1/2}, scaled to sensitivity 1."""
    s, Q = eigen_decompose(workload)
    keep = s > tol * s[0]
    s, Q = s[keep], Q[keep]
    u = np.sqrt(s)
    u = u / float(((Q * Q).T @ u).max())
    return EigenStrategy(Q=Q, u=u, pad=np.zeros(Q.shape[1]), eigenvalues=s, method="sqrt", solve=None)


_CACHE: OrderedDict[str, EigenStrategy] = OrderedDict()
_CACHE_SIZE = 8


def _key(G: FloatArray, *opts: object) -> str:
    h = hashlib.sha256(np.ascontiguousarray(G, dtype=np.float64).tobytes())
    h.update(repr((G.shape, *opts)).encode())
    return h.hexdigest()


def eigen_design(
    workload: Workload | FloatArray,
    *,
    tol: float = 1e-10,
    method: Method = "full",
    fraction: float = 0.1,
    group_size: int = 16,
    complete: bool = True,
    gap_tol: float = 1e-5,
    max_iter: int = 20000,
    normalize_rows: bool = False,
    cache: bool = True,
) -> EigenStrategy:
    """Eigen-Design strategy for a workload (or its Gram G). Data-independent; cached by hash of (G, options).

    ``tol``: relative eigenvalue cut (§4.1); ``gap_tol``: Program 1's relative duality gap target (reported in
    ``solve``; a larger gap is reported, not hidden: ``solve.converged`` is False). ``normalize_rows``: design
    for the row-normalised workload (relative-error heuristic, §1; needs materialisable rows); report relative
    error on the original W with :func:`dasflow.strategy.error.expected_relative_error`.
    """
    if normalize_rows:
        if not isinstance(workload, Workload):
            raise ValueError("normalize_rows needs the workload's rows, not only its Gram")
        try:
            rows = workload.matrix()
        except NotImplementedError as exc:
            raise ValueError("normalize_rows needs the workload's rows; this workload is implicit") from exc
        workload = DenseWorkload(row_normalized(rows), name=f"normalized {workload.name}")
    G = workload.gram() if isinstance(workload, Workload) else np.asarray(workload, dtype=np.float64)
    key = _key(G, tol, method, fraction, group_size, complete, gap_tol, max_iter)
    if cache and key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    s, Q = eigen_decompose(workload)
    if s[0] <= 0:
        raise ValueError("the workload is zero: nothing to design for")
    keep = s > tol * s[0]
    s, Q = s[keep], Q[keep]
    M = Q * Q
    info: dict[str, float] = {"rank": float(s.size)}
    if method == "full":
        res = solve_weighting(s, M, gap_tol=gap_tol, max_iter=max_iter)
        u = res.t
    elif method == "principal":
        k = max(1, min(s.size, math.ceil(fraction * s.size)))
        if k == s.size:
            res = solve_weighting(s, M, gap_tol=gap_tol, max_iter=max_iter)
            u = res.t
        else:
            c = np.concatenate([s[:k], [s[k:].sum()]])
            Mg = np.vstack([M[:k], M[k:].sum(axis=0)])
            res = solve_weighting(c, Mg, gap_tol=gap_tol, max_iter=max_iter)
            u = np.concatenate([res.t[:k], np.full(s.size - k, res.t[k])])
        info["principal"] = float(k)
    elif method == "separation":
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        groups = [np.arange(a, min(a + group_size, s.size)) for a in range(0, s.size, group_size)]
        inner = [solve_weighting(s[g], M[g], gap_tol=gap_tol, max_iter=max_iter) for g in groups]
        c2 = np.array([float(np.sum(s[g] / r.t)) for g, r in zip(groups, inner, strict=True)])
        M2 = np.vstack([r.t @ M[g] for g, r in zip(groups, inner, strict=True)])
        res = solve_weighting(c2, M2, gap_tol=gap_tol, max_iter=max_iter)
        u = np.concatenate([res.t[i] * r.t for i, r in enumerate(inner)])
        info["groups"] = float(len(groups))
        info["max_inner_gap"] = max(r.gap for r in inner)
    else:
        raise ValueError(f"unknown method {method!r}")
    load = M.T @ u
    u = u / float(load.max())  # exact sensitivity 1 before completion
    load = M.T @ u
    pad = np.clip(1.0 - load, 0.0, None) if complete else np.zeros_like(load)
    pad[pad < 1e-12] = 0.0
    strat = EigenStrategy(Q=Q, u=u, pad=pad, eigenvalues=s, method=method, solve=res, info=info)
    if cache:
        _CACHE[key] = strat
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return strat

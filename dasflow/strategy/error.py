"""Sensitivities, the matrix-mechanism error (Eq. 1) and the singular value bound (eigen-design.md §1-2).

Conventions (spec §1, inconsistency 0(b)): ``tse`` is the TOTAL squared error over the workload rows,
``TSE = P · Δ(A)² · trace(G (AᵀA)⁺)``, and ``rms = sqrt(TSE / m)``. ``P`` is the noise constant of the privacy
definition: ``p_gaussian`` (ε, δ) = 2 ln(2/δ)/ε² (the paper's Prop. 2), ``p_laplace`` = 2/ε² (Laplace variance 2b²,
b = Δ₁/ε), ``p_zcdp`` = 1/(2ρ) (Gaussian σ² = Δ₂²/(2ρ)). These floats are for analysis and display; budgets that
decide noise stay exact Fractions in the products.

Neighbours: ``add_remove`` (the paper's: x and x' differ by one in one cell) makes Δ the maximum column norm;
``replace_one`` (one record moves between two cells) makes it ``max_{j,k} ||A_j − A_k||``.
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.sparse as sp

from dasflow.strategy._blas import single_threaded_blas

FloatArray = npt.NDArray[np.float64]
Neighbours = Literal["add_remove", "replace_one"]
#: a dense array or a scipy sparse matrix/array (scipy ships no type stubs, so this is Any to mypy)
Matrix: TypeAlias = Any

__all__ = [
    "l1_sensitivity",
    "l2_sensitivity",
    "lower_bound_tse",
    "p_gaussian",
    "p_laplace",
    "p_zcdp",
    "rms",
    "supports",
    "svdb",
    "trace_term",
    "tse",
]


def p_gaussian(epsilon: float, delta: float) -> float:
    """P(ε, δ) = 2 ln(2/δ)/ε² (Prop. 2; natural log)."""
    if not (epsilon > 0 and 0 < delta < 1):
        raise ValueError("need epsilon > 0 and 0 < delta < 1")
    return 2.0 * math.log(2.0 / delta) / epsilon**2


def p_laplace(epsilon: float) -> float:
    """P for ε-DP Laplace noise of scale Δ₁/ε: variance 2Δ₁²/ε², so P = 2/ε²."""
    if not epsilon > 0:
        raise ValueError("need epsilon > 0")
    return 2.0 / epsilon**2


def p_zcdp(rho: float) -> float:
    """P for ρ-zCDP Gaussian noise: σ² = Δ₂²/(2ρ), so P = 1/(2ρ)."""
    if not rho > 0:
        raise ValueError("need rho > 0")
    return 1.0 / (2.0 * float(rho))


def _dense(A: Matrix) -> FloatArray:
    if sp.issparse(A):
        return np.asarray(A.toarray(), dtype=np.float64)
    return np.asarray(A, dtype=np.float64)


def _column_norms(A: Matrix, order: int) -> FloatArray:
    if sp.issparse(A):
        S = sp.csc_array(A)
        v = np.asarray((abs(S).power(order)).sum(axis=0)).ravel()
    else:
        v = np.sum(np.abs(np.asarray(A, dtype=np.float64)) ** order, axis=0)
    return np.asarray(v ** (1.0 / order), dtype=np.float64)


def l2_sensitivity(A: Matrix, neighbours: Neighbours = "add_remove") -> float:
    """Δ₂(A): max column L2 norm (add/remove) or max pairwise column-difference norm (replace-one)."""
    if neighbours == "add_remove":
        return float(np.max(_column_norms(A, 2)))
    D = _dense(A)
    sq = np.sum(D * D, axis=0)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (D.T @ D)
    return float(math.sqrt(max(float(np.max(d2)), 0.0)))


def l1_sensitivity(A: Matrix, neighbours: Neighbours = "add_remove") -> float:
    """Δ₁(A): max column L1 norm (add/remove) or max_{j,k} ||A_j − A_k||₁ (replace-one)."""
    if neighbours == "add_remove":
        return float(np.max(_column_norms(A, 1)))
    D = _dense(A)
    n = D.shape[1]
    best = 0.0
    for j in range(n):  # O(n² p) without an n × n × p temporary
        best = max(best, float(np.max(np.sum(np.abs(D - D[:, [j]]), axis=0))))
    return best


def _psd_pinv(M: FloatArray, rtol: float = 1e-10) -> tuple[FloatArray, FloatArray]:
    """Pseudo-inverse of a symmetric PSD matrix and the projector on its range."""
    with single_threaded_blas():
        w, V = scipy.linalg.eigh(M, driver="evd", check_finite=False)
    keep = w > rtol * max(float(w.max()), 0.0)
    Vk = V[:, keep]
    return (Vk / w[keep]) @ Vk.T, Vk @ Vk.T


def trace_term(G: FloatArray, AtA: FloatArray) -> float:
    """trace(G (AᵀA)⁺): the strategy-dependent factor of Eq. 1 for unit-sensitivity-free noise."""
    pinv, _ = _psd_pinv(np.asarray(AtA, dtype=np.float64))
    return float(np.sum(pinv * G))


def supports(G: FloatArray, AtA: FloatArray, rtol: float = 1e-8) -> bool:
    """rowspace(W) ⊆ rowspace(A), tested as ||W(I − Π_A)||_F² = trace((I−Π)G(I−Π)) ≤ rtol² ||W||_F² (E3)."""
    _, proj = _psd_pinv(np.asarray(AtA, dtype=np.float64))
    R = np.eye(G.shape[0]) - proj
    resid = float(np.sum((R @ G) * R))
    return resid <= rtol**2 * float(np.trace(G))


def tse(A: Matrix, G: FloatArray, P: float = 1.0, *, norm: Literal["l2", "l1"] = "l2",
        neighbours: Neighbours = "add_remove") -> float:
    """Total squared error of strategy A on the workload with Gram G: P · Δ(A)² · trace(G (AᵀA)⁺) (Eq. 1).

    Raises ``ValueError`` if A does not support the workload (the least-squares answers would be biased).
    """
    D = _dense(A)
    AtA = D.T @ D
    pinv, proj = _psd_pinv(AtA)
    R = np.eye(G.shape[0]) - proj
    if float(np.sum((R @ G) * R)) > 1e-16 * float(np.trace(G)):
        raise ValueError("strategy does not support the workload: rowspace(W) is not inside rowspace(A)")
    sens = l2_sensitivity(D, neighbours) if norm == "l2" else l1_sensitivity(D, neighbours)
    return P * sens**2 * float(np.sum(pinv * G))


def rms(total_squared_error: float, rows: int) -> float:
    """Root mean squared error per workload query (Def. 5): sqrt(TSE / m)."""
    return math.sqrt(total_squared_error / rows)


def svdb(G: FloatArray, eigenvalues: FloatArray | None = None) -> float:
    """Singular value bound (Thm 2): (Σ sqrt(σ_i))² / n with σ_i the eigenvalues of G = WᵀW."""
    ev = np.linalg.eigvalsh(G) if eigenvalues is None else np.asarray(eigenvalues, dtype=np.float64)
    return float(np.sum(np.sqrt(np.clip(ev, 0.0, None))) ** 2 / G.shape[0])


def lower_bound_tse(G: FloatArray, P: float = 1.0) -> float:
    """Lower bound on the TSE of every strategy (same P): P · svdb(W)."""
    return P * svdb(G)


#: Sanity floor of the relative error (project choice, E17; the paper states none): a query whose true answer is
#: below one person is measured against 1, so empty cells do not make the average infinite.
RELATIVE_ERROR_FLOOR = 1.0


def row_normalized(W: Matrix) -> FloatArray:
    """W with every non-zero row scaled to unit L2 norm (the paper's relative-error pre-scaling, §1)."""
    D = _dense(W)
    norms = np.linalg.norm(D, axis=1)
    norms[norms == 0] = 1.0
    return np.asarray(D / norms[:, None], dtype=np.float64)


def expected_relative_error(W: Matrix, A: Matrix, x: npt.ArrayLike, P: float = 1.0, *,
                            floor: float = RELATIVE_ERROR_FLOOR) -> float:
    """Mean over workload queries of ``RMS error_i / max(|w_i x|, floor)`` on the ORIGINAL W (E17).

    Evaluation only: it reads a data vector ``x``, so it must never feed strategy selection (E16).
    """
    D = _dense(W)
    Am = _dense(A)
    AtA = Am.T @ Am
    if not supports(D.T @ D, AtA):
        raise ValueError("strategy does not support the workload")
    pinv, _ = _psd_pinv(AtA)
    var = P * l2_sensitivity(Am) ** 2 * np.einsum("ij,jk,ik->i", D, pinv, D)
    truth = np.abs(D @ np.asarray(x, dtype=np.float64))
    return float(np.mean(np.sqrt(np.clip(var, 0.0, None)) / np.maximum(truth, floor)))

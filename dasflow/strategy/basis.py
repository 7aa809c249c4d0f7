"""Program 1 over a user-supplied invertible basis, for (ε, δ)/zCDP (L2) or pure ε-DP (L1) (Secs. 3.5, 5.3).

For an invertible n × n design matrix B (rows = design queries: Haar, a real Fourier/DCT basis, …) and
``A = diag(λ) B``: ``(AᵀA)⁻¹ = B⁻¹ diag(λ⁻²) B⁻ᵀ``, so ``trace(G (AᵀA)⁻¹) = Σ_i c_i / λ_i²`` with
``c_i = (B⁻ᵀ G B⁻¹)_ii`` — the objective separates for ANY invertible basis (Thm 1's derivation). The
sensitivity constraint is ``Σ_i λ_i² B_ij² ≤ 1`` (L2, weights ``u = λ²``) or ``Σ_i λ_i |B_ij| ≤ 1`` (L1,
weights ``λ``; the paper omits this formulation, §3.5: it is convex in λ and our dual covers it with r = 2).
Under ε-DP the mechanism adds Laplace noise of scale ``Δ₁(A)/ε`` (P_Laplace = 2/ε²); the eigen-queries are not
a good default there, so no eigen basis is offered here (E18). Data-independent.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
import scipy.fft
import scipy.linalg

from dasflow.strategy.program1 import WeightingResult, solve_weighting
from dasflow.strategy.workloads import Workload

FloatArray = npt.NDArray[np.float64]

__all__ = ["BasisStrategy", "dct_basis", "weight_basis"]


@dataclass(frozen=True)
class BasisStrategy:
    """``A = diag(λ) B`` with Δ(A) = 1 in the chosen norm; queries with zero cost get weight 0 (dropped)."""

    basis: FloatArray
    lam: FloatArray
    norm: str
    solve: WeightingResult | None

    def matrix(self) -> FloatArray:
        keep = self.lam > 0
        return np.asarray(self.lam[keep, None] * self.basis[keep], dtype=np.float64)


def dct_basis(n: int) -> FloatArray:
    """The orthonormal DCT-II matrix: a real Fourier basis of ℝⁿ (rows = cosine queries)."""
    return np.asarray(scipy.fft.dct(np.eye(n), type=2, norm="ortho", axis=0), dtype=np.float64)


def weight_basis(workload: Workload | FloatArray, basis: npt.ArrayLike, *, norm: Literal["l1", "l2"] = "l1",
                 gap_tol: float = 1e-8) -> BasisStrategy:
    """Optimal row weights of ``basis`` for the workload (Program 1, L1 or L2 sensitivity)."""
    G = workload.gram() if isinstance(workload, Workload) else np.asarray(workload, dtype=np.float64)
    B = np.asarray(basis, dtype=np.float64)
    n = G.shape[0]
    if B.shape != (n, n):
        raise ValueError(f"basis must be {n} × {n}, got {B.shape}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
            lu = scipy.linalg.lu_factor(B)
    except (ValueError, np.linalg.LinAlgError) as exc:
        raise ValueError("basis must be invertible") from exc
    if np.min(np.abs(np.diag(lu[0]))) < 1e-12 * np.max(np.abs(lu[0])):
        raise ValueError("basis must be invertible")
    Binv = scipy.linalg.lu_solve(lu, np.eye(n))
    c = np.einsum("ji,jk,ki->i", Binv, G, Binv)  # diag(B⁻ᵀ G B⁻¹)
    active = c > 1e-12 * float(c.max())
    M = np.abs(B) if norm == "l1" else B * B
    power = 2 if norm == "l1" else 1
    res = solve_weighting(c[active], M[active], power=power, gap_tol=gap_tol)
    t = np.zeros(n)
    t[active] = res.t
    lam = t if norm == "l1" else np.sqrt(t)
    return BasisStrategy(basis=B, lam=lam, norm=norm, solve=res)

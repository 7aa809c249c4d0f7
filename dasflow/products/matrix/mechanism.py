"""The matrix mechanism for an integral strategy: exact discrete-Gaussian measurement + least squares (E3).

``measure(A, x, rho, g)``: y = A x + N_Z(0, σ²)^p with σ² = Δ₂(A)²/(2ρ) (add/remove neighbours: Δ₂(A)² is the
largest squared column norm, an integer for an integer A, so σ² is an exact Fraction). A is integer-valued, hence
A x is an integer vector and the discrete Gaussian gives exactly ρ-zCDP (CKS 2020, Thm 14 applied to the vector
query A x of L2 sensitivity Δ₂(A)).

``answer(A, y, W, sigma2)``: x̂ = A⁺ y (least squares), answers W x̂ and the expected total squared error
σ² trace(WᵀW (AᵀA)⁺) (Eq. 1). Refuses a strategy that does not support W (``||W A⁺A − W||_F > 1e-8 ||W||_F``):
its answers would be biased. Post-processing only.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.errors import InputError
from dasflow.privacy import accounting, samplers

__all__ = ["answer", "measure"]


def _integral(A: npt.ArrayLike) -> npt.NDArray[np.int64]:
    Af = np.asarray(A, dtype=np.float64)
    if Af.ndim != 2 or not np.all(np.isfinite(Af)) or np.any(Af != np.round(Af)):
        raise InputError("the strategy must be an integer matrix for exact discrete-Gaussian measurement",
                         column="strategy")
    return Af.astype(np.int64)


def measure(A: npt.ArrayLike, x: npt.ArrayLike, rho: Fraction, g: Any) -> tuple[npt.NDArray[np.int64], Fraction]:
    """Noisy strategy answers and their exact σ² (see module docstring)."""
    Ai = _integral(A)
    xi = np.asarray(x)
    if xi.ndim != 1 or xi.size != Ai.shape[1] or not np.issubdtype(xi.dtype, np.integer) or np.any(xi < 0):
        raise InputError(f"x must be a non-negative integer vector of length {Ai.shape[1]}", column="x")
    sens2 = int(np.max(np.sum(Ai * Ai, axis=0)))
    sigma2 = accounting.gaussian_sigma2_sq(rho, sens2)
    y = Ai @ xi.astype(np.int64) + samplers.discrete_gaussian(sigma2, Ai.shape[0], g)
    return np.asarray(y, dtype=np.int64), sigma2


def answer(A: npt.ArrayLike, y: npt.ArrayLike, W: npt.ArrayLike, sigma2: Fraction
           ) -> tuple[npt.NDArray[np.float64], float]:
    """Least-squares workload answers and their expected total squared error."""
    Af = np.asarray(A, dtype=np.float64)
    Wf = np.atleast_2d(np.asarray(W, dtype=np.float64))
    pinv = np.linalg.pinv(Af)
    resid = float(np.linalg.norm(Wf @ pinv @ Af - Wf))
    if resid > 1e-8 * float(np.linalg.norm(Wf)):
        raise InputError("the strategy does not support the workload (rowspace(W) ⊄ rowspace(A))",
                         column="strategy")
    xhat = pinv @ np.asarray(y, dtype=np.float64)
    WA = Wf @ pinv
    return np.asarray(Wf @ xhat, dtype=np.float64), float(sigma2) * float(np.sum(WA * WA))

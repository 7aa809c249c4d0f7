"""E7: the Program 1 dual solver (feasibility, duality gap, agreement with an independent primal solver)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from scipy import optimize

from dasflow.strategy import workloads as w
from dasflow.strategy.program1 import ConvergenceError, solve_weighting


def _eigen_problem(G):
    s, V = scipy.linalg.eigh(G)
    keep = s > 1e-10 * s.max()
    Q = V[:, keep].T
    return s[keep], Q * Q


def _primal_reference(c, M, power=1):
    """Independent solver: SLSQP on the primal in log-weights (no duality involved)."""
    c = c / c.max()
    k = c.size

    def obj(z):
        t = np.exp(z)
        return float(np.sum(c * t ** (-power)))

    def jac(z):
        t = np.exp(z)
        return -power * c * t ** (-power)

    cons = {"type": "ineq", "fun": lambda z: 1.0 - M.T @ np.exp(z),
            "jac": lambda z: -(M.T * np.exp(z)[None, :])}
    z0 = np.full(k, -np.log(M.sum(axis=0).max()))
    res = optimize.minimize(obj, z0, jac=jac, constraints=[cons], method="SLSQP",
                            options={"ftol": 1e-15, "maxiter": 2000})
    return res.fun


@pytest.mark.parametrize("G", [w.all_range(16).gram(), w.prefix(24).gram(), w.fig1_workload().gram(),
                               w.marginals([3, 3, 2], 2).gram()])
def test_e7_dual_solver_certificate_and_reference(G):
    c, M = _eigen_problem(G)
    res = solve_weighting(c, M, gap_tol=1e-8)
    assert np.all(res.t > 0)
    assert res.max_load == pytest.approx(1.0, abs=1e-9)
    assert res.converged and res.gap <= 1e-8
    assert res.dual <= res.primal * (1 + 1e-12)
    ref = _primal_reference(c, M) * c.max()
    assert res.primal == pytest.approx(ref, rel=1e-6)
    assert res.primal <= ref * (1 + 1e-8)


def test_e7_l1_power_matches_reference():
    B = w.haar(16)
    G = w.all_range(16).gram()
    Binv = np.linalg.inv(B)
    c = np.einsum("ji,jk,ki->i", Binv, G, Binv)
    res = solve_weighting(c, np.abs(B), power=2, gap_tol=1e-8)
    assert res.converged
    assert res.primal == pytest.approx(_primal_reference(c, np.abs(B), power=2) * c.max(), rel=1e-6)


def test_e7_normalises_c_internally_and_flags_non_convergence():
    c, M = _eigen_problem(w.all_range(64).gram())
    a = solve_weighting(c, M, gap_tol=1e-7)
    b = solve_weighting(c * 1e9, M, gap_tol=1e-7)
    assert b.primal == pytest.approx(a.primal * 1e9, rel=1e-6)
    assert np.allclose(a.t, b.t, rtol=1e-4)
    stopped = solve_weighting(c, M, gap_tol=1e-14, max_iter=3)
    assert not stopped.converged and stopped.gap > 1e-14
    with pytest.raises(ConvergenceError):
        solve_weighting(c, M, gap_tol=1e-14, max_iter=3, strict=True)


def test_e7_input_validation():
    with pytest.raises(ValueError):
        solve_weighting([1.0, 0.0], np.ones((2, 3)))
    with pytest.raises(ValueError):
        solve_weighting([1.0], -np.ones((1, 3)))
    with pytest.raises(ValueError):
        solve_weighting([1.0, 2.0], np.ones((3, 3)))

"""Relaxed-QP baselines M_H-R / M_HC-R: the Clarabel solve equals an independent scipy solve of the SAME relaxed
problem (Model 1 / Model 2 without integrality), its KKT certificate is tight, and the certificate rejects a
non-optimal point. Deterministic (seeded); no statistical assertions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from dasflow.postprocess import relaxed_qp
from dasflow.postprocess.relaxed_qp import (
    counts_problem,
    cumulative_problem,
    relaxed_counts_qp,
    relaxed_cumulative_qp,
    round_half_up,
)
from dasflow.postprocess.tree_dp import TreeShape
from dasflow.products.groupsize.metrics import consistency_violations

SHAPE = TreeShape((np.zeros(2, dtype=np.int64), np.array([0, 0, 1, 1, 1], dtype=np.int64)))  # 1 / 2 / 5


def _noisy(rng: np.random.Generator, k: int, scale: float) -> list[np.ndarray]:
    return [rng.normal(0, scale, size=(s, k)) + rng.integers(0, 6, size=(s, k)) for s in SHAPE.sizes]


def _scipy_solve(p: relaxed_qp._Problem, shape: TreeShape = SHAPE) -> np.ndarray:
    """Independent solve of min ||x - t||^2, A_eq x = b, A_le x <= 0, x >= 0 by SLSQP from a feasible start
    (equal leaf counts summing to n; cumulated along j for the cumulative problem)."""
    a_eq, a_le, t = p.a_eq.toarray(), p.a_le.toarray(), p.target
    k = t.size // sum(shape.sizes)
    leaf = np.full((shape.sizes[-1], k), float(p.b_eq[-1]) / (shape.sizes[-1] * k))
    if a_le.shape[0]:
        leaf = np.cumsum(leaf, axis=1)
    x0 = relaxed_qp._tree_sums(shape, leaf)
    cons = [{"type": "eq", "fun": lambda x: a_eq @ x - p.b_eq, "jac": lambda x: a_eq}]
    if a_le.shape[0]:
        cons.append({"type": "ineq", "fun": lambda x: -(a_le @ x), "jac": lambda x: -a_le})
    res = minimize(lambda x: float(((x - t) ** 2).sum()), x0, jac=lambda x: 2 * (x - t),
                   bounds=[(0, None)] * t.size, constraints=cons, method="SLSQP",
                   options={"ftol": 1e-12, "maxiter": 2000})
    assert res.success, res.message
    return np.asarray(res.x)


@pytest.mark.parametrize("which", ["counts", "cumulative"])
def test_clarabel_matches_independent_scipy_solve(which: str) -> None:
    rng = np.random.default_rng(11)
    for trial in range(6):
        k = 3 + trial % 2
        noisy = _noisy(rng, k, 4.0)
        total = int(rng.integers(5, 40))
        if which == "counts":
            res, prob = relaxed_counts_qp(SHAPE, noisy, total), counts_problem(SHAPE, noisy, total)
        else:
            noisy = [np.cumsum(a, axis=1) for a in noisy]
            res, prob = relaxed_cumulative_qp(SHAPE, noisy, total), cumulative_problem(SHAPE, noisy, total)
        assert res.status == "Solved" and res.kkt is not None
        x = np.concatenate([r.ravel() for r in res.relaxed])
        ref = _scipy_solve(prob)
        f_ref = float(((ref - prob.target) ** 2).sum())
        assert res.kkt.objective == pytest.approx(f_ref, rel=1e-7, abs=1e-7)
        np.testing.assert_allclose(x, ref, atol=1e-4)
        # certificate: feasible, stationary, gap ~ 0 -- and the dual bound is below the independent optimum
        assert res.kkt.primal_residual < 1e-6 and res.kkt.stationarity < 1e-5
        assert res.kkt.dual_infeasibility == 0.0
        assert 0 <= res.kkt.gap < 1e-6 * max(1.0, f_ref) + 1e-7
        assert res.kkt.dual_bound <= f_ref + 1e-7
        # the relaxed solution is consistent; the rounding is entry-wise half-up (its #CV is the caller's to count)
        assert consistency_violations(SHAPE, [np.round(r, 6) for r in res.relaxed]) >= 0
        if which == "counts":
            for r, q in zip(res.relaxed, res.rounded, strict=True):
                np.testing.assert_array_equal(q, round_half_up(r))


def test_certificate_rejects_a_non_optimal_point() -> None:
    """The gap is not an artefact of the solver's own report: a perturbed feasible point gets a positive gap
    equal to its sub-optimality bound, an infeasible one a positive primal residual."""
    rng = np.random.default_rng(3)
    noisy = _noisy(rng, 3, 4.0)
    res = relaxed_counts_qp(SHAPE, noisy, 30)
    assert res.kkt is not None
    prob = counts_problem(SHAPE, noisy, 30)
    x = np.concatenate([r.ravel() for r in res.relaxed])
    # move mass between two leaves of the same column keeping every constraint: still feasible, worse
    off = 3 * 3  # level-2 block starts after 1*3 + 2*3 entries
    y = x.copy()
    j = int(np.argmax(y[off : off + 3]))
    y[off + j] -= min(1.0, y[off + j])
    y[off + 3 + j] += min(1.0, x[off + j])
    y[3 + j] = y[off + j] + y[off + 3 + j]  # state 0 has leaves 0 and 1
    z = np.zeros(prob.a_eq.shape[0])
    worse = relaxed_qp._certificate(prob, y, z, np.zeros(0), np.zeros(y.size))
    assert worse.primal_residual < 1e-9
    assert worse.objective > res.kkt.objective
    assert worse.gap > 1e-3
    bad = relaxed_qp._certificate(prob, x + 0.5, z, np.zeros(0), np.zeros(x.size))
    assert bad.primal_residual >= 0.5 - 1e-9


def test_highs_path_is_kept_for_comparison() -> None:
    """The former HiGHS active-set path still runs on a small case and agrees with Clarabel."""
    rng = np.random.default_rng(5)
    noisy = _noisy(rng, 3, 3.0)
    a = relaxed_counts_qp(SHAPE, noisy, 25)
    b = relaxed_counts_qp(SHAPE, noisy, 25, solver="highs")
    assert b.status == "Optimal" and b.kkt is None
    np.testing.assert_allclose(np.concatenate([r.ravel() for r in a.relaxed]),
                               np.concatenate([r.ravel() for r in b.relaxed]), atol=1e-4)
    with pytest.raises(ValueError, match="unknown QP solver"):
        relaxed_counts_qp(SHAPE, noisy, 25, solver="gurobi")  # type: ignore[arg-type]


def test_structured_tree_solver_is_the_same_relaxation() -> None:
    """solver="tree" (parametric tree responses) reaches the same optimum as the independent SLSQP solve and as
    Clarabel, with a ~0 certified gap; including all-negative columns (clipped at 0) and a larger random tree."""
    rng = np.random.default_rng(21)
    for trial in range(8):
        noisy = _noisy(rng, 4, 5.0)
        if trial % 2:
            noisy = [a - 8.0 for a in noisy]  # many cells want to be negative
        total = int(rng.integers(0, 60))
        res = relaxed_counts_qp(SHAPE, noisy, total, solver="tree")
        prob = counts_problem(SHAPE, noisy, total)
        ref = _scipy_solve(prob)
        x = np.concatenate([r.ravel() for r in res.relaxed])
        assert res.kkt is not None and res.status == "Solved"
        assert res.kkt.objective == pytest.approx(float(((ref - prob.target) ** 2).sum()), rel=1e-7, abs=1e-7)
        np.testing.assert_allclose(x, ref, atol=1e-4)
        assert res.kkt.primal_residual < 1e-9 and res.kkt.dual_infeasibility < 1e-9 and abs(res.kkt.gap) < 1e-7
    big = TreeShape((np.zeros(7, dtype=np.int64), np.sort(np.r_[np.arange(7), rng.integers(0, 7, size=53)])))
    noisy = [rng.normal(2, 6, size=(s, 12)) for s in big.sizes]
    a = relaxed_counts_qp(big, noisy, 400, solver="tree")
    b = relaxed_counts_qp(big, noisy, 400)
    assert a.kkt is not None and b.kkt is not None
    assert a.kkt.objective == pytest.approx(b.kkt.objective, rel=1e-8)
    assert a.kkt.gap < 1e-6 and b.kkt.gap < 1e-4
    with pytest.raises(ValueError, match="M_H-R"):
        relaxed_cumulative_qp(SHAPE, _noisy(rng, 3, 1.0), 10, solver="tree")

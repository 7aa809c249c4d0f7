"""E1-E6: data model, sensitivities, mechanism support, the error formula and the singular value bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from dasflow.strategy import error as err
from dasflow.strategy import workloads as w


def test_e1_fig1_workload_facts():
    W = w.fig1_workload()
    G = W.gram()
    assert np.linalg.matrix_rank(W.matrix()) == 4
    assert err.l2_sensitivity(W.matrix()) == pytest.approx(math.sqrt(5))
    assert np.trace(G) == pytest.approx(36)
    ev = np.sort(np.linalg.eigvalsh(G))[::-1]
    want = [9 + math.sqrt(65), 9 + math.sqrt(17), 9 - math.sqrt(17), 9 - math.sqrt(65), 0, 0, 0, 0]
    assert ev == pytest.approx(want, abs=1e-9)
    assert err.svdb(G) == pytest.approx(14.933, abs=1e-3)


def test_e1_implicit_forms_agree_with_dense():
    assert np.array_equal(w.all_range(12).gram(), w.all_range_matrix(12).gram())
    assert w.all_range(12).rows == w.all_range_matrix(12).rows == 78
    W2 = w.marginals([3, 2, 4], 2)
    assert np.allclose(W2.gram(), W2.matrix().T @ W2.matrix())
    assert W2.rows == W2.matrix().shape[0] == 6 + 12 + 8
    R = w.range_marginals([4, 3], 1)
    assert np.allclose(R.gram(), sum(p.gram() for p in R.parts))
    S = w.sparse_from_dense(w.fig1_workload().matrix())
    assert np.allclose(S.gram(), w.fig1_workload().gram())
    K = w.KronWorkload([w.prefix(3), w.identity(2)])
    assert np.allclose(K.gram(), K.matrix().T @ K.matrix())


def _brute_sens(A, order, neighbours):
    """Max over neighbouring x, x' of ||A x − A x'|| by explicit unit-vector neighbours."""
    n = A.shape[1]
    best = 0.0
    moves = [np.eye(n)[j] for j in range(n)]
    if neighbours == "replace_one":
        moves = [np.eye(n)[j] - np.eye(n)[k] for j in range(n) for k in range(n)]
    for d in moves:
        best = max(best, float(np.linalg.norm(A @ d, ord=order)))
    return best


@pytest.mark.parametrize("neighbours", ["add_remove", "replace_one"])
def test_e2_sensitivity_by_brute_force(neighbours):
    rng = np.random.default_rng(11)
    for _ in range(20):
        A = rng.normal(size=(rng.integers(1, 7), rng.integers(1, 7)))
        assert err.l2_sensitivity(A, neighbours) == pytest.approx(_brute_sens(A, 2, neighbours), rel=1e-9)
        assert err.l1_sensitivity(A, neighbours) == pytest.approx(_brute_sens(A, 1, neighbours), rel=1e-9)
    A = rng.normal(size=(5, 4))
    assert err.l2_sensitivity(sp.csr_array(A)) == pytest.approx(err.l2_sensitivity(A))
    assert err.l1_sensitivity(sp.csr_array(A)) == pytest.approx(err.l1_sensitivity(A))
    # 0/1 marginals: replace-one is sqrt(2) times add/remove
    M = w.marginals([3, 4], 1).parts[0].matrix()
    assert err.l2_sensitivity(M, "replace_one") == pytest.approx(math.sqrt(2) * err.l2_sensitivity(M))


def test_e3_unsupported_strategy_is_rejected():
    G = w.fig1_workload().gram()
    A = np.eye(8)[:6]  # misses cells 7, 8 which the workload reads
    with pytest.raises(ValueError, match="support"):
        err.tse(A, G)
    assert err.supports(G, np.eye(8))
    # a rank-deficient strategy that spans rowspace(W) is accepted (pinv route)
    W = w.fig1_workload().matrix()
    assert err.supports(G, W.T @ W)
    assert err.tse(W, G) == pytest.approx(5 * 4)  # ||W||² · trace(G G⁺) = 5 · rank 4


def test_e4_constants():
    assert err.p_gaussian(0.5, 1e-4) == pytest.approx(2 * math.log(2e4) / 0.25)
    assert err.p_laplace(0.5) == pytest.approx(8.0)
    assert err.p_zcdp(0.25) == pytest.approx(2.0)
    assert err.rms(200.0, 8) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        err.p_gaussian(0, 0.1)


def test_e4_monte_carlo_agrees_with_formula():
    """20,000 Gaussian draws on all 16-cell ranges with the Haar strategy.

    The empirical TSE is a mean of 20,000 i.i.d. terms; we accept within 4 standard errors
    (false-failure rate < 1e-4 for a normal mean; seeded, so deterministic).
    """
    n = 16
    Wm = w.all_range_matrix(n).matrix()
    G = Wm.T @ Wm
    A = w.haar(n)
    P = err.p_zcdp(0.5)
    formula = err.tse(A, G, P)
    sigma = err.l2_sensitivity(A) * math.sqrt(P)
    rng = np.random.default_rng(2024)
    pinv = np.linalg.pinv(A)
    noise = rng.normal(scale=sigma, size=(20000, A.shape[0]))
    diff = noise @ (Wm @ pinv).T  # W x̂ − W x for every draw
    per_draw = np.sum(diff**2, axis=1)
    se = per_draw.std(ddof=1) / math.sqrt(per_draw.size)
    assert abs(per_draw.mean() - formula) <= 4 * se


def test_e5_invariances():
    rng = np.random.default_rng(5)
    G = w.all_range(10).gram()
    A = rng.normal(size=(14, 10))
    base = err.tse(A, G)
    U, _ = np.linalg.qr(rng.normal(size=(14, 14)))
    assert err.tse(3.7 * A, G) == pytest.approx(base, rel=1e-9)
    assert err.tse(A[rng.permutation(14)], G) == pytest.approx(base, rel=1e-9)
    assert err.tse(U @ A, G) == pytest.approx(base, rel=1e-9)  # AᵀA and the column norms are unchanged
    Wm = w.all_range_matrix(10).matrix()
    V, _ = np.linalg.qr(rng.normal(size=(Wm.shape[0], Wm.shape[0])))
    assert err.tse(A, (V @ Wm).T @ (V @ Wm)) == pytest.approx(base, rel=1e-9)


def test_e6_lower_bound_on_random_pairs():
    rng = np.random.default_rng(6)
    for _ in range(1000):
        n = int(rng.integers(2, 7))
        W = rng.normal(size=(int(rng.integers(1, 8)), n))
        A = rng.normal(size=(int(rng.integers(n, n + 5)), n))
        G = W.T @ W
        assert err.tse(A, G) >= err.svdb(G) * (1 - 1e-9)

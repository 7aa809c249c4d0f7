"""The reusable simplex projector: its ``__call__`` is bit-identical to the one-shot projection; its variables-only
Newton form (the FISTA hot path) gives the projection — the KKT point, equal to the sorting method's up to
rounding — over sequences of nearby points like FISTA's iterates, with ties, padded slots, empty rows and rows
with t = 0, and falls back to the sorting method for rows whose active set is still changing."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from dasflow.products.topdown.solvers import SimplexProjector, _counts, _CountSums, weighted_simplex_projection


def _assert_projection(xv: npt.NDArray[np.float64], z: npt.NDArray[np.float64], s: npt.NDArray[np.float64],
                       t: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]) -> None:
    """``xv`` (the variables) is the projection of ``z``: within 1e-12 (relative to the row's scale) of the
    sorting method's, on the simplex, and with the KKT structure (one μ per row: x = z − μ/s where x > 0,
    z − μ/s ≤ 0 where x = 0)."""
    zv = np.where(mask, z, 0.0)
    x1, _ = weighted_simplex_projection(zv, s, t, mask)
    X = np.zeros(mask.shape)
    X[mask] = xv
    scale = 1.0 + np.abs(zv).max() + t.max(initial=0.0)
    assert np.abs(X - x1).max(initial=0.0) <= 1e-12 * scale
    assert (X >= 0).all() and (X[~mask] == 0).all()
    held = mask.any(axis=1)                                   # a row without variables stays 0
    np.testing.assert_allclose(X.sum(axis=1), np.where(held & (t > 0), t, 0.0), rtol=0, atol=1e-12 * scale)
    pos = X > 0
    mu = np.where(pos, (zv - X) * s, -np.inf)               # every positive x of a row gives the same μ …
    row_mu = mu.max(axis=1)
    rows, cols = np.nonzero(pos)
    assert np.all(np.abs(mu[rows, cols] - row_mu[rows]) <= 1e-9 * scale)
    rows, cols = np.nonzero(mask & ~pos & pos.any(axis=1)[:, None])   # … and a zero x sits at or below it
    assert np.all(zv[rows, cols] * s[rows, cols] <= row_mu[rows] + 1e-9 * scale)


@pytest.mark.parametrize("seed", range(6))
def test_projector_matches_the_one_shot_projection(seed: int) -> None:
    g = np.random.default_rng(seed)
    K, C = 300, int(g.integers(1, 9))
    mask = g.random((K, C)) < 0.8
    mask[:5] = False                               # rows with no variable at all
    s = np.where(g.random((K, C)) < 0.3, 2.0, g.integers(1, 5, (K, C)).astype(float))  # repeated weights: ties
    t = g.integers(0, 6, K).astype(float)          # some rows with t = 0
    onto = SimplexProjector(s, t, mask)
    z = np.round(g.normal(1.0, 2.0, (K, C)), 1)    # coarse values: many exact ties in s·z
    for step in range(40):
        x, mu = onto(z)
        x0, mu0 = weighted_simplex_projection(z, s, t, mask)
        assert np.array_equal(x, x0) and np.array_equal(mu, mu0), step
        assert np.array_equal(np.signbit(x), np.signbit(x0))
        # the variables-only form, on the point that is zero off the mask (as the FISTA callers hold it)
        _assert_projection(onto.vars(z[mask]), z, s, t, mask)
        # the next point: mostly small moves (orders kept), sometimes a jump (rows re-sorted), sometimes ties
        z = z + g.normal(0.0, 0.01 if step % 7 else 1.0, z.shape)
        if step % 5 == 0:
            z[: K // 3] = np.round(z[: K // 3], 0)
    assert onto.order is not None


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_rows_still_changing_when_the_newton_steps_run_out_get_the_sorting_methods_projection(
        steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold starts (all variables active) on wide rows need several steps; with 1–3 allowed, most rows are still
    changing and are settled by the sorting method, the others by Newton's method: every row is projected."""
    monkeypatch.setattr(SimplexProjector, "NEWTON_STEPS", steps)
    g = np.random.default_rng(11 + steps)
    K, C = 200, 40
    mask = g.random((K, C)) < 0.9
    s = g.random((K, C)) + 0.5
    t = g.integers(0, 30, K).astype(float)
    for _ in range(3):                              # a fresh projector: the cold start each time
        z = g.normal(0.0, 3.0, (K, C))
        _assert_projection(SimplexProjector(s, t, mask).vars(z[mask]), z, s, t, mask)


def test_newton_restarts_from_the_left_when_the_warm_multiplier_leaves_no_variable_active() -> None:
    """A point far below the previous one: the previous μ leaves every variable inactive (zero slope)."""
    mask = np.ones((2, 3), dtype=bool)
    s = np.array([[1.0, 2.0, 4.0], [1.0, 1.0, 1.0]])
    t = np.array([3.0, 1.0])
    onto = SimplexProjector(s, t, mask)
    z = np.array([[10.0, 11.0, 12.0], [5.0, 5.0, 9.0]])
    _assert_projection(onto.vars(z[mask]), z, s, t, mask)
    z2 = z - 100.0
    _assert_projection(onto.vars(z2[mask]), z2, s, t, mask)


def test_projector_on_a_single_wide_row() -> None:
    g = np.random.default_rng(9)
    C = 2016
    mask = g.random((1, C)) < 0.5
    s = g.random((1, C)) + 0.5
    t = np.array([123.0])
    onto = SimplexProjector(s, t, mask)
    z = g.normal(0.0, 1.0, (1, C))
    for _ in range(10):
        assert all(np.array_equal(a, b) for a, b in zip(onto(z), weighted_simplex_projection(z, s, t, mask),
                                                        strict=True))
        _assert_projection(onto.vars(z[mask]), z, s, t, mask)
        z = z + g.normal(0.0, 0.05, z.shape)


def test_count_sums_match_the_integer_counts() -> None:
    g = np.random.default_rng(3)
    K, C = 500, 7
    z = np.round(g.normal(2.0, 3.0, (K, C)), 2)
    w = g.integers(1, 4, (K, C)).astype(float)
    mask = g.random((K, C)) < 0.7
    sums = _CountSums(z, w, mask)
    for lam in (g.normal(0.0, 5.0, K), np.zeros(K), np.full(K, -40.0), np.round(g.normal(0.0, 3.0, K))):
        assert np.array_equal(sums(lam), _counts(z, w, lam, mask).sum(axis=1).astype(float))

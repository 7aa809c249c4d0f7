"""The reusable simplex projector is bit-identical to the one-shot projection (the seeded TopDown release bytes
depend on it), over sequences of nearby points like FISTA's iterates, with ties, padded slots and empty rows."""

from __future__ import annotations

import numpy as np
import pytest

from dasflow.products.topdown.solvers import SimplexProjector, _counts, _CountSums, weighted_simplex_projection


@pytest.mark.parametrize("seed", range(6))
def test_projector_matches_the_one_shot_projection_bit_for_bit(seed: int) -> None:
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
        zv = np.where(mask, z, 0.0)
        xv = onto.vars(z[mask])
        x1, _ = weighted_simplex_projection(zv, s, t, mask)
        assert np.array_equal(xv, x1[mask]) and np.array_equal(np.signbit(xv), np.signbit(x1[mask])), step
        # the next point: mostly small moves (orders kept), sometimes a jump (rows re-sorted), sometimes ties
        z = z + g.normal(0.0, 0.01 if step % 7 else 1.0, z.shape)
        if step % 5 == 0:
            z[: K // 3] = np.round(z[: K // 3], 0)
    assert onto.order is not None


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

"""Brute-force oracles shared by the group-size tests (small instances only)."""

from __future__ import annotations

import itertools

import numpy as np

from dasflow.postprocess.tree_dp import LevelCost, TreeShape, objective


def all_leaf_assignments(n_cells: int, total_max: int) -> np.ndarray:
    """Every vector in {0..total_max}^n_cells as rows."""
    return np.array(list(itertools.product(range(total_max + 1), repeat=n_cells)), dtype=np.int64)


def levels_from_leaves(shape: TreeShape, leaves: np.ndarray) -> list[np.ndarray]:
    """Per-level arrays (batch, regions, k) from leaf assignments (batch, leaves, k)."""
    out = [leaves]
    for l in range(shape.levels - 1, 0, -1):
        out.insert(0, np.add.reduceat(out[0], shape.child_starts(l - 1), axis=1))
    return out


def brute_tree_optimum(shape: TreeShape, costs: list[LevelCost], total: int | None, cap: int) -> float:
    """min of the Model 1 objective over all integer leaf assignments in [0, cap] (root sum = total if given)."""
    k = next(np.asarray(c.noisy).shape[1] for c in costs if c.noisy is not None)
    n_leaf = shape.sizes[-1]
    combos = all_leaf_assignments(n_leaf * k, cap).reshape(-1, n_leaf, k)
    if total is not None:
        combos = combos[combos.sum(axis=(1, 2)) == total]
    levels = levels_from_leaves(shape, combos)
    best = np.zeros(combos.shape[0])
    for x, c in zip(levels, costs, strict=True):
        if c.noisy is None:
            continue
        d = x - np.asarray(c.noisy, dtype=np.float64)[None]
        best += c.weight * ((d * d) if c.kind == "l2" else np.abs(d)).sum(axis=(1, 2))
    return float(best.min())


def random_shape(rng: np.random.Generator, max_states: int = 2, max_children: int = 2) -> TreeShape:
    ns = int(rng.integers(1, max_states + 1))
    nch = rng.integers(1, max_children + 1, size=ns)
    return TreeShape((np.zeros(ns, dtype=np.int64), np.repeat(np.arange(ns), nch).astype(np.int64)))


__all__ = ["all_leaf_assignments", "brute_tree_optimum", "levels_from_leaves", "objective", "random_shape"]

"""Off-spine entity distance (topdown-spine.md §4.1, Algorithm 1), vectorised over all OSEs at once.

``c[k,l,u]`` is the minimum number of on-spine geounits added/subtracted to build ``k ∩ u``; ``c[k',l,u]`` the
same for the complement of ``k`` within ``u``. Leaves: ``c = 1, c' = 0`` inside k, ``c = 0, c' = 1`` outside.
Parent: ``x = Σ c[k,·]``, ``y = Σ c[k',·]`` over its children; ``c = min(x, y+1)``, ``c' = min(y, x+1)``.
Only units that intersect k are stored (sparse pairs); a unit outside k contributes ``(0, 1)``, which is how
the parent's ``y`` gets ``fanout − #intersecting children`` added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class OsedPairs:
    """Sparse ``(ose, unit) → (c, c')`` at one level, for units intersecting the OSE."""

    ose: IntArray
    unit: IntArray
    c: IntArray
    cc: IntArray


def osed_up(leaf: OsedPairs, parents: Sequence[IntArray], fanouts: Sequence[IntArray]) -> list[OsedPairs]:
    """Run the recursion from a leaf level up through ``parents[i]`` (unit → parent unit, one per step).

    ``fanouts[i][p]`` is the number of children of parent ``p`` at step ``i``. Returns the pairs at every
    level from the leaf (index 0) up to the top (last).
    """
    out = [leaf]
    cur = leaf
    for parent, fanout in zip(parents, fanouts, strict=True):
        pu = parent[cur.unit]
        n_par = int(fanout.shape[0])
        key = cur.ose * n_par + pu
        uniq, inv = np.unique(key, return_inverse=True)
        x = np.bincount(inv, weights=cur.c, minlength=uniq.size).astype(np.int64)
        ysum = np.bincount(inv, weights=cur.cc, minlength=uniq.size).astype(np.int64)
        nint = np.bincount(inv, minlength=uniq.size).astype(np.int64)
        ose = uniq // n_par
        unit = uniq % n_par
        y = ysum + (fanout[unit] - nint)
        cur = OsedPairs(ose=ose, unit=unit, c=np.minimum(x, y + 1), cc=np.minimum(y, x + 1))
        out.append(cur)
    return out


def leaf_pairs(ose_of_leaf: IntArray) -> OsedPairs:
    """Leaf pairs when every leaf belongs to exactly one OSE of a category (``ose_of_leaf[u]``; −1 = none)."""
    unit = np.flatnonzero(ose_of_leaf >= 0).astype(np.int64)
    ones = np.ones(unit.size, dtype=np.int64)
    return OsedPairs(ose=ose_of_leaf[unit].astype(np.int64), unit=unit, c=ones, cc=np.zeros_like(ones))


def osed_root(leaf: OsedPairs, parents: Sequence[IntArray], fanouts: Sequence[IntArray],
              n_ose: int) -> IntArray:
    """OSED of every OSE ``0..n_ose-1`` (an empty OSE has OSED 0)."""
    top = osed_up(leaf, parents, fanouts)[-1]
    res = np.zeros(n_ose, dtype=np.int64)
    res[top.ose] = top.c
    return res


def leximax_le(x: Sequence[int] | IntArray, y: Sequence[int] | IntArray) -> bool:
    """``x ⪯_lex y`` on descending-sorted vectors (§4.3, S9): false iff they differ and, at the first index
    where they differ, ``x_i > y_i``."""
    xs = np.sort(np.asarray(x, dtype=np.int64))[::-1]
    ys = np.sort(np.asarray(y, dtype=np.int64))[::-1]
    if xs.shape != ys.shape:
        raise ValueError("leximax comparison needs vectors of equal length")
    diff = np.flatnonzero(xs != ys)
    if diff.size == 0:
        return True
    return bool(xs[diff[0]] < ys[diff[0]])

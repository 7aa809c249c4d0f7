"""Metrics of the group-size experiment (requirement E1) and the validity checks (V1).

* ``l1_error``: per level, sum over j of |hat_c^r_j - c^r_j|, averaged over the regions of the level (the
  normalisation that fits the magnitudes of the paper's Table 7; the paper's formula is stripped, spec 3.1).
* ``consistency_violations`` (#CV): the number of (non-leaf region r, size j) with hat_c^r_j != sum of the
  children's hat_c^{r'}_j, as in spec 3.1.
* ``validity``: non-negative integers, #CV = 0, every level sums to n.
Runtime is measured around the post-processing call only (``PostResult.seconds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dasflow.postprocess.tree_dp import TreeShape

__all__ = ["Validity", "consistency_violations", "l1_error", "validity"]


def l1_error(released: Sequence[npt.ArrayLike], truth: Sequence[npt.ArrayLike]) -> list[float]:
    """Per level: mean over regions of sum_j |released - truth|."""
    return [
        float(np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum(axis=1).mean())
        for a, b in zip(released, truth, strict=True)
    ]


def consistency_violations(shape: TreeShape, released: Sequence[npt.ArrayLike]) -> int:
    """#CV: non-leaf (r, j) cells whose value differs from the sum of their children."""
    cv = 0
    for l in range(shape.levels - 1):
        kids = np.add.reduceat(np.asarray(released[l + 1]), shape.child_starts(l), axis=0)
        cv += int(np.count_nonzero(np.asarray(released[l]) != kids))
    return cv


@dataclass(frozen=True)
class Validity:
    """V1 checks of a released hierarchy."""

    nonnegative_integers: bool
    violations: int
    level_totals: tuple[int, ...]
    faithful: bool

    @property
    def ok(self) -> bool:
        return self.nonnegative_integers and self.violations == 0 and self.faithful


def validity(shape: TreeShape, released: Sequence[npt.ArrayLike], n: int) -> Validity:
    """Non-negative integers, consistency (#CV) and faithfulness (every level sums to n)."""
    arrs = [np.asarray(a) for a in released]
    ints = all(np.issubdtype(a.dtype, np.integer) and bool(np.all(a >= 0)) for a in arrs)
    totals = tuple(int(a.sum()) for a in arrs)
    return Validity(ints, consistency_violations(shape, arrs), totals, all(t == n for t in totals))

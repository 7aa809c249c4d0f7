"""Array helpers where NumPy's general routine is far from the cost of the operation itself.

:func:`unique` — ``np.unique(values)`` by one sort. NumPy 2.3+ finds the distinct values of a plain
``np.unique`` call with a hash table and then sorts them; when most values are distinct (MAFIDs, block keys,
unit indices) that costs about 1 µs per element, 45–87× one sort of the same 4 M int64 (3.5× on few distinct
values; ``benchmarks/unique.py``, NumPy 2.4.6). The calls that also return indices, an inverse or counts
already sort, and keep ``np.unique``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt


def unique(values: npt.ArrayLike) -> npt.NDArray[Any]:
    """The sorted distinct values of ``values`` (flattened), equal to ``np.unique(values)``: one sort, then
    every value unlike its predecessor. Floating-point and complex arrays (where ``np.unique`` folds NaNs
    together) are handed to ``np.unique``."""
    a = np.asarray(values).ravel()
    if a.dtype.kind in "fc":
        return np.unique(a)
    s = np.sort(a)
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]

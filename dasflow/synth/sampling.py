"""Fast vectorised sampling helpers for the generator (synthetic data, not privacy noise).

Categorical draws use lookup tables: a table of 2**bits entries maps a uniform ``bits``-bit integer to a
category, so each category's probability is represented to within 2**-bits (2**-16 for the small tables,
2**-14 for the per-county race-class tables, 2**-20 for the long-tailed household-size and detailed-code
tables). Uniform bits come straight from the bit generator's raw 64-bit output, four 16-bit or two 32-bit draws
per call.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class Bits:
    """Uniform random integers and floats from one numpy generator."""

    def __init__(self, g: np.random.Generator) -> None:
        self.g = g

    def u16(self, n: int) -> npt.NDArray[np.uint16]:
        raw = self.g.bit_generator.random_raw((n + 3) // 4)
        return np.asarray(raw, dtype=np.uint64).view(np.uint16)[:n]

    def u32(self, n: int) -> npt.NDArray[np.uint32]:
        raw = self.g.bit_generator.random_raw((n + 1) // 2)
        return np.asarray(raw, dtype=np.uint64).view(np.uint32)[:n]

    def unif(self, n: int) -> npt.NDArray[np.float32]:
        return self.g.random(n, dtype=np.float32)

    def bernoulli(self, p: float, n: int) -> npt.NDArray[np.bool_]:
        return self.u16(n) < np.uint16(min(max(round(p * 65536), 0), 65535))


def lookup_table(p: npt.ArrayLike, bits: int = 16) -> npt.NDArray[np.int16]:
    """Inverse-CDF table of ``2**bits`` entries for probabilities ``p`` (normalised here)."""
    q = np.asarray(p, dtype=np.float64)
    size = 1 << bits
    cum = np.cumsum(q / q.sum())
    # entry i covers [i, i+1) / size and takes the category whose CDF interval holds its midpoint
    edges = np.ceil(cum * size - 0.5).astype(np.int64)
    edges[-1] = size
    counts = np.diff(np.concatenate(([0], np.clip(edges, 0, size))))
    return np.repeat(np.arange(q.size, dtype=np.int16), np.maximum(counts, 0))


def lookup_tables(p: npt.NDArray[np.float64], bits: int = 16) -> npt.NDArray[np.int8]:
    """Row-wise ``lookup_table`` of a (rows, k) probability matrix (k <= 127), concatenated: row r occupies
    entries ``r * 2**bits .. (r + 1) * 2**bits - 1``."""
    q = np.asarray(p, dtype=np.float64)
    rows, k = q.shape
    size = 1 << bits
    cum = np.cumsum(q / q.sum(axis=1, keepdims=True), axis=1)
    edges = np.clip(np.ceil(cum * size - 0.5).astype(np.int64), 0, size)
    edges[:, -1] = size
    counts = np.diff(np.concatenate((np.zeros((rows, 1), np.int64), edges), axis=1), axis=1)
    cats = np.tile(np.arange(k, dtype=np.int8), rows)
    return np.repeat(cats, np.maximum(counts, 0).ravel())


def draw(table: npt.NDArray[np.int16], bits: Bits, n: int) -> npt.NDArray[np.int16]:
    """n categories from a ``lookup_table`` (its size fixes the precision)."""
    out: npt.NDArray[np.int16]
    if table.size == 1 << 16:
        out = table[bits.u16(n)]
    else:
        shift = 32 - int(table.size).bit_length() + 1
        out = table[bits.u32(n) >> np.uint32(shift)]
    return out

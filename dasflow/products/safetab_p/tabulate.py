"""The flat map g_i and group-by count, vectorised: persons → sparse (population group, sex, age) counts.

Persons are first counted by (region, race-code combination, sex, age) and by (region, QSPAN code, sex,
age); only
those distinct combinations are flat-mapped to iterations (a combination's iterations do not depend on the
person), so no Python loop ever runs over records. The result for one (region type, iteration level) is a sparse
frame (rows may repeat a key; counts add)

``GROUP`` (region index × n_iterations + iteration index) | ``CELL`` (sex × 116 + age) | ``COUNT``

holding every non-zero count; the public group domain (all regions × all iterations of the level) is implicit.
Stability: one person adds 1 to at most |g_L(person)| ≤ s distinct groups (one region per region type), and
within
a group to exactly one CELL.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.products.safetab_p.iterations import IntArray, LevelIndex, race_iterations
from dasflow.products.safetab_p.records import MAX_AGE, PersonArrays

N_AGES = MAX_AGE + 1
N_CELLS = 2 * N_AGES
SPARSE_COLUMNS = ("GROUP", "CELL", "COUNT")


def count_keys(key: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct keys and their multiplicities (hash-based, O(n))."""
    codes, uniq = pd.factorize(key, sort=False)
    return np.asarray(uniq, dtype=np.int64), np.bincount(codes, minlength=len(uniq)).astype(np.int64)


def _expand(ptr: IntArray, idx: IntArray, owner: IntArray) -> tuple[IntArray, IntArray]:
    start = ptr[owner]
    n = ptr[owner + 1] - start
    rep = np.repeat(np.arange(len(owner)), n)
    offs = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return rep, idx[start[rep] + offs]


class PersonCounts:
    """Persons of one region type counted by (region, combination | QSPAN code, cell); level-independent."""

    def __init__(self, persons: PersonArrays, region_type: str) -> None:
        reg = persons.region[region_type]
        keep = reg >= 0
        r = reg[keep].astype(np.int64)
        cell = persons.sex[keep].astype(np.int64) * N_AGES + persons.age[keep]
        n_combo = max(len(persons.combo_codes), 1)
        k1, self.race_count = count_keys((r * n_combo + persons.combo[keep]) * N_CELLS + cell)
        self.race_cell = k1 % N_CELLS
        self.race_region = k1 // N_CELLS // n_combo
        self.race_combo = k1 // N_CELLS % n_combo
        eth = persons.eth[keep]
        k2, self.eth_count = count_keys((r * 10000 + eth) * N_CELLS + cell)
        self.eth_cell = k2 % N_CELLS
        self.eth_region = k2 // N_CELLS // 10000
        self.eth_code = k2 // N_CELLS % 10000
        self.combo_codes = persons.combo_codes


def tabulate_level(counts: PersonCounts, level: LevelIndex) -> pd.DataFrame:
    """Sparse (GROUP, CELL, COUNT) of one (region type, iteration level): the flat map, then the count.

    Rows are not merged: a (GROUP, CELL) may appear in several rows (different race-code combinations reaching
    the same iteration) and its count is the sum of its rows; every consumer sums (``group_totals``,
    ``binned_cells``), so merging would only cost a hash over all rows.
    """
    n_it = level.n_iterations
    c_ptr, c_idx = race_iterations(level, counts.combo_codes)
    rep, it = _expand(c_ptr, c_idx, counts.race_combo)
    rep2, it2 = _expand(level.eth_ptr, level.eth_idx, counts.eth_code)
    return pd.DataFrame({
        "GROUP": np.concatenate([counts.race_region[rep] * n_it + it, counts.eth_region[rep2] * n_it + it2]),
        "CELL": np.concatenate([counts.race_cell[rep], counts.eth_cell[rep2]]).astype(np.int16),
        "COUNT": np.concatenate([counts.race_count[rep], counts.eth_count[rep2]]),
    })


def merged(sparse: pd.DataFrame) -> pd.DataFrame:
    """One row per (GROUP, CELL) with its total count (for inspection and tests)."""
    out = sparse.groupby(["GROUP", "CELL"], sort=True)["COUNT"].sum().reset_index()
    return out


def group_totals(sparse: pd.DataFrame, n_groups: int) -> IntArray:
    """True total per group over the whole public group domain (zeros included)."""
    tot = np.bincount(sparse["GROUP"].to_numpy(), weights=sparse["COUNT"].to_numpy(), minlength=n_groups)
    return tot.astype(np.int64)


def binned_cells(sparse: pd.DataFrame, groups: IntArray, bins: npt.NDArray[np.int64]) -> IntArray:
    """True Sex × AgeK counts of the given (sorted) groups: shape (len(groups), 2, len(bins)+1), empty
    cells 0."""
    nb = len(bins) + 1
    g = sparse["GROUP"].to_numpy()
    pos = np.searchsorted(groups, g)
    pos_c = np.minimum(pos, max(len(groups) - 1, 0))
    hit = (len(groups) > 0) & (groups[pos_c] == g) if len(groups) else np.zeros(len(g), bool)
    cell = sparse["CELL"].to_numpy()[hit].astype(np.int64)
    sex, age = cell // N_AGES, cell % N_AGES
    flat = (pos[hit] * 2 + sex) * nb + np.digitize(age, bins)
    out = np.bincount(flat, weights=sparse["COUNT"].to_numpy()[hit], minlength=len(groups) * 2 * nb)
    return out.astype(np.int64).reshape(len(groups), 2, nb)

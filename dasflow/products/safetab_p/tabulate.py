"""The flat map g_i and group-by count, vectorised: persons → sparse (population group, sex, age bin) counts.

Persons are first counted by (region, race-code combination, cell) and by (region, QSPAN code, cell); only
those distinct combinations are flat-mapped to iterations (a combination's iterations do not depend on the
person), so no Python loop ever runs over records. A CELL is sex × AGE23 bin (``sex · 23 + bin``): the AGE23
edges contain every AGE4 and AGE9 edge, so every stage-2 query (Sex × AGE4/AGE9/AGE23) is a sum of these cells,
and counting the 46 cells instead of the 232 (sex, single year of age) pairs is exact and ~5× more compact.

The result for one (region type, iteration level) is a sparse frame (rows may repeat a key; counts add)

``GROUP`` (region index × n_iterations + iteration index) | ``CELL`` (sex × 23 + AGE23 bin) | ``COUNT``

holding every non-zero count; the public group domain (all regions × all iterations of the level) is implicit.
Stability: one person adds 1 to at most |g_L(person)| ≤ s distinct groups (one region per region type), and
within a group to exactly one CELL.

Partitioned input (:meth:`PersonCounts.merge`): counts of disjoint person sets add, so per-partition counts
(e.g. one state's persons at a time) are summed per (region, combination, cell) BEFORE any flat map or noise;
the merged counts equal the counts of all persons together, whatever the partition.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.products.safetab_p.iterations import IntArray, LevelIndex, race_iterations
from dasflow.products.safetab_p.plan import AGE_BINS
from dasflow.products.safetab_p.records import MAX_AGE, PersonArrays

CELL_BINS = np.array(AGE_BINS[3], dtype=np.int64)  # AGE23 edges
N_AGE_CELLS = len(CELL_BINS) + 1
N_CELLS = 2 * N_AGE_CELLS
SPARSE_COLUMNS = ("GROUP", "CELL", "COUNT")
ETH_CODES = 10_000  # QSPAN code indices are < 10,000 (codes are distinct 4-digit numbers)
_CELL_STARTS = np.concatenate([[0], CELL_BINS])
for _k, _bins in AGE_BINS.items():  # every stage-2 age bin must be a union of AGE23 cells
    if not set(_bins) <= set(AGE_BINS[3]):
        raise AssertionError(f"AGE_BINS[{_k}] edges are not AGE23 edges")


_AGE_CELL = np.digitize(np.arange(MAX_AGE + 1), CELL_BINS).astype(np.int64)  # age → AGE23 bin, as a table


def person_cells(persons: PersonArrays) -> IntArray:
    """Each person's CELL (sex × AGE23 bin)."""
    return persons.sex.astype(np.int64) * N_AGE_CELLS + _AGE_CELL[persons.age]


def count_keys(key: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct keys (sorted) and their multiplicities."""
    uniq, counts = np.unique(key, return_counts=True)
    return uniq.astype(np.int64), counts.astype(np.int64)


def _sum_by_key(key: IntArray, count: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct keys (sorted) and the sum of their counts (exact integers). The inputs are concatenations of
    sorted runs, which the stable sort (timsort) merges in O(n log runs)."""
    if len(key) == 0:
        return key.astype(np.int64), count.astype(np.int64)
    bits = max(int(count.max()).bit_length(), 1)
    if int(key.min()) >= 0 and int(key.max()) < (1 << (62 - bits)) and int(count.min()) >= 0:
        packed = (key << bits) | count  # one plain sort carries the counts along (no argsort + gathers)
        packed.sort()
        ks, cs = packed >> bits, packed & ((1 << bits) - 1)
    else:
        order = np.argsort(key, kind="stable")
        ks, cs = key[order], count[order]
    starts = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
    return ks[starts].astype(np.int64), np.add.reduceat(cs, starts).astype(np.int64)


def _unique_rows(rows: IntArray) -> tuple[IntArray, IntArray]:
    """Distinct rows of a combination table (code indices < 2047, −1 padding) and each row's distinct id:
    rows packed into two int64 words (11 bits per code) and lexsorted."""
    k = rows.shape[1]
    enc = np.where(rows < 0, 2047, rows).astype(np.int64)
    hi = np.zeros(len(rows), dtype=np.int64)
    lo = np.zeros(len(rows), dtype=np.int64)
    for j in range(k):  # over the ≤ 8 code columns, not records
        if j < 5:
            hi = (hi << 11) | enc[:, j]
        else:
            lo = (lo << 11) | enc[:, j]
    order = np.lexsort((lo, hi))
    hs, ls = hi[order], lo[order]
    new = np.concatenate([[True], (hs[1:] != hs[:-1]) | (ls[1:] != ls[:-1])]) if len(rows) else np.zeros(0, bool)
    inv = np.empty(len(rows), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return rows[order][new], inv


def _expand(ptr: IntArray, idx: IntArray, owner: IntArray) -> tuple[IntArray, IntArray]:
    start = ptr[owner]
    n = ptr[owner + 1] - start
    rep = np.repeat(np.arange(len(owner)), n)
    offs = np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)
    return rep, idx[start[rep] + offs]


class PersonCounts:
    """Persons of one region type counted by (region, combination | QSPAN code, cell); level-independent.

    Stored as sorted packed keys ``(region · n_combo + combo) · N_CELLS + cell`` (race) and
    ``(region · 10000 + code) · N_CELLS + cell`` (ethnicity) with their counts; ``combo_codes`` is the
    combination table (row = sorted code indices, −1 padded)."""

    race_key: IntArray
    race_count: IntArray
    eth_key: IntArray
    eth_count: IntArray
    combo_codes: IntArray

    def __init__(self, persons: PersonArrays, region_type: str,
                 _shared: tuple[IntArray, IntArray] | None = None) -> None:
        self.combo_codes = persons.combo_codes
        n_combo = self.n_combo
        if _shared is None:
            cell = person_cells(persons)
            _shared = persons.combo * N_CELLS + cell, persons.eth * N_CELLS + cell
        race_part, eth_part = _shared  # (combo | code) · N_CELLS + cell: region-independent
        reg = persons.region[region_type]
        keep = np.flatnonzero(reg >= 0) if (reg < 0).any() else None
        r = reg.astype(np.int64) if keep is None else reg[keep].astype(np.int64)
        if keep is not None:
            race_part, eth_part = race_part[keep], eth_part[keep]
        self.race_key, self.race_count = count_keys(r * (n_combo * N_CELLS) + race_part)
        self.eth_key, self.eth_count = count_keys(r * (ETH_CODES * N_CELLS) + eth_part)

    @classmethod
    def per_region_type(cls, persons: PersonArrays, region_types: Sequence[str]) -> dict[str, PersonCounts]:
        """Counts for several region types, the region-independent part of the keys computed once."""
        cell = person_cells(persons)
        shared = persons.combo * N_CELLS + cell, persons.eth * N_CELLS + cell
        return {rt: cls(persons, rt, shared) for rt in region_types}

    @property
    def n_combo(self) -> int:
        return max(len(self.combo_codes), 1)

    @property
    def race_cell(self) -> IntArray:
        return self.race_key % N_CELLS

    @property
    def race_region(self) -> IntArray:
        return self.race_key // N_CELLS // self.n_combo

    @property
    def race_combo(self) -> IntArray:
        return self.race_key // N_CELLS % self.n_combo

    @property
    def eth_cell(self) -> IntArray:
        return self.eth_key % N_CELLS

    @property
    def eth_region(self) -> IntArray:
        return self.eth_key // N_CELLS // ETH_CODES

    @property
    def eth_code(self) -> IntArray:
        return self.eth_key // N_CELLS % ETH_CODES

    @property
    def rows(self) -> int:
        """Stored (key, count) rows (memory: 16 bytes each)."""
        return len(self.race_key) + len(self.eth_key)

    @staticmethod
    def unify_combos(parts: Sequence[PersonCounts]) -> tuple[IntArray, IntArray]:
        """(distinct combination rows, id of each row of the parts' concatenated tables) — the same for every
        region type counted from the same slices, so :meth:`merge` can take it precomputed."""
        return _unique_rows(np.concatenate([p.combo_codes for p in parts]).astype(np.int64))

    @classmethod
    def merge(cls, parts: Sequence[PersonCounts],
              combos: tuple[IntArray, IntArray] | None = None) -> PersonCounts:
        """The counts of the union of disjoint person sets: combination tables unified (distinct rows), then
        counts summed per (region, combination | code, cell). Exact integer sums, before any noise."""
        if not parts:
            raise ValueError("nothing to merge")
        if len(parts) == 1:
            return parts[0]
        table, inv = combos if combos is not None else cls.unify_combos(parts)
        out = cls.__new__(cls)
        out.combo_codes = table
        n_new = out.n_combo
        keys, offset = [], 0
        for p in parts:  # over partitions (e.g. states), not records
            remap = inv[offset:offset + len(p.combo_codes)]
            offset += len(p.combo_codes)
            combo = remap[p.race_combo] if len(p.combo_codes) else p.race_combo
            keys.append((p.race_region * n_new + combo) * N_CELLS + p.race_cell)
        out.race_key, out.race_count = _sum_by_key(np.concatenate(keys), np.concatenate([p.race_count for p in parts]))
        out.eth_key, out.eth_count = _sum_by_key(np.concatenate([p.eth_key for p in parts]),
                                                 np.concatenate([p.eth_count for p in parts]))
        return out


def tabulate_level(counts: PersonCounts, level: LevelIndex) -> pd.DataFrame:
    """Sparse (GROUP, CELL, COUNT) of one (region type, iteration level): the flat map, then the count.

    Rows are not merged: a (GROUP, CELL) may appear in several rows (different race-code combinations reaching
    the same iteration) and its count is the sum of its rows; every consumer sums (``group_totals``,
    ``binned_cells``), so merging would only cost a hash over all rows.
    """
    n_it = level.n_iterations
    c_ptr, c_idx = race_iterations(level, counts.combo_codes)
    rkey, ekey = counts.race_key, counts.eth_key
    rep, it = _expand(c_ptr, c_idx, rkey // N_CELLS % counts.n_combo)
    rep2, it2 = _expand(level.eth_ptr, level.eth_idx, ekey // N_CELLS % ETH_CODES)
    return pd.DataFrame({
        "GROUP": np.concatenate([rkey[rep] // N_CELLS // counts.n_combo * n_it + it,
                                 ekey[rep2] // N_CELLS // ETH_CODES * n_it + it2]),
        "CELL": np.concatenate([rkey[rep] % N_CELLS, ekey[rep2] % N_CELLS]).astype(np.int16),
        "COUNT": np.concatenate([counts.race_count[rep], counts.eth_count[rep2]]),
    })


def tabulate_cells(counts: PersonCounts, level: LevelIndex) -> pd.DataFrame:
    """The tabulation stage 1 and stage 2 read for one (region type, iteration level): one row per non-zero
    (GROUP, CELL) with its exact count, sorted by (GROUP, CELL) — :func:`tabulate_level` with repeated keys summed.

    Every stage-2 candidate detail (total, Sex × AGE4/AGE9/AGE23) of a group is a sum of its 46 cells, so this
    is all ``measure`` needs, and it is additive: the tabulation of disjoint person sets (e.g. states) is the
    row-wise sum (:func:`sum_cells`) of theirs, whatever regions span them (USA, AIANNH areas)."""
    return _cells_frame(tabulate_level(counts, level))


def _cells_frame(sparse: pd.DataFrame) -> pd.DataFrame:
    key = sparse["GROUP"].to_numpy(np.int64) * N_CELLS + sparse["CELL"].to_numpy(np.int64)
    ks, cs = _sum_by_key(key, sparse["COUNT"].to_numpy(np.int64))
    return pd.DataFrame({"GROUP": ks // N_CELLS, "CELL": (ks % N_CELLS).astype(np.int16), "COUNT": cs})


def sum_cells(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The tabulation of the union of disjoint person sets from theirs (:func:`tabulate_cells` frames): counts
    of equal (GROUP, CELL) added, exact int64; equal to :func:`tabulate_cells` on all the persons at once."""
    return _cells_frame(pd.concat([p[list(SPARSE_COLUMNS)] for p in parts], ignore_index=True))


def merged(sparse: pd.DataFrame) -> pd.DataFrame:
    """One row per (GROUP, CELL) with its total count (for inspection and tests)."""
    out = sparse.groupby(["GROUP", "CELL"], sort=True)["COUNT"].sum().reset_index()
    return out


def group_totals(sparse: pd.DataFrame, n_groups: int) -> IntArray:
    """True total per group over the whole public group domain (zeros included)."""
    tot = np.bincount(sparse["GROUP"].to_numpy(), weights=sparse["COUNT"].to_numpy(), minlength=n_groups)
    return tot.astype(np.int64)


def binned_cells(sparse: pd.DataFrame, groups: IntArray, bins: npt.NDArray[np.int64]) -> IntArray:
    """True Sex × Age counts of the given (sorted) groups for age ``bins`` (a subset of the AGE23 edges):
    shape (len(groups), 2, len(bins)+1), empty cells 0."""
    nb = len(bins) + 1
    g = sparse["GROUP"].to_numpy()
    pos = np.searchsorted(groups, g)
    pos_c = np.minimum(pos, max(len(groups) - 1, 0))
    hit = (len(groups) > 0) & (groups[pos_c] == g) if len(groups) else np.zeros(len(g), bool)
    cell = sparse["CELL"].to_numpy()[hit].astype(np.int64)
    sex, age_cell = cell // N_AGE_CELLS, cell % N_AGE_CELLS
    flat = (pos[hit] * 2 + sex) * nb + np.digitize(_CELL_STARTS, bins)[age_cell]
    out = np.bincount(flat, weights=sparse["COUNT"].to_numpy()[hit], minlength=len(groups) * 2 * nb)
    return out.astype(np.int64).reshape(len(groups), 2, nb)

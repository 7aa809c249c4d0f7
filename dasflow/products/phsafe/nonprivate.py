"""The Census's non-private PHSafe tables (``dasflow phsafe non-private``), in the format its production
program writes them (DAS_2020_SDHC PHSafe 3.0, non-private mode; facts restated, no code taken).

Unlike the private layout (leaf cells of the measured levels, zeros included), the Census non-private program:

- tabulates every table at USA and STATE for all ten iteration codes (``*``, A–G, H, I) whatever the budgets
  (the config only gives ``state_filter``); Puerto Rico runs (``["72"]``) still get a USA row set;
- gives each record its leaf cell AND the cells above it (e.g. PH2 cell 9 → 9, 8, 1; PH7 → leaf, 1), so the
  total and marginal cells are published, counted directly from the records (a marginal is not a sum of
  leaves: a married household with CPLT ∉ {1, 2} is in PH2 cells 2 and 1 only);
- writes one row per non-empty (region, iteration, cell) group — no zero-count rows (except a PH8_num group
  whose households all have FINAL_POP 0: the group exists, its sum is 0);
- copies the household count into all three PH1_denom / PH5_denom cells;
- PH8_num sums the households' ``FINAL_POP`` (it does not count attached person records).

Universes (the Census joins, no truncation): persons ⋈ units ⋈ geo on MAFID (inner, duplicates kept), geo
restricted to ``state_filter`` and to housing-unit rows (geo RTYPE ∉ {4, 5}); each table's own record filter
(below) — e.g. PH4 only filters on HHT and RELSHIP. Householder tables take the iteration from the unit's HHRACE
and HHSPAN, PH3 from the person's CENRACE and CENHISP: A–F = race code 01–06 alone, G = any other code,
H = Hispanic (2), I = White alone (01) and not Hispanic (1), ``*`` = every record. One documented divergence:
the production PH3 code compares CENHISP with the race code "01" and CENRACE with the ethnicity 1, which no
valid record satisfies, so it never writes PH3 iteration I; dasflow applies the stated definition of I (as its
private path and the published tables do).

These are exact confidential tabulations (ground truth for accuracy work), never a release. Vectorised: one
sort-based many-to-many join, then one ``np.bincount`` per (iteration, cell slot) — no loop over records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.outputs import columns
from dasflow.products.phsafe.tables import OUTPUT_TABLES, data_cell_column

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
Columns = Mapping[str, np.ndarray]

#: iteration codes in column order of the membership matrix
ITERATION_CODES: tuple[str, ...] = ("*", "A", "B", "C", "D", "E", "F", "G", "H", "I")
N_CELLS = 22  # data cells are 1..21
FAMILY_RELSHIP = (20, 21, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33)  # householder, spouse, relatives
OWN_CHILD = (25, 26, 27)


def inner_join(left: IntArray, right: IntArray) -> tuple[IntArray, IntArray]:
    """Index pairs (i, j) with ``left[i] == right[j]`` — a relational inner join, duplicates on both sides
    kept (every matching pair), ordered by i then by j's position in a stable sort of ``right``."""
    order = np.argsort(right, kind="stable")
    srt = right[order]
    lo = np.searchsorted(srt, left, side="left")
    n = np.searchsorted(srt, left, side="right") - lo
    li = np.repeat(np.arange(len(left), dtype=np.int64), n)
    offs = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
    return li, order[np.repeat(lo, n) + offs].astype(np.int64)


def iterations(race: np.ndarray, hisp: np.ndarray) -> BoolArray:
    """(n, 10) membership in ``ITERATION_CODES``: ``*`` always; exactly one of A–G; H; I."""
    race = race.astype(np.int64)
    hisp = hisp.astype(np.int64)
    out = np.zeros((len(race), len(ITERATION_CODES)), dtype=bool)
    out[:, 0] = True
    alone = (race >= 1) & (race <= 6)
    out[np.arange(len(race)), np.where(alone, race, 7)] = True
    out[:, 8] = hisp == 2
    out[:, 9] = (race == 1) & (hisp == 1)
    return out


def _cells(n: int, rules: Sequence[tuple[BoolArray, tuple[int, ...]]],
           default: tuple[int, ...] = ()) -> IntArray:
    """(n, 3) cell lists (−1 = none): the FIRST rule whose condition holds gives the record's cells."""
    out = np.full((n, 3), -1, dtype=np.int64)
    out[:, : len(default)] = default
    for cond, cells in reversed(rules):  # later assignments win, so apply the first rule last
        row = np.full(3, -1, dtype=np.int64)
        row[: len(cells)] = cells
        out[cond] = row
    return out


def _age_leaf(age: np.ndarray) -> IntArray:
    """PH6 age bin within a family type: <4, 4–5, 6–11, 12+ → 0..3."""
    return np.digitize(age.astype(np.int64), [4, 6, 12]).astype(np.int64)


class _Universe:
    """The joined records: unit⋈geo rows (``u``, ``state``) and person⋈unit⋈geo rows (``p``, ``pu``,
    ``pstate``), all as index arrays into the input columns."""

    def __init__(self, persons: Columns, units: Columns, geo: Columns, state_filter: tuple[str, ...]) -> None:
        states = np.array(sorted(int(s) for s in state_filter), dtype=np.int64)
        g_state = np.asarray(geo["TABBLKST"]).astype(np.int64)
        keep = np.isin(g_state, states) & ~np.isin(np.asarray(geo["RTYPE"]), (4, 5))
        g_rows = np.flatnonzero(keep)
        self.state_codes = states
        ui, gi = inner_join(np.asarray(units["MAFID"]).astype(np.int64),
                            np.asarray(geo["MAFID"])[g_rows].astype(np.int64))
        self.u = ui
        self.state = np.searchsorted(states, g_state[g_rows[gi]]).astype(np.int64)
        pi, k = inner_join(np.asarray(persons["MAFID"]).astype(np.int64),
                           np.asarray(units["MAFID"])[ui].astype(np.int64))
        self.p = pi
        self.pu = ui[k]
        self.pstate = self.state[k]


def _tabulate(state: IntArray, member: BoolArray, cells: IntArray, n_states: int,
              weight: np.ndarray | None = None) -> tuple[IntArray, npt.NDArray[np.float64]]:
    """Record counts and weight sums per (state, iteration, cell): shape (n_states, n_iter, N_CELLS)."""
    n_it = member.shape[1]
    size = n_states * n_it * N_CELLS
    count = np.zeros(size, dtype=np.int64)
    total = np.zeros(size, dtype=np.float64)
    for k in range(n_it):  # over the ≤ 10 iteration codes and 3 cell slots, not records
        for j in range(cells.shape[1]):
            m = member[:, k] & (cells[:, j] >= 0)
            key = (state[m] * n_it + k) * N_CELLS + cells[m, j]
            count += np.bincount(key, minlength=size)
            if weight is not None:
                total += np.bincount(key, weights=np.asarray(weight)[m].astype(np.float64), minlength=size)
    shape = (n_states, n_it, N_CELLS)
    return count.reshape(shape), total.reshape(shape)


def _frame(table: str, count: IntArray, total: npt.NDArray[np.float64], state_codes: IntArray,
           summed: bool) -> pd.DataFrame:
    """Rows of the non-empty groups at STATE and USA, Census column layout, sorted as strings by every
    column but COUNT (the order the Census end-to-end cases are compared in)."""
    value = total if summed else count
    parts = []
    for region_type, c, v, ids in (("STATE", count, value, [f"{s:02d}" for s in state_codes]),
                                   ("USA", count.sum(axis=0)[None], value.sum(axis=0)[None], ["1"])):
        s, k, cell = np.nonzero(c > 0)
        parts.append(pd.DataFrame({
            "REGION_ID": np.asarray(ids, dtype=object)[s] if len(ids) else np.zeros(0, dtype=object),
            "REGION_TYPE": region_type,
            "ITERATION_CODE": np.asarray(ITERATION_CODES, dtype=object)[k],
            data_cell_column(table): cell.astype(np.int64),
            "COUNT": np.rint(v[s, k, cell]).astype(np.int64),
        }))
    out = pd.concat(parts, ignore_index=True)
    cols = columns(table, private=False)
    out = out[cols]
    keys = [c for c in cols if c != "COUNT"]
    order = np.lexsort([out[c].astype(str).to_numpy() for c in reversed(keys)])
    return out.iloc[order].reset_index(drop=True)


def census_non_private(persons: Columns, units: Columns, geo: Columns,
                       config: PHSafeConfig) -> dict[str, pd.DataFrame]:
    """The eleven non-private tables of the Census program (see the module docstring), by output name."""
    uni = _Universe(persons, units, geo, config.state_filter)
    n_states = len(uni.state_codes)
    U = {c: np.asarray(v).astype(np.int64) for c, v in units.items()}
    P = {c: np.asarray(v).astype(np.int64) for c, v in persons.items()}
    # unit⋈geo rows and person⋈unit⋈geo rows, attribute views
    hu = {c: v[uni.u] for c, v in U.items()}
    pu = {c: v[uni.pu] for c, v in U.items()}
    pp = {c: v[uni.p] for c, v in P.items()}
    out: dict[str, pd.DataFrame] = {}

    def add(table: str, rows: BoolArray, state: IntArray, member: BoolArray | None, cells: IntArray,
            weight: np.ndarray | None = None) -> None:
        """member None: PH2 / PH6 (no iteration column; '*' only)."""
        mem = np.ones((int(rows.sum()), 1), dtype=bool) if member is None else member[rows]
        c, t = _tabulate(state[rows], mem, cells[rows], n_states, None if weight is None else weight[rows])
        if member is None:
            pad = ((0, 0), (0, len(ITERATION_CODES) - 1), (0, 0))
            c, t = np.pad(c, pad), np.pad(t, pad)
        out[table] = _frame(table, c, t, uni.state_codes, weight is not None)

    n_u, n_p = len(uni.u), len(uni.p)
    hh_it_u = iterations(hu["HHRACE"], hu["HHSPAN"])
    hh_it_p = iterations(pu["HHRACE"], pu["HHSPAN"])
    age = pp["QAGE"]
    under18 = age < 18
    age_cells = _cells(n_p, [(under18, (2, 1))], (3, 1))

    occupied_u = (hu["RTYPE"] == 2) & (hu["HHT"] != 0)
    add("PH1_num", (pu["RTYPE"] == 2) & (pu["HHT"] != 0), uni.pstate, hh_it_p, age_cells)
    add("PH1_denom", occupied_u, uni.state, hh_it_u, _cells(n_u, [], (1, 2, 3)))

    in_hu = pp["RTYPE"] == 3
    hht2, cplt = pu["HHT2"], pu["CPLT"]
    married, cohab = np.isin(hht2, (1, 2)), np.isin(hht2, (3, 4))
    add("PH2", in_hu, uni.pstate, None, _cells(n_p, [
        (married & (cplt == 1), (3, 2, 1)), (married & (cplt == 2), (4, 2, 1)), (married, (2, 1)),
        (cohab & (cplt == 3), (6, 5, 1)), (cohab & (cplt == 4), (7, 5, 1)), (cohab, (5, 1)),
        (hht2 == 9, (9, 8, 1)), (np.isin(hht2, (10, 11, 12)), (10, 8, 1)),
        (hht2 == 5, (12, 11, 1)), (np.isin(hht2, (6, 7, 8)), (13, 11, 1))], (1,)))

    rel = pp["RELSHIP"]
    child = np.isin(rel, OWN_CHILD)
    add("PH3", in_hu & under18, uni.pstate, iterations(pp["CENRACE"], pp["CENHISP"]), _cells(n_p, [
        (np.isin(rel, (20, 21, 22, 23, 24, 34, 35, 36)), (2, 1)),
        (child & (hht2 == 1), (4, 3, 1)), (child & (hht2 == 3), (5, 3, 1)),
        (child & (hht2 == 10), (6, 3, 1)), (child & (hht2 == 6), (7, 3, 1)), (child, (3, 1)),
        (rel == 30, (9, 8, 1)), (np.isin(rel, (28, 29, 31, 32, 33)), (10, 8, 1))], (1,)))

    family_p = np.isin(pu["HHT"], (1, 2, 3)) & np.isin(rel, FAMILY_RELSHIP)
    add("PH4", family_p, uni.pstate, hh_it_p, age_cells)
    add("PH5_num", family_p, uni.pstate, hh_it_p, age_cells)
    add("PH5_denom", np.isin(hu["HHT"], (1, 2, 3)), uni.state, hh_it_u, _cells(n_u, [], (1, 2, 3)))

    leaf = _age_leaf(age)
    ph6 = _cells(n_p, [], (1,))
    for code, mid in ((1, 2), (3, 7), (10, 12), (6, 17)):  # over the four family types, not records
        m = hht2 == code
        ph6[m] = np.stack([mid + 1 + leaf[m], np.full(int(m.sum()), mid), np.ones(int(m.sum()), np.int64)],
                          axis=1)
    add("PH6", child & under18, uni.pstate, None, ph6)

    ten_p = pu["TEN"]
    add("PH7", in_hu, uni.pstate, hh_it_p, _cells(n_p, [
        (ten_p == 1, (2, 1)), (ten_p == 2, (3, 1)), (np.isin(ten_p, (3, 4)), (4, 1))]))
    ten_u = hu["TEN"]
    ph8 = _cells(n_u, [(np.isin(ten_u, (1, 2)), (2, 1)), (np.isin(ten_u, (3, 4)), (3, 1))])
    add("PH8_num", occupied_u, uni.state, hh_it_u, ph8, hu["FINAL_POP"])
    add("PH8_denom", occupied_u, uni.state, hh_it_u, ph8)
    return {t: out[t] for t in OUTPUT_TABLES}

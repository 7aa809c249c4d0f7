"""Preprocessing: universes, the public geography join, iteration maps and cell maps (phsafe.md §1–§2; R4–R6).

All maps are vectorised over integer columns. Filters are 1-stable; the maps to (population group, basis cell)
are functions of one record, so each record lands in at most one (group, cell) per level (1-stable maps).

Universes (R4): persons in housing units (RTYPE 3, RELSHIP not 37/38) and occupied housing units (RTYPE 2,
HHT ≠ 0) whose MAFID has exactly one public geo row with TABBLKST in ``state_filter``. A person whose unit is
not an occupied housing unit simply finds no partner in the join (a structural zero, not an error).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

Columns = Mapping[str, np.ndarray]

# --- iteration maps (R5)
# -------------------------------------------------------------------------------------


def iteration_ag(race: np.ndarray) -> np.ndarray:
    """A–G index 0..6 from CENRACE/HHRACE 1..63 (01–06 alone, 07–63 two or more races); -1 for 00 (NIU)."""
    r = race.astype(np.int16)
    return np.where(r >= 1, np.minimum(r, 7) - 1, -1).astype(np.int8)


def iteration_hi(race: np.ndarray, hisp: np.ndarray) -> np.ndarray:
    """H–I index: 0 = H (Hispanic), 1 = I (White alone, not Hispanic), -1 = neither (level not exhaustive)."""
    return np.where(hisp == 2, 0, np.where((race == 1) & (hisp == 1), 1, -1)).astype(np.int8)


# --- universes
# -----------------------------------------------------------------------------------------------


def person_universe(p: Columns) -> np.ndarray:
    """Persons in housing units: RTYPE 3 and not a GQ relationship (37/38)."""
    return np.asarray((p["RTYPE"] == 3) & (p["RELSHIP"] < 37))


def occupied_units(u: Columns) -> np.ndarray:
    """Occupied housing units: RTYPE 2 and HHT ≠ 0 (vacant and GQ units are excluded)."""
    return np.asarray((u["RTYPE"] == 2) & (u["HHT"] != 0))


def geo_state_index(geo: Columns, state_filter: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The PUBLIC map MAFID -> state index (position in sorted ``state_filter``).

    Keeps geo rows of housing units (RTYPE not 4/5) in ``state_filter``; a MAFID with more than one such row is
    dropped (the map must be a function). Returns (sorted MAFIDs, state index).
    """
    states = np.array(sorted(int(s) for s in state_filter), dtype=np.int64)
    code = np.asarray(geo["TABBLKST"])
    rtype = np.asarray(geo["RTYPE"])
    if code.size and int(code.min()) >= 0 and int(code.max()) < 100:  # 2-digit codes: a lookup table
        lut = np.full(100, -1, dtype=np.int16)
        lut[states[(states >= 0) & (states < 100)]] = np.flatnonzero((states >= 0) & (states < 100))
        index = lut[code]
    else:
        index = np.where(np.isin(code, states), np.searchsorted(states, code.astype(np.int64)), -1)
    keep = (rtype != 4) & (rtype != 5) & (index >= 0)
    m = geo["MAFID"][keep]
    st = index[keep]
    if m.size > 1 and bool(np.any(m[1:] < m[:-1])):
        srt = np.argsort(m, kind="stable")
        m, st = m[srt], st[srt]
    eq = m[1:] == m[:-1]  # m is sorted: a MAFID is single iff it differs from both neighbours
    if not bool(eq.any()):
        return m, st.astype(np.int16)
    single = np.ones(m.size, dtype=bool)
    single[1:] &= ~eq
    single[:-1] &= ~eq
    return m[single], st[single].astype(np.int16)


def lookup_sorted(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Position (int32) of each query in ``keys`` (sorted, unique integers, fewer than 2**31), -1 when absent.

    Keys are split into runs of consecutive integers (MAFIDs come in long consecutive blocks); a query is
    binary-searched among the few run starts and placed by its offset in the run. With many short runs it is
    a plain binary search over the keys. Both give the same positions. Queries go in slices of 2**20 so the
    temporaries are reused rather than freshly mapped.
    """
    out = np.full(queries.size, -1, dtype=np.int32)
    if keys.size == 0:
        return out
    run = np.flatnonzero(keys[1:] - keys[:-1] != 1) + 1
    by_runs = 8 * run.size <= keys.size
    first = np.append(0, run)
    first_key = keys[first]
    length = np.diff(np.append(first, keys.size))
    step = 1 << 20
    for q0 in range(0, queries.size, step):
        q = queries[q0:q0 + step]
        if by_runs:
            block = np.searchsorted(first_key, q, side="right") - 1
            b = np.maximum(block, 0)
            offset = q - first_key[b]
            out[q0:q0 + step] = np.where((block >= 0) & (offset < length[b]), first[b] + offset, -1)
        else:
            pos = np.minimum(np.searchsorted(keys, q), keys.size - 1)
            out[q0:q0 + step] = np.where(keys[pos] == q, pos, -1)
    return out


def unit_states(u_mafid: np.ndarray, geo_mafid: np.ndarray, geo_state: np.ndarray) -> np.ndarray:
    """State index of each unit through the public geo map; -1 when the unit has no geo row in the filter."""
    pos = lookup_sorted(geo_mafid, u_mafid)
    return np.where(pos >= 0, geo_state[np.maximum(pos, 0)] if geo_state.size else -1, -1).astype(np.int16)


# --- per-table filters and cell maps (R6)
# --------------------------------------------------------------------


def _lookup(values: np.ndarray, table: Mapping[int, int], size: int = 64) -> np.ndarray:
    lut = np.full(size, -1, dtype=np.int16)
    for k, v in table.items():
        lut[k] = v
    return lut[values.astype(np.int64)]


def _age_cell(age: np.ndarray) -> np.ndarray:
    return np.where(age < 18, 2, 3).astype(np.int16)


def _ph2_cell(u: Columns) -> np.ndarray:
    hht2, cplt = u["HHT2"], u["CPLT"]
    married = np.isin(hht2, (1, 2))
    cohab = np.isin(hht2, (3, 4))
    cell = _lookup(hht2, {9: 9, 10: 10, 11: 10, 12: 10, 5: 12, 6: 13, 7: 13, 8: 13})
    cell = np.where(married, np.where(cplt == 1, 3, np.where(cplt == 2, 4, -1)), cell)
    cell = np.where(cohab, np.where(cplt == 3, 6, np.where(cplt == 4, 7, -1)), cell)
    return cell.astype(np.int16)


def _ph3_cell(p: Columns, u: Columns) -> np.ndarray:
    rel, hht2 = p["RELSHIP"], u["HHT2"]
    own = np.isin(rel, (25, 26, 27))
    own_cell = _lookup(hht2, {1: 4, 3: 5, 10: 6, 6: 7})
    other = _lookup(rel, {20: 2, 21: 2, 22: 2, 23: 2, 24: 2, 34: 2, 35: 2, 36: 2, 30: 9,
                          28: 10, 29: 10, 31: 10, 32: 10, 33: 10})
    return np.where(own, own_cell, other).astype(np.int16)


def _ph6_cell(p: Columns, u: Columns) -> np.ndarray:
    base = _lookup(u["HHT2"], {1: 3, 3: 8, 10: 13, 6: 18})
    age = p["QAGE"]
    band = np.where(age <= 3, 0, np.where(age <= 5, 1, np.where(age <= 11, 2, 3)))
    return np.where(base >= 0, base + band, -1).astype(np.int16)


def _tenure_cell(ten: np.ndarray) -> np.ndarray:
    return _lookup(ten, {1: 2, 2: 3, 3: 4, 4: 4}, size=8)


def _ph8_denom_cell(ten: np.ndarray) -> np.ndarray:
    return _lookup(ten, {1: 2, 2: 2, 3: 3, 4: 3}, size=8)


@dataclass(frozen=True)
class JoinRule:
    """Universe filters (applied BEFORE truncation) and the cell map of an Algorithm 1 table; ``unit_cell``
    says the cell map reads the unit only (the table can then be counted per unit, weighted)."""

    person_filter: Callable[[Columns], np.ndarray]
    unit_filter: Callable[[Columns], np.ndarray]
    cell: Callable[[Columns, Columns], np.ndarray]
    unit_cell: bool = False


@dataclass(frozen=True)
class UnitRule:
    """Universe filter and cell map of an Algorithm 2 (unit) table."""

    unit_filter: Callable[[Columns], np.ndarray]
    cell: Callable[[Columns], np.ndarray]


def all_rows(cols: Columns) -> np.ndarray:
    """The filter that keeps every row."""
    return np.ones(len(cols["MAFID"]), dtype=bool)


_all = all_rows


def _family(u: Columns) -> np.ndarray:
    return np.isin(u["HHT"], (1, 2, 3))


JOIN_RULES: dict[str, JoinRule] = {
    "PH1_num": JoinRule(_all, _all, lambda p, u: _age_cell(p["QAGE"])),
    "PH2": JoinRule(_all, _all, lambda p, u: _ph2_cell(u), unit_cell=True),
    "PH3": JoinRule(lambda p: np.asarray(p["QAGE"] < 18), _all, _ph3_cell),
    "PH4": JoinRule(lambda p: np.isin(p["RELSHIP"], (20, 21, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33)),
                    _family, lambda p, u: _age_cell(p["QAGE"])),
    "PH6": JoinRule(lambda p: np.asarray((p["QAGE"] < 18) & np.isin(p["RELSHIP"], (25, 26, 27))), _all,
                    _ph6_cell),
    "PH7": JoinRule(_all, _all, lambda p, u: _tenure_cell(u["TEN"]), unit_cell=True),
}

UNIT_RULES: dict[str, UnitRule] = {
    "PH1_denom": UnitRule(_all, lambda u: np.ones(len(u["MAFID"]), dtype=np.int16)),
    "PH5_denom": UnitRule(_family, lambda u: np.ones(len(u["MAFID"]), dtype=np.int16)),
    "PH8_denom": UnitRule(_all, lambda u: _ph8_denom_cell(u["TEN"])),
}

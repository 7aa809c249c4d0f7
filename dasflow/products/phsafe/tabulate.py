"""Exact tabulation of every (table, level) over its public domain (Algorithms 1–2 up to the noise step).

For each table the stable transformation (filters, ``truncate_and_join`` for join tables) runs once; every level
then maps each record to (region, iteration, basis cell) — at most one per level — and counts with
``np.bincount`` over the full public domain, so zero cells are present (R11). Within a level the groups and cells
are disjoint, so adding or removing one row of the transformed data changes the level vector by 1 in L1 and L2:
the level's sensitivity is the transformation's stability c (2τ+2 join tables, 2 unit tables).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dasflow.products.phsafe import preprocess as pp
from dasflow.products.phsafe.tables import ITERATIONS, MEASURED, TableDef, level_parts, regions
from dasflow.products.phsafe.truncate import group_starts, grouped_content_order, rank_within_group

Columns = Mapping[str, np.ndarray]

#: Person fields (besides MAFID) that make up a person record's content for the truncation order.
PERSON_CONTENT: tuple[str, ...] = ("RTYPE", "QAGE", "CENHISP", "CENRACE", "RELSHIP")


@dataclass(frozen=True)
class Records:
    """The transformed records of one table: state index, A–G and H–I iteration indices, basis cell code;
    ``weight`` (when set) is each row's multiplicity (rows then stand for that many identical records)."""

    state: np.ndarray
    ag: np.ndarray
    hi: np.ndarray
    cell: np.ndarray
    weight: np.ndarray | None = None


class Universe:
    """Base persons grouped by MAFID and occupied, geo-mapped units sorted by MAFID (with their state and
    householder iteration indices), built by :func:`build_universe`.

    Household arrays are computed at once: ``hh_mafid`` (ascending), ``hh_size`` (base persons) and ``hh_unit``
    (unit row; -1 none; None when some MAFID has several units, then each table's join handles the duplicates
    itself). Person-level data is built on first use only (tables counted per unit never need it):
    ``persons`` (grouped by MAFID, in content order inside households larger than ``min_tau``, R7), ``big``
    (the person positions in those households: the only ones truncation at τ ≥ ``min_tau`` can touch) and
    ``person_unit``.
    """

    def __init__(self, persons: Columns, person_mask: np.ndarray, units: dict[str, np.ndarray],
                 min_tau: int) -> None:
        self.units = units
        self.min_tau = min_tau
        self._raw = persons
        self._mask = person_mask
        pm = np.asarray(persons["MAFID"])
        if pm.size > 1 and bool(np.any(pm[1:] < pm[:-1])):
            pm = np.sort(pm[person_mask])
            starts = group_starts(pm)
            self.hh_mafid = pm[starts]
            self.hh_size = np.diff(np.append(starts, pm.size))
        else:  # grouped in the file: count base persons per MAFID without gathering them
            starts = group_starts(pm)
            size = np.diff(np.append(starts, pm.size))
            others = np.flatnonzero(~np.asarray(person_mask))  # GQ persons etc.: few
            if others.size:
                size -= np.bincount(np.searchsorted(starts, others, side="right") - 1, minlength=starts.size)
            self.hh_mafid = pm[starts[size > 0]]
            self.hh_size = size[size > 0]
        um = units["MAFID"]
        self.hh_unit: np.ndarray | None = None
        if not bool(np.any(um[1:] == um[:-1])):  # unique unit MAFIDs: join each household once
            self.hh_unit = pp.lookup_sorted(um, self.hh_mafid)
        self._persons: dict[str, np.ndarray] | None = None
        self._big = np.zeros(0, dtype=np.int64)
        self._person_unit: np.ndarray | None = None

    @property
    def persons(self) -> dict[str, np.ndarray]:
        if self._persons is None:
            p = _take(self._raw, self._mask)  # a boolean mask gathers faster than indices
            order, self._big = grouped_content_order(p["MAFID"], [p[c] for c in PERSON_CONTENT], self.min_tau)
            if not np.array_equal(order, np.arange(order.size)):
                p = _take(p, order)
            self._persons = p
        return self._persons

    @property
    def big(self) -> np.ndarray:
        _ = self.persons
        return self._big

    @property
    def person_unit(self) -> np.ndarray | None:
        if self.hh_unit is None:
            return None
        if self._person_unit is None:
            self._person_unit = np.repeat(self.hh_unit, self.hh_size)
        return self._person_unit


class Gather(Mapping[str, np.ndarray]):
    """A lazy row selection of a column dict: a column is gathered (and cached) only when a rule reads it."""

    def __init__(self, cols: Columns, idx: np.ndarray) -> None:
        self._cols = cols
        self._idx = idx
        self._cache: dict[str, np.ndarray] = {}

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._cache:
            self._cache[key] = np.asarray(self._cols[key])[self._idx]
        return self._cache[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._cols)

    def __len__(self) -> int:
        return len(self._cols)


def _take(cols: Columns, idx: np.ndarray) -> dict[str, np.ndarray]:
    """Rows ``idx`` (indices or a boolean mask) of every column."""
    return {k: np.asarray(v)[idx] for k, v in cols.items()}


def _sort_by_mafid(mafid: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` ordered by ascending ``mafid[rows]`` (stable; no sort when already ordered)."""
    m = mafid[rows]
    if m.size > 1 and bool(np.any(m[1:] < m[:-1])):
        return rows[np.argsort(m, kind="stable")]
    return rows


def build_universe(persons: Columns, units: Columns, geo: Columns, state_filter: tuple[str, ...],
                   min_tau: int = 1) -> Universe:
    """Apply the base filters and the public geography join (R4); group persons by MAFID in content order (R7).

    ``min_tau`` is the smallest τ the universe will be truncated at (1 serves every τ). Units are kept sorted
    by MAFID so every table's unit subset is sorted too (duplicates adjacent, joins by binary search).
    """
    gm, gs = pp.geo_state_index(geo, state_filter)
    umafid = np.asarray(units["MAFID"])
    st = pp.unit_states(umafid, gm, gs)
    mask = pp.occupied_units(units) & (st >= 0)
    keep = np.flatnonzero(mask)
    srt = _sort_by_mafid(umafid, keep)
    if srt is not keep:
        mask = srt  # not grouped in the file: gather in MAFID order
    u = _take(units, mask)
    u["STATE"] = st[mask]
    u["ITER_AG"] = pp.iteration_ag(u["HHRACE"])
    u["ITER_HI"] = pp.iteration_hi(u["HHRACE"], u["HHSPAN"])
    return Universe(persons, pp.person_universe(persons), u, min_tau)


def _unique_sorted(mafid_sorted: np.ndarray) -> np.ndarray:
    """Mask of the entries of a sorted array whose value occurs exactly once (DropNonUnique)."""
    n = mafid_sorted.size
    ok = np.ones(n, dtype=bool)
    if n > 1:
        eq = mafid_sorted[1:] == mafid_sorted[:-1]
        ok[1:] &= ~eq
        ok[:-1] &= ~eq
    return ok


def _join(uni: Universe, rule: pp.JoinRule, tau: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(person rows, unit rows) of the filtered, truncated (τ; None = not truncated) inner join."""
    p, u = uni.persons, uni.units
    keep = np.array(rule.person_filter(p), dtype=bool)
    if tau is not None and uni.big.size:
        sel = uni.big[keep[uni.big]]  # this table's persons in households larger than min_tau <= tau
        keep[sel[rank_within_group(p["MAFID"][sel]) >= tau]] = False
    if uni.person_unit is not None:  # unique unit MAFIDs: DropNonUnique is the identity
        unit_ok = np.append(np.asarray(rule.unit_filter(u), dtype=bool), False)  # index -1: no unit
        pu = uni.person_unit
        hit = keep & unit_ok[pu]
        pr = np.flatnonzero(hit)
        return pr, pu[pr].astype(np.int64)
    pr = np.flatnonzero(keep)
    pm = p["MAFID"][pr]
    u_rows = np.flatnonzero(rule.unit_filter(u))
    um = u["MAFID"][u_rows]  # sorted: the universe keeps units sorted by MAFID
    if tau is not None:
        uniq = _unique_sorted(um)
        u_rows, um = u_rows[uniq], um[uniq]
    pos = np.searchsorted(um, pm)
    if um.size:
        pos_c = np.minimum(pos, um.size - 1)
        hit = um[pos_c] == pm
    else:
        pos_c, hit = pos, np.zeros(pm.size, dtype=bool)
    return pr[hit], u_rows[pos_c[hit]]


def _household_records(uni: Universe, rule: pp.JoinRule, tau: int | None) -> Records:
    """A table whose iteration and cell are unit attributes, with unique unit MAFIDs: every kept person of a
    household yields the same record, so the truncated join is the household's unit with weight
    min(filtered persons, τ) — which persons the content order keeps cannot change any count."""
    u = uni.units
    assert uni.hh_unit is not None
    if rule.person_filter is pp.all_rows:
        count = uni.hh_size
    else:
        starts = np.append(0, np.cumsum(uni.hh_size)[:-1])
        keep = np.asarray(rule.person_filter(uni.persons), dtype=np.int64)
        count = np.add.reduceat(keep, starts) if keep.size else np.zeros(0, dtype=np.int64)
    weight = count if tau is None else np.minimum(count, tau)
    unit_ok = np.append(np.asarray(rule.unit_filter(u), dtype=bool), False)  # index -1: no unit
    hit = unit_ok[uni.hh_unit] & (weight > 0)
    per_unit = np.zeros(len(u["MAFID"]), dtype=np.int64)
    per_unit[uni.hh_unit[hit]] = weight[hit]  # unique MAFIDs: one household per unit
    rows = np.flatnonzero(per_unit)
    uj = Gather(u, rows)
    empty: Columns = {"MAFID": np.zeros(0, dtype=np.int64)}  # the cell map reads the unit only
    return Records(state=uj["STATE"], ag=uj["ITER_AG"], hi=uj["ITER_HI"], cell=rule.cell(empty, uj),
                   weight=per_unit[rows])


def join_records(uni: Universe, table: str, tau: int | None) -> Records:
    """Algorithm 1 up to the query: filter, truncate (τ; None = no truncation, ground truth), join, map.

    Same semantics as :func:`~dasflow.products.phsafe.truncate.truncate_and_join` (the universe's order is
    the content order wherever truncation at τ can drop a record). Tables whose iteration and cell are
    functions of the unit are returned per unit with the joined persons' count as weight.
    """
    if tau is not None and tau < uni.min_tau:
        raise ValueError(f"tau {tau} is below the universe's min_tau {uni.min_tau}")
    rule = pp.JOIN_RULES[table]
    tdef = MEASURED[table]
    u = uni.units
    if rule.unit_cell and not tdef.by_person and uni.hh_unit is not None:
        return _household_records(uni, rule, tau)
    p = uni.persons
    pr, ur = _join(uni, rule, tau)
    if rule.unit_cell and not tdef.by_person:
        w = np.bincount(ur, minlength=len(u["MAFID"]))
        rows = np.flatnonzero(w)
        uj = Gather(u, rows)
        return Records(state=uj["STATE"], ag=uj["ITER_AG"], hi=uj["ITER_HI"], cell=rule.cell(Gather(p, rows[:0]), uj),
                       weight=w[rows])
    pj, uj = Gather(p, pr), Gather(u, ur)
    if tdef.by_person:
        race, hisp = pj["CENRACE"], pj["CENHISP"]
        ag, hi = pp.iteration_ag(race), pp.iteration_hi(race, hisp)
    else:
        ag, hi = uj["ITER_AG"], uj["ITER_HI"]
    return Records(state=uj["STATE"], ag=ag, hi=hi, cell=rule.cell(pj, uj))


def unit_records(uni: Universe, table: str) -> Records:
    """Algorithm 2 up to the query: filter units, map to householder iteration and cell."""
    rule = pp.UNIT_RULES[table]
    u = Gather(uni.units, np.flatnonzero(rule.unit_filter(uni.units)))
    return Records(state=u["STATE"], ag=u["ITER_AG"], hi=u["ITER_HI"], cell=rule.cell(u))


def cell_positions(rec: Records, tdef: TableDef) -> np.ndarray:
    """Position of each record's basis cell in ``tdef.cells`` (int32), -1 when the record maps to no cell."""
    lut = np.full(64, -1, dtype=np.int32)
    lut[list(tdef.cells)] = np.arange(len(tdef.cells), dtype=np.int32)
    return lut[np.where(rec.cell >= 0, rec.cell, 63)]


def fine_counts(rec: Records, tdef: TableDef, n_states: int) -> np.ndarray:
    """Counts by (state, A–G index + 1, H–I index + 1, cell position + 1): index 0 holds the records with no
    A–G / H–I iteration or no basis cell. One ``np.bincount`` serves every level of the table."""
    nc = len(tdef.cells) + 1
    if rec.state.size and int(rec.state.min()) < 0:
        raise ValueError("a tabulated record has no state")
    key = rec.state.astype(np.int32) * (8 * 3 * nc)
    key += (rec.ag.astype(np.int32) + 1) * (3 * nc)
    key += (rec.hi.astype(np.int32) + 1) * nc
    key += cell_positions(rec, tdef) + 1
    size = n_states * 8 * 3 * nc
    if rec.weight is None:
        counts = np.bincount(key, minlength=size)
    else:
        counts = np.rint(np.bincount(key, weights=rec.weight, minlength=size)).astype(np.int64)
    return counts.reshape(n_states, 8, 3, nc)


def level_from_fine(fine: np.ndarray, level: str) -> np.ndarray:
    """One level as a flat int64 vector indexed ((region, iteration), cell) over the public domain, summed
    from :func:`fine_counts` (records without a cell, or without the level's iteration, are not counted)."""
    geo, it = level_parts(level)
    f = fine[..., 1:]
    if it == "*":
        x = f.sum(axis=(1, 2))
    elif it == "A-G":
        x = f[:, 1:, :, :].sum(axis=2)
    else:
        x = f[:, :, 1:, :].sum(axis=1)
    if geo == "usa":
        x = x.sum(axis=0)
    return np.ascontiguousarray(x).reshape(-1).astype(np.int64)


def level_vector(rec: Records, tdef: TableDef, level: str, n_states: int) -> np.ndarray:
    """Counts of one level as a flat int64 vector indexed ((region, iteration), cell) over the public domain."""
    return level_from_fine(fine_counts(rec, tdef, n_states), level)


def domain_frame(tdef: TableDef, level: str, state_filter: tuple[str, ...]) -> pd.DataFrame:
    """The public rows of one level, in ``level_vector`` order: REGION_ID, REGION_TYPE, ITERATION_CODE,
    DATA_CELL."""
    geo, it = level_parts(level)
    regs = regions(geo, state_filter)
    its = ITERATIONS[it]
    nc, ni = len(tdef.cells), len(its)
    n = len(regs) * ni * nc
    r = np.repeat(np.arange(len(regs)), ni * nc)
    i = np.tile(np.repeat(np.arange(ni), nc), len(regs))
    c = np.tile(np.arange(nc), len(regs) * ni)
    assert r.size == n
    return pd.DataFrame({
        "REGION_ID": np.array([x[0] for x in regs], dtype=object)[r],
        "REGION_TYPE": np.array([x[1] for x in regs], dtype=object)[r],
        "ITERATION_CODE": np.array(its, dtype=object)[i],
        "DATA_CELL": np.array(tdef.cells, dtype=np.int64)[c],
    })


#: the public domain frames of the levels, built once per process (a partitioned preprocess tabulates the same
#: levels for every partition); callers never modify them (:func:`tabulate` adds COUNT with ``assign``)
_shared_domain = functools.lru_cache(maxsize=256)(domain_frame)


def tabulate(uni: Universe, tables: Mapping[str, list[str]], tau: Mapping[str, int] | None,
             state_filter: tuple[str, ...], domain: bool = True) -> dict[str, pd.DataFrame]:
    """Exact counts for each requested (table -> levels); keys ``"<table>/<level>"``; tau None = no
    truncation.

    Each frame has the domain columns plus ``COUNT`` (int64), one row per public (region, iteration, cell);
    with ``domain=False`` only ``COUNT``, in the same order (:func:`with_domain` adds the public columns back).
    """
    out: dict[str, pd.DataFrame] = {}
    n_states = len(state_filter)
    for table, levels in tables.items():
        if not levels:
            continue
        tdef = MEASURED[table]
        rec = (join_records(uni, table, None if tau is None else tau[table]) if tdef.kind == "join"
               else unit_records(uni, table))
        fine = fine_counts(rec, tdef, n_states)
        for level in levels:
            counts = level_from_fine(fine, level)
            out[f"{table}/{level}"] = _shared_domain(tdef, level, state_filter).assign(COUNT=counts) if domain \
                else pd.DataFrame({"COUNT": counts})
    return out


def with_domain(key: str, counts: pd.DataFrame, state_filter: tuple[str, ...]) -> pd.DataFrame:
    """The frame :func:`tabulate` gives for ``key`` (``"<table>/<level>"``) from its ``domain=False`` frame: the
    public domain columns of the level, then ``COUNT``; ``ValueError`` if the lengths differ."""
    table, _, level = key.partition("/")
    frame = _shared_domain(MEASURED[table], level, state_filter)
    if len(frame) != len(counts):
        raise ValueError(f"{key}: {len(counts)} counts for a domain of {len(frame)} cells")
    return frame.assign(COUNT=counts["COUNT"].to_numpy(np.int64))

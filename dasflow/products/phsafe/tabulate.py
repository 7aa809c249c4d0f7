"""Exact tabulation of every (table, level) over its public domain (Algorithms 1–2 up to the noise step).

For each table the stable transformation (filters, ``truncate_and_join`` for join tables) runs once; every
level
then maps each record to (region, iteration, basis cell) — at most one per level — and counts with
``np.bincount`` over the full public domain, so zero cells are present (R11). Within a level the groups and
cells
are disjoint, so adding or removing one row of the transformed data changes the level vector by 1 in L1 and
L2:
the level's sensitivity is the transformation's stability c (2τ+2 join tables, 2 unit tables).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dasflow.products.phsafe import preprocess as pp
from dasflow.products.phsafe.tables import ITERATIONS, MEASURED, TableDef, level_parts, regions
from dasflow.products.phsafe.truncate import content_order, rank_within_group

Columns = Mapping[str, np.ndarray]

#: Person fields (besides MAFID) that make up a person record's content for the truncation order.
PERSON_CONTENT: tuple[str, ...] = ("RTYPE", "QAGE", "CENHISP", "CENRACE", "RELSHIP")


@dataclass(frozen=True)
class Records:
    """The transformed records of one table: state index, A–G and H–I iteration indices, basis cell code."""

    state: np.ndarray
    ag: np.ndarray
    hi: np.ndarray
    cell: np.ndarray


@dataclass(frozen=True)
class Universe:
    """Base persons and occupied, geo-mapped units (sorted by MAFID), plus one shared content order of the
    persons and the units' householder iteration indices."""

    persons: dict[str, np.ndarray]
    units: dict[str, np.ndarray]
    order: np.ndarray


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
    return {k: np.asarray(v)[idx] for k, v in cols.items()}


def build_universe(persons: Columns, units: Columns, geo: Columns, state_filter: tuple[str, ...]) -> Universe:
    """Apply the base filters and the public geography join (R4); sort persons once by content (R7).

    Units are kept sorted by MAFID so every table's unit subset is sorted too (duplicates adjacent, joins by
    binary search without re-sorting).
    """
    p = _take(persons, np.flatnonzero(pp.person_universe(persons)))
    gm, gs = pp.geo_state_index(geo, state_filter)
    st = pp.unit_states(np.asarray(units["MAFID"]), gm, gs)
    keep = np.flatnonzero(pp.occupied_units(units) & (st >= 0))
    keep = keep[np.argsort(np.asarray(units["MAFID"])[keep], kind="stable")]
    u = _take(units, keep)
    u["STATE"] = st[keep]
    u["ITER_AG"] = pp.iteration_ag(u["HHRACE"])
    u["ITER_HI"] = pp.iteration_hi(u["HHRACE"], u["HHSPAN"])
    order = content_order(p["MAFID"], [p[c] for c in PERSON_CONTENT])
    return Universe(persons=p, units=u, order=order)


def _unique_sorted(mafid_sorted: np.ndarray) -> np.ndarray:
    """Mask of the entries of a sorted array whose value occurs exactly once (DropNonUnique)."""
    n = mafid_sorted.size
    ok = np.ones(n, dtype=bool)
    if n > 1:
        eq = mafid_sorted[1:] == mafid_sorted[:-1]
        ok[1:] &= ~eq
        ok[:-1] &= ~eq
    return ok


def join_records(uni: Universe, table: str, tau: int | None) -> Records:
    """Algorithm 1 up to the query: filter, ``truncate_and_join`` (τ; None = no truncation, ground truth),
    map. Same semantics as :func:`~dasflow.products.phsafe.truncate.truncate_and_join`, sharing one sort."""
    rule = pp.JOIN_RULES[table]
    p, u = uni.persons, uni.units
    pmask = rule.person_filter(p)
    ordered = uni.order[pmask[uni.order]]  # the shared content order restricted to this table's persons
    pm = p["MAFID"][ordered]
    if tau is not None:
        keep = rank_within_group(pm) < tau
        ordered, pm = ordered[keep], pm[keep]
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
    pr, ur = ordered[hit], u_rows[pos_c[hit]]
    pj, uj = Gather(p, pr), Gather(u, ur)
    tdef = MEASURED[table]
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


def level_vector(rec: Records, tdef: TableDef, level: str, n_states: int,
                 cellpos: np.ndarray | None = None) -> np.ndarray:
    """Counts of one level as a flat int64 vector indexed ((region, iteration), cell) over the public domain."""
    geo, it = level_parts(level)
    n_regions = 1 if geo == "usa" else n_states
    n_iter = len(ITERATIONS[it])
    nc = len(tdef.cells)
    cell = cell_positions(rec, tdef) if cellpos is None else cellpos
    ok = cell >= 0
    idx = cell.astype(np.int32)
    if it != "*":
        iteration = (rec.ag if it == "A-G" else rec.hi).astype(np.int32)
        ok &= iteration >= 0
        idx = idx + iteration * nc
    if geo != "usa":
        region = rec.state.astype(np.int32)
        ok &= region >= 0
        idx = idx + region * (n_iter * nc)
    size = n_regions * n_iter * nc
    return np.bincount(idx[ok], minlength=size).astype(np.int64)


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


def tabulate(uni: Universe, tables: Mapping[str, list[str]], tau: Mapping[str, int] | None,
             state_filter: tuple[str, ...]) -> dict[str, pd.DataFrame]:
    """Exact counts for each requested (table -> levels); keys ``"<table>/<level>"``; tau None = no
    truncation.

    Each frame has the domain columns plus ``COUNT`` (int64), one row per public (region, iteration, cell).
    """
    out: dict[str, pd.DataFrame] = {}
    n_states = len(state_filter)
    for table, levels in tables.items():
        if not levels:
            continue
        tdef = MEASURED[table]
        rec = (join_records(uni, table, None if tau is None else tau[table]) if tdef.kind == "join"
               else unit_records(uni, table))
        cellpos = cell_positions(rec, tdef)
        for level in levels:
            frame = domain_frame(tdef, level, state_filter)
            frame["COUNT"] = level_vector(rec, tdef, level, n_states, cellpos)
            out[f"{table}/{level}"] = frame
    return out

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

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dasflow.products.phsafe import preprocess as pp
from dasflow.products.phsafe.tables import ITERATIONS, MEASURED, TableDef, level_parts, regions
from dasflow.products.phsafe.truncate import content_order, drop_non_unique, inner_join, rank_within_group

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
    """Base persons and occupied, geo-mapped units, plus one shared content order of the persons."""

    persons: dict[str, np.ndarray]
    units: dict[str, np.ndarray]
    order: np.ndarray


def _take(cols: Columns, idx: np.ndarray) -> dict[str, np.ndarray]:
    return {k: np.asarray(v)[idx] for k, v in cols.items()}


def build_universe(persons: Columns, units: Columns, geo: Columns, state_filter: tuple[str, ...]) -> Universe:
    """Apply the base filters and the public geography join (R4); sort persons once by content (R7)."""
    p = _take(persons, np.flatnonzero(pp.person_universe(persons)))
    gm, gs = pp.geo_state_index(geo, state_filter)
    st = pp.unit_states(np.asarray(units["MAFID"]), gm, gs)
    keep = pp.occupied_units(units) & (st >= 0)
    u = _take(units, np.flatnonzero(keep))
    u["STATE"] = st[keep]
    order = content_order(p["MAFID"], [p[c] for c in PERSON_CONTENT])
    return Universe(persons=p, units=u, order=order)


def join_records(uni: Universe, table: str, tau: int | None) -> Records:
    """Algorithm 1 up to the query: filter, ``truncate_and_join`` (τ; None = no truncation, ground truth),
    map."""
    rule = pp.JOIN_RULES[table]
    p, u = uni.persons, uni.units
    pmask = rule.person_filter(p)
    ordered = uni.order[pmask[uni.order]]  # the shared content order restricted to this table's persons
    if tau is not None:
        ordered = ordered[rank_within_group(p["MAFID"][ordered]) < tau]
        u_rows = drop_non_unique_masked(u["MAFID"], rule.unit_filter(u))
    else:
        u_rows = np.flatnonzero(rule.unit_filter(u))
    pr, ur = inner_join(p["MAFID"], ordered, u["MAFID"], u_rows)
    pj = _take(p, pr)
    uj = _take(u, ur)
    tdef = MEASURED[table]
    race, hisp = (pj["CENRACE"], pj["CENHISP"]) if tdef.by_person else (uj["HHRACE"], uj["HHSPAN"])
    return Records(state=uj["STATE"], ag=pp.iteration_ag(race), hi=pp.iteration_hi(race, hisp),
                   cell=rule.cell(pj, uj))


def drop_non_unique_masked(mafid: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Rows of ``mask`` whose MAFID is unique among the masked rows (DropNonUnique after the unit filter)."""
    rows = np.flatnonzero(mask)
    return np.asarray(rows[drop_non_unique(mafid[rows])])


def unit_records(uni: Universe, table: str) -> Records:
    """Algorithm 2 up to the query: filter units, map to householder iteration and cell."""
    rule = pp.UNIT_RULES[table]
    u = _take(uni.units, np.flatnonzero(rule.unit_filter(uni.units)))
    return Records(state=u["STATE"], ag=pp.iteration_ag(u["HHRACE"]),
                   hi=pp.iteration_hi(u["HHRACE"], u["HHSPAN"]), cell=rule.cell(u))


def level_vector(rec: Records, tdef: TableDef, level: str, n_states: int) -> np.ndarray:
    """Counts of one level as a flat int64 vector indexed ((region, iteration), cell) over the public
    domain."""
    geo, it = level_parts(level)
    n_regions = 1 if geo == "usa" else n_states
    n_iter = len(ITERATIONS[it])
    lut = np.full(64, -1, dtype=np.int64)
    lut[list(tdef.cells)] = np.arange(len(tdef.cells))
    cell = lut[np.where(rec.cell >= 0, rec.cell, 63).astype(np.int64)]
    region = np.zeros(rec.state.size, dtype=np.int64) if geo == "usa" else rec.state.astype(np.int64)
    iteration = {"*": np.zeros(rec.state.size, dtype=np.int64), "A-G": rec.ag.astype(np.int64),
                 "H,I": rec.hi.astype(np.int64)}[it]
    ok = (cell >= 0) & (iteration >= 0) & (region >= 0)
    idx = (region[ok] * n_iter + iteration[ok]) * len(tdef.cells) + cell[ok]
    size = n_regions * n_iter * len(tdef.cells)
    return np.bincount(idx, minlength=size).astype(np.int64)


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
        for level in levels:
            frame = domain_frame(tdef, level, state_filter)
            frame["COUNT"] = level_vector(rec, tdef, level, n_states)
            out[f"{table}/{level}"] = frame
    return out

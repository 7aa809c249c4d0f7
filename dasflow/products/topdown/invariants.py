"""Public invariants of TopDown (topdown-estimation.md "Invariants"): state populations and structural zeros.

Both are public facts, fixed across neighbouring databases, and inputs to estimation only (never noisy, never
measured); using them is post-processing. Formats (docs/topdown.md):

* ``invariants.json``: ``{"total": N, "state": {"01": n1, "02": n2, ...}}`` — state FIPS → population. The
  states must be exactly those of the block geography and their sum must equal ``total`` when both are held.
* ``block_facts.csv`` (pipe-delimited, header, one row per block of the geography): ``GEOID`` (15 digits; or
  ``TABBLKST|TABBLKCOU|TABTRACTCE|TABBLK``), ``HU`` (housing units in the block) and ``GQ1`` … ``GQ7`` (group
  quarters facilities of major type 1 … 7), non-negative integers — the 2020 DAS held these counts invariant.
  With the PL94 schema (HHGQ: 0 household, 1–7 GQ major type) a block with ``HU = 0`` has 0 persons in every
  HHGQ = 0 cell and a block with ``GQt = 0`` has 0 in every HHGQ = t cell (structural zeros).
  :func:`build_block_facts` derives the file from a unit file (one row per housing unit or GQ facility, e.g.
  the synthetic census's ``topdown/units``).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.block_facts import fact_columns
from dasflow.products.topdown.spine import Spine
from dasflow.products.topdown.strategy import Schema

IntArray = npt.NDArray[np.int64]

INVARIANTS_FILE = "invariants.json"
BLOCK_FACTS_FILE = "block_facts.csv"
#: The attribute whose codes the block facts restrict (0 = household, t ≥ 1 = GQ major type t).
STRUCTURAL_ATTRIBUTE = "HHGQ"
GEO_PARTS = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK")


def geoids_of(frame: pd.DataFrame, source: str) -> npt.NDArray[np.str_]:
    """The 15-digit block GEOID of each row (``GEOID`` or the four GRF-C parts, zero-padded)."""
    if "GEOID" in frame.columns:
        g = frame["GEOID"].astype(str)
    elif set(GEO_PARTS) <= set(frame.columns):
        g = (frame["TABBLKST"].astype(str).str.zfill(2) + frame["TABBLKCOU"].astype(str).str.zfill(3)
             + frame["TABTRACTCE"].astype(str).str.zfill(6) + frame["TABBLK"].astype(str).str.zfill(4))
    else:
        raise InputError("needs GEOID or TABBLKST/TABBLKCOU/TABTRACTCE/TABBLK", file=source, column="GEOID")
    out: npt.NDArray[np.str_] = g.to_numpy().astype(str)
    return out


def read_block_facts(data: bytes, source: str = BLOCK_FACTS_FILE) -> pd.DataFrame:
    """Parse a ``block_facts.csv`` (all columns as text; :func:`block_masks` validates)."""
    try:
        return pd.read_csv(io.BytesIO(data), sep="|", dtype=str, keep_default_na=False)
    except (ValueError, pd.errors.ParserError) as exc:
        raise InputError(f"not a pipe-delimited block facts file: {exc}", file=source) from None


def block_masks(spine: Spine, facts: pd.DataFrame, n_codes: int, source: str = BLOCK_FACTS_FILE) -> IntArray:
    """Per block of the spine (internal order): bit k set iff the block may hold persons of code k.

    Every block of the geography must have exactly one row; counts are non-negative integers (InputError with
    file, row and column otherwise)."""
    geoid = geoids_of(facts, source)
    bad = np.flatnonzero(pd.Series(geoid).duplicated().to_numpy())
    if bad.size:
        raise InputError(f"duplicate block {geoid[bad[0]]!r}: one row per block", file=source,
                         row=int(bad[0]) + 2, column="GEOID")
    blocks = spine.block_geoid.astype(str)
    srt = np.argsort(blocks)
    pos = np.minimum(np.searchsorted(blocks[srt], geoid), max(blocks.size - 1, 0))
    found = blocks[srt][pos] == geoid if blocks.size else np.zeros(geoid.size, dtype=bool)
    bad = np.flatnonzero(~found)
    if bad.size:
        raise InputError(f"block {geoid[bad[0]]!r} is not in the block geography", file=source,
                         row=int(bad[0]) + 2, column="GEOID")
    if geoid.size != blocks.size:
        missing = np.setdiff1d(blocks, geoid)
        raise InputError(f"block {missing[0]!r} of the geography has no row ({blocks.size - geoid.size} "
                         "blocks missing)", file=source, column="GEOID")
    mask = np.zeros(geoid.size, dtype=np.int64)
    for k, col in enumerate(fact_columns(n_codes)):
        if col not in facts.columns:
            raise InputError(f"column {col} missing (needs {', '.join(fact_columns(n_codes))})", file=source,
                             column=col)
        v = pd.to_numeric(facts[col].astype(str).str.strip(), errors="coerce").to_numpy()
        wrong = np.flatnonzero(~np.isfinite(v) | (v < 0) | (v != np.floor(v)))
        if wrong.size:
            raise InputError(f"{col} = {facts[col].iloc[wrong[0]]!r} is not a non-negative integer", file=source,
                             row=int(wrong[0]) + 2, column=col)
        mask |= (v > 0).astype(np.int64) << k
    out = np.zeros(blocks.size, dtype=np.int64)
    out[srt[pos]] = mask
    return out


def check_gq_types(blocks: pd.DataFrame, facts: pd.DataFrame, n_codes: int, blocks_source: str,
                   source: str = BLOCK_FACTS_FILE) -> None:
    """The geography's ``GQ_TYPES`` presence string (spine input) must agree with the block facts."""
    if "GQ_TYPES" not in blocks.columns:
        return
    bg = pd.Series(geoids_of(blocks, blocks_source))
    types = blocks["GQ_TYPES"].astype(str).str.ljust(n_codes - 1, "0")
    fg = pd.Series(geoids_of(facts, source))
    pos = pd.Index(fg).get_indexer(bg)
    for t in range(1, n_codes):
        col = f"GQ{t}"
        if col not in facts.columns:
            continue
        has = pd.to_numeric(facts[col], errors="coerce").fillna(0).to_numpy() > 0
        bit = (types.str[t - 1] == "1").to_numpy()
        ok = pos >= 0
        wrong = np.flatnonzero(ok & (has[np.where(ok, pos, 0)] != bit))
        if wrong.size:
            r = int(pos[wrong[0]])
            raise InputError(f"{col} disagrees with GQ_TYPES of block {bg.iloc[wrong[0]]} in {blocks_source}",
                             file=source, row=r + 2, column=col)


def level_masks(spine: Spine, block_mask: IntArray) -> list[IntArray]:
    """Allowed-code masks of every level: a unit allows a code iff one of its blocks does (OR up the tree)."""
    out: list[IntArray] = [block_mask.astype(np.int64)]
    cur = out[0]
    for l in range(spine.n_levels - 1, 0, -1):
        up = np.zeros(spine.n_units(l - 1), dtype=np.int64)
        np.bitwise_or.at(up, spine.parent[l], cur)
        out.append(up)
        cur = up
    return out[::-1]


def build_block_facts(units: pd.DataFrame, geoids: Sequence[str] | npt.NDArray[Any], n_codes: int = 8,
                      source: str = "<units>") -> pd.DataFrame:
    """``block_facts`` from a unit file (one row per housing unit — vacant ones included — or GQ facility:
    block GEOID or its four parts, and ``HHGQ`` 0 = housing unit, t = GQ facility of major type t), for the
    blocks ``geoids`` (blocks without units get zeros). Unit counts per block were public invariants in 2020."""
    g = geoids_of(units, source)
    if "HHGQ" not in units.columns:
        raise InputError("column HHGQ missing", file=source, column="HHGQ")
    code = pd.to_numeric(units["HHGQ"], errors="coerce").to_numpy()
    bad = np.flatnonzero(~np.isfinite(code) | (code < 0) | (code >= n_codes))
    if bad.size:
        raise InputError(f"HHGQ {units['HHGQ'].iloc[bad[0]]!r} outside 0..{n_codes - 1}", file=source,
                         row=int(bad[0]) + 2, column="HHGQ")
    blocks = np.asarray(geoids).astype(str)
    idx = pd.Index(blocks).get_indexer(g)
    out_of = np.flatnonzero(idx < 0)
    if out_of.size:
        raise InputError(f"unit in block {g[out_of[0]]!r} outside the geography", file=source,
                         row=int(out_of[0]) + 2, column="GEOID")
    counts = np.bincount(idx * n_codes + code.astype(np.int64), minlength=blocks.size * n_codes)
    counts = counts.reshape(blocks.size, n_codes)
    frame = pd.DataFrame({"GEOID": blocks})
    for k, col in enumerate(fact_columns(n_codes)):
        frame[col] = counts[:, k]
    return frame


def state_units(spine: Spine) -> tuple[int, npt.NDArray[np.str_]]:
    """``(level, fips)``: the level whose units nest in states (1 under a US root, 0 for a state root) and the
    state FIPS of each of its units (from the block GEOIDs; a unit never spans two states)."""
    if spine.levels[0] == "state":
        level = 0
    elif spine.n_levels > 1 and spine.levels[1] == "state":
        level = 1
    else:
        raise InputError(f"state invariants need a spine with a state level (levels {spine.levels})")
    bst = pd.Series(spine.block_geoid.astype(str)).str[:2].to_numpy().astype("U2")
    bu = spine.block_unit[level]
    fips = np.empty(spine.n_units(level), dtype="U2")
    fips[bu] = bst
    if (fips[bu] != bst).any():
        raise InputError("a state-level unit of the spine spans two states")
    return level, fips


def parse_state_invariants(raw: Any, spine: Spine, source: str = INVARIANTS_FILE
                           ) -> tuple[int, IntArray, tuple[str, ...], IntArray]:
    """``{"01": n1, ...}`` → ``(state_level, state_of_unit, labels, totals)``; the states must be exactly the
    geography's (InputError naming ``invariants.json`` and the key otherwise)."""
    if not isinstance(raw, Mapping):
        raise InputError("'state' must be an object of state FIPS → population", file=source, column="state")
    labels = tuple(sorted(str(k) for k in raw))
    totals = np.zeros(len(labels), dtype=np.int64)
    for i, k in enumerate(labels):
        v = raw[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"state {k}: population {v!r} is not a non-negative integer", file=source,
                             column=f"state.{k}")
        totals[i] = v
    level, fips = state_units(spine)
    geo = sorted(set(fips.tolist()))
    extra = sorted(set(labels) - set(geo))
    if extra:
        raise InputError(f"state {extra[0]} is not in the block geography", file=source, column=f"state.{extra[0]}")
    missing = sorted(set(geo) - set(labels))
    if missing:
        raise InputError(f"state {missing[0]} of the block geography has no population invariant", file=source,
                         column=f"state.{missing[0]}")
    of_unit = np.searchsorted(np.array(labels), fips).astype(np.int64)
    return level, of_unit, labels, totals


def check_state_invariants(geoid: npt.NDArray[Any], labels: Sequence[str], totals: IntArray,
                           source: str = INVARIANTS_FILE) -> None:
    """Each state's invariant equals its number of person records (before any noise)."""
    st = pd.Series(np.asarray(geoid).astype(str)).str[:2].value_counts()
    for k, n in zip(labels, totals.tolist(), strict=True):
        have = int(st.get(k, 0))
        if have != n:
            raise InputError(f"public population invariant of state {k} differs from its number of person "
                             "records (the count is confidential and not shown)", file=source, column=f"state.{k}")


def structural_cell_codes(schema: Schema) -> IntArray:
    """The structural attribute's code of every cell (row-major cells)."""
    names = list(schema.names)
    idx = names.index(STRUCTURAL_ATTRIBUTE)
    out: IntArray = np.unravel_index(np.arange(schema.n_cells), schema.shape)[idx].astype(np.int64)
    return out

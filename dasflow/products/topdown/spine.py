"""The TopDown geographic spine: construction, optimisation (OBGs, Alg 2, Alg 3), privacy invariant.

Reads only public block geography (a GRF-C-like block file) plus the invariant GQ-type presence per block;
never person data (S20: one row per block, a column whitelist, unique GEOIDs). Deterministic, no randomness.

Privacy argument (Theorem 3, S14): every geounit ``u`` with ``γ_u > 0`` is measured with budget share ``γ_u``;
a moved record changes the histograms of the geounits on two root-to-block paths only, so the mechanism is
ρ-zCDP iff the **sum of γ along every root-to-block path** is ≤ Σβ = 1. The bypass (Sec 5 form) moves PLB up a
path and never changes a path sum; :func:`check_privacy_invariant` verifies in exact integer arithmetic (γ
numerators over one common denominator) that every path sum equals Σβ and every γ ≥ 0, and the build fails
otherwise. The spine and γ depend on public geography and the GQ invariants only, both fixed across TDA
neighbours (§6), so they are data-independent.

Decisions where the paper is silent ([?] items, also in docs/topdown.md):
- OBG cap ``int(√n + fanout_cutoff)`` (n = blocks in the tract unit, i.e. tract ∩ AIAN side); a membership
  cell larger than the cap is cut into ``ceil(m/cap)`` balanced chunks in GEOID order.
- Alg 2 re-evaluates on a tract-level reduced tree (tract c-values do not depend on tract grouping); pairs are
  visited in (county, u, v) order; the sibling list is rebuilt after each accepted merge.
- Alg 3 never bypasses the root.

Storage: :func:`spine_bytes` writes a spine as one deterministic ``.npz`` object (int64 arrays, text as UTF-8
bytes + int64 offsets, a JSON header; no pickle), :func:`spine_from_bytes` reads it back strictly (any
malformed object is an :class:`~dasflow.errors.IntegrityError`) and re-checks the privacy invariant.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import math
import os
import tempfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import DasflowError, InputError, IntegrityError
from dasflow.io.arrays import unique
from dasflow.products.topdown.osed import OsedPairs, leaf_pairs, leximax_le, osed_root, osed_up
from dasflow.products.topdown.strategy import check_shares, exact_share
from dasflow.validation.lookup import GeoidIndex

log = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
ObjArray = npt.NDArray[np.object_]
#: a component's per-block labels: a text column of the block frame, or a numpy text array
Labels = pd.Series | npt.NDArray[Any]

#: S23: the 12 strong-MCD states (CT, ME, MA, MI, MN, NH, NJ, NY, PA, RI, VT, WI) by FIPS code.
STRONG_MCD_STATES = frozenset({"09", "23", "25", "26", "27", "33", "34", "36", "42", "44", "50", "55"})

#: [EXT] AIANNHCE ranges of the 7 AIAN area categories on the spine (inclusive); TDSA/SDTSA and 9999 excluded.
AIAN_RANGES: tuple[tuple[int, int], ...] = (
    (1, 4799), (4800, 4989), (5000, 5499), (5500, 5899), (5900, 5999), (6000, 7999), (9000, 9499),
)

#: Columns the spine builder accepts; anything else (e.g. person attributes) is refused (S20).
GEOGRAPHY_COLUMNS = frozenset({
    "GEOID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "AIANNHCE", "PLACEFP", "COUSUBFP",
    "GQ_TYPES", "SDUNI", "PRIM",
})

Category = Literal["AIAN", "GQ", "MCD", "PLACE", "SD", "CBG"]


class PrivacyInvariantError(DasflowError):
    """S14: some root-to-block path sum of γ differs from Σβ, or some γ < 0. The run must stop."""


@dataclass(frozen=True)
class SpineConfig:
    """Spine settings. ``fanout_cutoff`` is a [?] in the paper and has no baked-in default here."""

    beta: tuple[Fraction, ...]
    fanout_cutoff: int
    kind: Literal["pl94", "dhc"] = "pl94"
    ose_categories: tuple[Category, ...] = ("AIAN", "GQ", "MCD", "PLACE")
    aian_split: bool = True
    optimized_block_groups: bool = True
    tract_groups: bool = False
    privacy_rule: Literal["zcdp", "puredp"] = "zcdp"
    aian_ranges: tuple[tuple[int, int], ...] = AIAN_RANGES
    universe: Literal["US", "PR"] = "US"

    def __post_init__(self) -> None:
        check_shares(list(self.beta), "spine β")
        if len(self.beta) != len(self.levels):
            raise InputError(f"spine: {len(self.beta)} shares β for {len(self.levels)} levels {self.levels}")
        if self.fanout_cutoff < 0:
            raise InputError("spine: fanout_cutoff must be ≥ 0")

    @property
    def levels(self) -> tuple[str, ...]:
        if self.kind == "dhc":
            return ("US", "state", "county", "prim", "tract_subset_group", "tract_subset", "block_group",
                    "block")
        mid = ("tract_group",) if self.tract_groups else ()
        return ("US", "state", "county", *mid, "tract", "block_group", "block")


def preset(name: str, beta: Sequence[Any], fanout_cutoff: int, **kw: Any) -> SpineConfig:
    """S22 presets: ``pl94_persons`` (6 levels; AIAN, GQ, MCD, place), ``pl94_units`` (same minus GQ),
    ``dhc`` (8 levels; SD, CBG), ``pr`` (PL persons spine rooted at the PR state; β given for the 6 levels is
    renormalised over the 5 levels below the US so its global PLB matches the US run — the US share is spread
    proportionally, a [?] decision)."""
    b = tuple(exact_share(v, "β") for v in beta)
    if name == "pl94_persons":
        return SpineConfig(beta=b, fanout_cutoff=fanout_cutoff, **kw)
    if name == "pl94_units":
        return SpineConfig(beta=b, fanout_cutoff=fanout_cutoff, ose_categories=("AIAN", "MCD", "PLACE"), **kw)
    if name == "dhc":
        return SpineConfig(beta=b, fanout_cutoff=fanout_cutoff, kind="dhc", ose_categories=("SD", "CBG"),
                           **kw)
    if name == "pr":
        if len(b) == 6:
            rest = b[1:]
            s = sum(rest, Fraction(0))
            b = (Fraction(0), *(x / s for x in rest))
        return _pr_config(b, fanout_cutoff, **kw)
    raise InputError(f"spine: unknown preset {name!r}")


def _pr_config(beta: tuple[Fraction, ...], fanout_cutoff: int, **kw: Any) -> SpineConfig:
    """PR: the root sits at the state level (the 'US' level has a single child, the PR state, β = 0 there is
    not allowed, so the root *is* the state: levels state, county, tract, block_group, block)."""
    b = tuple(x for x in beta if x != 0)
    cfg = _PRSpineConfig(beta=b, fanout_cutoff=fanout_cutoff, universe="PR", **kw)
    return cfg


@dataclass(frozen=True)
class _PRSpineConfig(SpineConfig):
    @property
    def levels(self) -> tuple[str, ...]:
        mid = ("tract_group",) if self.tract_groups else ()
        return ("state", "county", *mid, "tract", "block_group", "block")


@dataclass
class Spine:
    """An internal spine. Level 0 is the root; the last level is the block (one unit per block).

    ``gamma_num[l][u] / denominator`` is γ of unit u (exact). ``block_unit[l][b]`` is the unit at level l on
    block b's path (blocks in internal order; ``block_geoid`` maps back to standard geography, S21).
    """

    levels: tuple[str, ...]
    parent: list[IntArray]
    gamma_num: list[IntArray]
    denominator: int
    labels: list[ObjArray]
    block_geoid: ObjArray
    block_source_row: IntArray
    beta: tuple[Fraction, ...]
    privacy_rule: str
    bypassed: list[int] = field(default_factory=list)
    diagnostics: dict[str, Any] = field(default_factory=dict)
    input_hash: str = ""

    @property
    def n_levels(self) -> int:
        return len(self.levels)

    def n_units(self, level: int) -> int:
        return int(self.parent[level].shape[0])

    def fanout(self, level: int) -> IntArray:
        """Children per unit of ``level`` (level < last)."""
        return np.bincount(self.parent[level + 1], minlength=self.n_units(level)).astype(np.int64)

    @functools.cached_property
    def _family_memo(self) -> dict[int, tuple[IntArray, IntArray, IntArray, IntArray]]:
        return {}

    def families(self, level: int) -> tuple[IntArray, IntArray, IntArray, IntArray]:
        """Level ``level``'s (≥ 1) units grouped by parent, built once per spine and level (a post-processing
        worker solves many parts of one level; each would otherwise sort the nation's units again): ``order``
        (the units sorted by parent, stable), ``fan`` (children per unit of level − 1), ``first`` (where each
        parent's children start in ``order``) and the parents of unmeasured children (γ = 0; sorted)."""
        if level not in self._family_memo:
            par = self.parent[level]
            order = np.argsort(par, kind="stable").astype(np.int64)
            fan = self.fanout(level - 1)
            first = np.concatenate([[0], np.cumsum(fan)[:-1]]).astype(np.int64)
            self._family_memo[level] = (order, fan, first, unique(par[self.gamma_num[level] == 0]))
        return self._family_memo[level]

    def gamma(self, level: int) -> list[Fraction]:
        return [Fraction(int(g), self.denominator) for g in self.gamma_num[level]]

    @functools.cached_property
    def block_geoids(self) -> pa.Array:
        """The block GEOIDs (internal order) as one Arrow string array (no Python string per person)."""
        return pa.array(self.block_geoid.astype(str), type=pa.string())

    @functools.cached_property
    def block_index(self) -> GeoidIndex:
        """Person GEOIDs → internal block index (:class:`GeoidIndex` over :attr:`block_geoids`, built once per
        spine)."""
        return GeoidIndex(self.block_geoids)

    @property
    def block_unit(self) -> list[IntArray]:
        nb = self.block_geoid.shape[0]
        out: list[IntArray] = [np.zeros(0, dtype=np.int64)] * self.n_levels
        cur = np.arange(nb, dtype=np.int64)
        out[-1] = cur
        for l in range(self.n_levels - 1, 0, -1):
            cur = self.parent[l][cur]
            out[l - 1] = cur
        return out

    def block_range(self, level: int) -> tuple[IntArray, IntArray]:
        """First and one-past-last block (internal order) of every unit: blocks are contiguous (S5)."""
        bu = self.block_unit[level]
        n = self.n_units(level)
        units = np.arange(n)
        return (np.searchsorted(bu, units, side="left").astype(np.int64),
                np.searchsorted(bu, units, side="right").astype(np.int64))

    def geounit_table(self) -> pd.DataFrame:
        """Geounit table: internal id, level, parent id, γ as an exact fraction string, block count."""
        frames = []
        bu = self.block_unit
        for l, name in enumerate(self.levels):
            par = self.parent[l]
            plabels = self.labels[l - 1][par] if l > 0 else np.array([""], dtype=object)
            frames.append(pd.DataFrame({
                "GEOUNIT": self.labels[l], "LEVEL": name, "PARENT": plabels,
                "GAMMA": [str(g) for g in self.gamma(l)],
                "BLOCKS": np.bincount(bu[l], minlength=self.n_units(l)),
            }))
        return pd.concat(frames, ignore_index=True)

    def block_paths(self) -> pd.DataFrame:
        """Block GEOID → internal id at every level (S6 bijection; S21 published geography from GEOID)."""
        data: dict[str, Any] = {"GEOID": self.block_geoid}
        for l, name in enumerate(self.levels):
            data[name] = self.labels[l][self.block_unit[l]]
        return pd.DataFrame(data)


# ----------------------------------------------------------------------------------------------------------
# input normalisation
# ----------------------------------------------------------------------------------------------------------

def _col(df: pd.DataFrame, name: str, default: str) -> pd.Series | npt.NDArray[np.str_]:
    """A block column as text (the default where the table has no such column; a missing value reads "nan"),
    by position: the column's own text array when it has no missing value (no copy per block)."""
    if name not in df.columns:
        return np.full(len(df), default, dtype=object).astype(str)
    text = df[name].astype(str)
    if not bool(text.isna().any()):
        return pd.Series(text.array)
    return text.to_numpy().astype(str)


#: the OSE input columns of ``normalise_blocks``' result and the text a block without the column gets
_OSE_INPUTS = (("AIANNHCE", "9999"), ("PLACEFP", "99999"), ("COUSUBFP", "99999"), ("GQ_TYPES", "0"),
               ("SDUNI", "99999"), ("PRIM", "R"))
#: the GEOID's digit columns and widths, in GEOID order
_GEOID_PARTS = (("TABBLKST", 2), ("TABBLKCOU", 3), ("TABTRACTCE", 6), ("TABBLK", 4))
#: the text dtype of ``normalise_blocks``' columns (pandas' default ``str``)
_TEXT = pd.StringDtype(storage="pyarrow", na_value=np.nan)


def _arrow_text(blocks: pd.DataFrame, name: str) -> pa.Array | None:
    """A column of ``str`` dtype with no missing value as Arrow text; None for any other column."""
    col = blocks[name]
    if col.dtype != _TEXT or bool(col.isna().any()):
        return None
    return pa.array(col.array)


def _normalised_arrow(blocks: pd.DataFrame) -> pd.DataFrame | None:
    """:func:`normalise_blocks`' result through Arrow kernels and integer keys (no Python or NumPy string per
    block), for the common input: text columns without missing values, every GEOID 15 ASCII digits, no block
    twice, every AIANNHCE an integer. Anything else gives None and the general path decides (and names the
    row): so the result, where there is one, is the general path's (same values, order and dtypes)."""
    if "GEOID" in blocks.columns:
        geoid = _arrow_text(blocks, "GEOID")
    else:
        parts = [_arrow_text(blocks, c) for c, _ in _GEOID_PARTS] if {c for c, _ in _GEOID_PARTS} <= set(
            blocks.columns) else [None]
        if any(a is None for a in parts):
            return None
        # zero-padded on the left: str.zfill's text wherever the result is all digits (zfill differs only after
        # a sign, which no digit string has)
        geoid = pc.binary_join_element_wise(*(pc.utf8_lpad(a, width, "0")
                                              for a, (_, width) in zip(parts, _GEOID_PARTS, strict=True)),
                                            pa.scalar("", pa.large_string()))
    other = {c: _arrow_text(blocks, c) if c in blocks.columns else pa.repeat(pa.scalar(default, pa.large_string()),
                                                                           len(blocks))
             for c, default in _OSE_INPUTS}
    if geoid is None or any(a is None for a in other.values()) or len(blocks) == 0:
        return None
    if not pc.all(pc.match_substring_regex(geoid, r"^[0-9]{15}$")).as_py():
        return None
    key = pc.cast(geoid, pa.int64()).to_numpy()
    order = np.argsort(key, kind="stable")  # fixed-width digit strings: text order is integer order
    if bool((key[order][1:] == key[order][:-1]).any()):
        return None
    try:
        aian = pc.cast(other["AIANNHCE"], pa.int64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    take = pa.array(order)
    geoid = pc.take(geoid, take)
    text = {"GEOID": geoid, "ST": pc.utf8_slice_codeunits(geoid, 0, 2), "CTY": pc.utf8_slice_codeunits(geoid, 2, 5),
            "TRACT": pc.utf8_slice_codeunits(geoid, 5, 11), "BG": pc.utf8_slice_codeunits(geoid, 11, 12),
            "BLK": pc.utf8_slice_codeunits(geoid, 11, 15), **{c: pc.take(a, take) for c, a in other.items()}}
    return pd.DataFrame({"ROW": order.astype(np.int64),
                         **{c: pd.Series(pd.array(a, dtype=_TEXT), copy=False) for c, a in text.items()},
                         AIAN_NUMBER: aian[order]})


def normalise_blocks(blocks: pd.DataFrame, source: str = "<blocks>") -> pd.DataFrame:
    """Validate a block geography table; returns GEOID-sorted columns ST, CTY, TRACT, BLK, BG + OSE inputs.

    The common input (text columns, valid) goes through Arrow and integer keys (:func:`_normalised_arrow`:
    national geography 33 → 10 CPU-s); anything else, and every refusal, through the general path below."""
    extra = set(blocks.columns) - GEOGRAPHY_COLUMNS
    if extra:
        raise InputError(f"spine input may hold public geography only; unexpected columns {sorted(extra)} "
                         "(person data must never reach the spine, S20)", file=source,
                         column=sorted(extra)[0])
    fast = _normalised_arrow(blocks)
    if fast is not None:
        return fast
    if "GEOID" in blocks.columns:
        geoid = blocks["GEOID"].astype(str).to_numpy().astype(str)
    elif {"TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"} <= set(blocks.columns):
        geoid = (blocks["TABBLKST"].astype(str).str.zfill(2) + blocks["TABBLKCOU"].astype(str).str.zfill(3)
                 + blocks["TABTRACTCE"].astype(str).str.zfill(6) + blocks["TABBLK"].astype(str).str.zfill(4)
                 ).to_numpy().astype(str)
    else:
        raise InputError("spine input needs GEOID or TABBLKST/TABBLKCOU/TABTRACTCE/TABBLK", file=source)
    lens = np.char.str_len(geoid)
    bad = np.flatnonzero((lens != 15) | ~np.char.isdigit(geoid))
    if bad.size:
        raise InputError(f"block GEOID {geoid[bad[0]]!r} is not 15 digits", file=source, row=int(bad[0]) + 2,
                         column="GEOID")
    s = pd.Series(geoid)  # one text column, sliced below (15 digits each: checked above)
    del geoid
    dup = np.flatnonzero(s.duplicated().to_numpy())
    if dup.size:
        raise InputError(f"duplicate block GEOID {s.iloc[dup[0]]!r}: one row per block (a person or unit "
                         "table cannot be a spine input)", file=source, row=int(dup[0]) + 2, column="GEOID")
    out = pd.DataFrame({
        "ROW": np.arange(len(blocks), dtype=np.int64),
        "GEOID": s,
        "ST": s.str[:2],
        "CTY": s.str[2:5],
        "TRACT": s.str[5:11],
        "BG": s.str[11:12],
        "BLK": s.str[11:15],
        "AIANNHCE": _col(blocks, "AIANNHCE", "9999"),
        "PLACEFP": _col(blocks, "PLACEFP", "99999"),
        "COUSUBFP": _col(blocks, "COUSUBFP", "99999"),
        "GQ_TYPES": _col(blocks, "GQ_TYPES", "0"),
        "SDUNI": _col(blocks, "SDUNI", "99999"),
        "PRIM": _col(blocks, "PRIM", "R"),
    })
    aian = pd.to_numeric(out["AIANNHCE"], errors="coerce")
    badaian = np.flatnonzero(aian.isna().to_numpy())
    if badaian.size:
        raise InputError(f"AIANNHCE {out['AIANNHCE'].iloc[badaian[0]]!r} is not numeric", file=source,
                         row=int(badaian[0]) + 2, column="AIANNHCE")
    out[AIAN_NUMBER] = aian.to_numpy().astype(np.int64)  # parsed once: every OSE category tests the AIAN ranges
    return out.sort_values("GEOID", kind="stable").reset_index(drop=True)


#: ``normalise_blocks``' column of AIANNHCE as an integer
AIAN_NUMBER = "AIAN_NUMBER"


def _aian(df: pd.DataFrame) -> pd.Series:
    """The blocks' AIANNHCE codes as integers when parsed already, else as text."""
    return df[AIAN_NUMBER] if AIAN_NUMBER in df.columns else df["AIANNHCE"]


def _in_aian(codes: pd.Series, ranges: Sequence[tuple[int, int]]) -> npt.NDArray[np.bool_]:
    """Whether each AIANNHCE code (integers, or digit strings) lies in one of the AIAN ``ranges``."""
    if pd.api.types.is_integer_dtype(codes.dtype):
        v = codes.to_numpy().astype(np.int64, copy=False)
    else:
        v = pd.to_numeric(codes).to_numpy().astype(np.int64)
    m = np.zeros(v.shape, dtype=bool)
    for lo, hi in ranges:
        m |= (v >= lo) & (v <= hi)
    return m


def _tagged(df: pd.DataFrame, ok: npt.NDArray[np.bool_], tag: str, columns: Sequence[str], outside: str
            ) -> pd.Series:
    """``tag`` + the columns' text joined where ``ok``, else ``outside`` (Arrow kernels, no Python string
    per block)."""
    joined = pc.binary_join_element_wise(tag, *(pa.array(df[c], type=pa.string()) for c in columns), "")
    text = pc.if_else(pa.array(ok), joined, outside)
    return pd.Series(pd.array(text, dtype=df["ST"].dtype), index=df.index)


def ose_codes(df: pd.DataFrame, category: Category, aian_ranges: Sequence[tuple[int, int]]) -> pd.Series:
    """Per-block OSE code of one category; every block is in exactly one OSE of each category ('outside' is
    itself an OSE, as in the paper). MCD/place follow [EXT] I1: MCD iff strong-MCD state and outside AIAN."""
    in_aian = _in_aian(_aian(df), aian_ranges)
    if category == "AIAN":
        return _tagged(df, in_aian, "A", ["AIANNHCE"], "A-out")
    if category == "GQ":
        return "G" + df["GQ_TYPES"]
    strong = df["ST"].isin(STRONG_MCD_STATES).to_numpy()
    mcd_case = strong & ~in_aian
    if category == "MCD":
        ok = mcd_case & (df["COUSUBFP"] != "99999").to_numpy()
        return _tagged(df, ok, "M", ["ST", "CTY", "COUSUBFP"], "M-out")
    if category == "PLACE":
        ok = ~mcd_case & (df["PLACEFP"] != "99999").to_numpy()
        return _tagged(df, ok, "P", ["ST", "PLACEFP"], "P-out")
    if category == "SD":
        ok = (df["SDUNI"] != "99999").to_numpy()
        return _tagged(df, ok, "S", ["ST", "SDUNI"], "S-out")
    if category == "CBG":
        return "C" + df["ST"] + df["CTY"] + df["TRACT"] + df["BG"]
    raise InputError(f"unknown OSE category {category!r}")


# ----------------------------------------------------------------------------------------------------------
# building blocks
# ----------------------------------------------------------------------------------------------------------

def _codes(values: pd.Series | npt.NDArray[Any]) -> IntArray:
    codes, _ = pd.factorize(pd.Series(values), sort=True)
    return codes.astype(np.int64)


def _chunk(group: IntArray, cap_of_group: IntArray) -> IntArray:
    """Within each group (blocks in GEOID order) the balanced chunk number, chunks of ≤ cap blocks."""
    order = np.argsort(group, kind="stable")
    g = group[order]
    m = np.bincount(g).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(m)[:-1]])
    rank = np.arange(g.size, dtype=np.int64) - starts[g]
    cap = cap_of_group[g]
    k = -(-m[g] // cap)
    out = np.empty_like(group)
    out[order] = rank * k // m[g]
    return out


def _cap(n: IntArray, cutoff: int) -> IntArray:
    """``int(√n + fanout_cutoff)`` per group (≥ 1)."""
    out: IntArray = np.maximum(1, np.floor(np.sqrt(n.astype(np.float64)) + cutoff).astype(np.int64))
    return out


def _group_within(parent_uid: IntArray, cell: IntArray, cutoff: int) -> IntArray:
    """Group children (items) of each parent by membership cell, chunks of ≤ int(√n + cutoff) items where
    n = items of the parent. Returns a per-item sub-key (cell, chunk) code."""
    n_par = np.bincount(parent_uid).astype(np.int64)
    key = _codes(parent_uid.astype(np.int64) * (int(cell.max(initial=0)) + 1) + cell)
    chunk = _chunk(key, _cap(n_par, cutoff)[parent_uid[np.unique(key, return_index=True)[1]]])
    return cell * (int(chunk.max(initial=0)) + 1) + chunk


def _unit_ids(comps: Sequence[IntArray]) -> list[IntArray]:
    """Unit id per block at every level: level 0 = root (0); level l = (unit at l-1, comps[l-1])."""
    nb = comps[0].shape[0] if comps else 0
    ids = [np.zeros(nb, dtype=np.int64)]
    for c in comps:
        prev = ids[-1]
        key = prev * (int(c.max(initial=0)) + 1) + c
        ids.append(_codes(key))
    return ids


def _text(labels: Labels, rows: IntArray) -> pa.Array:
    """Some rows of a component's labels as Arrow text (no Python string per block)."""
    if isinstance(labels, pd.Series):
        return pa.array(labels, type=pa.string()).take(pa.array(rows))
    return pa.array(labels[rows], type=pa.string())


def _assemble(df: pd.DataFrame, levels: tuple[str, ...], comps: list[IntArray], comp_labels: list[Labels],
              beta: tuple[Fraction, ...], rule: str) -> Spine:
    """Sort blocks by their path, derive parents, labels and initial γ = β[l]."""
    ids = _unit_ids(comps)
    order = np.lexsort(tuple(reversed(ids)))
    ids = [i[order] for i in ids]
    parents: list[IntArray] = [np.array([-1], dtype=np.int64)]
    labels: list[ObjArray] = [np.array([levels[0]], dtype=object)]
    for l in range(1, len(levels)):
        first = np.unique(ids[l], return_index=True)[1]
        parents.append(ids[l - 1][first].astype(np.int64))
        # "parent label|component label", joined in Arrow (no fixed-width text copies of the block level)
        lab = pa.array(labels[l - 1], type=pa.string()).take(pa.array(parents[l]))
        sub = _text(comp_labels[l - 1], order[first])
        labels.append(np.asarray(pc.binary_join_element_wise(lab, sub, "|").to_numpy(zero_copy_only=False),
                                 dtype=object))
    den = math.lcm(*[f.denominator for f in beta])
    gamma = [np.full(parents[l].shape[0], int(beta[l] * den), dtype=np.int64) for l in range(len(levels))]
    return Spine(levels=levels, parent=parents, gamma_num=gamma, denominator=den, labels=labels,
                 block_geoid=df["GEOID"].to_numpy()[order].astype(object),
                 block_source_row=df["ROW"].to_numpy()[order].astype(np.int64), beta=beta, privacy_rule=rule)


def _standard_components(df: pd.DataFrame, cfg: SpineConfig, obg: bool,
                         tract_group: IntArray | None) -> tuple[list[IntArray], list[Labels]]:
    """Per-level component codes/labels for the (AIAN) spine; OBGs if ``obg`` else standard BGs."""
    aian = (_in_aian(_aian(df), cfg.aian_ranges) & cfg.aian_split).astype(np.int64)
    st_lab = df["ST"] + np.where(aian == 1, "A", "N")
    comps: list[IntArray] = []
    labs: list[Labels] = []
    root_is_state = cfg.levels[0] == "state"
    if not root_is_state:
        comps.append(_codes(st_lab))
        labs.append(st_lab)
    elif df["ST"].nunique() > 1:
        raise InputError("a PR/state-rooted spine needs the blocks of exactly one state")
    comps.append(_codes(df["CTY"]))
    labs.append(df["CTY"])
    if cfg.kind == "dhc":
        return _dhc_components(df, cfg, comps, labs, obg)
    if cfg.tract_groups:
        tg = tract_group if tract_group is not None else _codes(df["TRACT"])
        comps.append(tg)
        labs.append(np.char.add("TG", tg.astype(str)))
    comps.append(_codes(df["TRACT"]))
    labs.append(df["TRACT"])
    if obg:
        tract_uid = _unit_ids(comps)[-1]
        cell = _codes(_membership(df, cfg))
        sub = _group_within(tract_uid, cell, cfg.fanout_cutoff)
        code = _codes(sub)
        comps.append(code)
        labs.append(np.char.add("G", code.astype(str)))
    else:
        comps.append(_codes(df["BG"]))
        labs.append(df["BG"])
    comps.append(_codes(df["BLK"]))
    labs.append(df["BLK"])
    return comps, labs


def _dhc_components(df: pd.DataFrame, cfg: SpineConfig, comps: list[IntArray], labs: list[Labels],
                    obg: bool) -> tuple[list[IntArray], list[Labels]]:
    """DHC: prim (E&P place ∩ county, else remainder), tract subset groups (tract subsets of a prim in chunks
    of ≤ √n + cutoff, GEOID order), tract subsets (tract ∩ prim ∩ AIAN side), OBGs by (SD, CBG)."""
    comps.append(_codes(df["PRIM"]))
    labs.append(df["PRIM"])
    prim_uid = _unit_ids(comps)[-1]
    tract_code = _codes(df["TRACT"])
    # items = tract subsets; chunk them within the prim
    ts_key = _codes(prim_uid * (int(tract_code.max(initial=0)) + 1) + tract_code)
    first = np.unique(ts_key, return_index=True)[1]
    ts_parent = prim_uid[first]
    n_par = np.bincount(ts_parent).astype(np.int64)
    ts_chunk = _chunk(ts_parent, _cap(n_par, cfg.fanout_cutoff))
    tsg = ts_chunk[ts_key]
    comps.append(tsg.astype(np.int64))
    labs.append(np.char.add("TSG", tsg.astype(str)))
    comps.append(tract_code)
    labs.append(df["TRACT"])
    if obg:
        ts_uid = _unit_ids(comps)[-1]
        cell = _codes(_membership(df, cfg))
        code = _codes(_group_within(ts_uid, cell, cfg.fanout_cutoff))
        comps.append(code)
        labs.append(np.char.add("G", code.astype(str)))
    else:
        comps.append(_codes(df["BG"]))
        labs.append(df["BG"])
    comps.append(_codes(df["BLK"]))
    labs.append(df["BLK"])
    return comps, labs


def _membership(df: pd.DataFrame, cfg: SpineConfig) -> pd.Series:
    """The OSE membership vector of every block (one code per category), as one string key."""
    codes = [pa.array(ose_codes(df, cat, cfg.aian_ranges), type=pa.string()) for cat in cfg.ose_categories]
    if not codes:
        return pd.Series([""] * len(df), index=df.index)
    key = pc.binary_join_element_wise("", *codes, "/")  # "/code1/code2/…", one Arrow kernel
    return pd.Series(pd.array(key, dtype=df["ST"].dtype), index=df.index)


# ----------------------------------------------------------------------------------------------------------
# OSED on a spine
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OseTable:
    """All OSEs: their names and, per category, every block's OSE id (internal block order)."""

    names: ObjArray
    category: ObjArray
    block_ose: list[IntArray]


def ose_table(df_sorted_internal: pd.DataFrame, cfg: SpineConfig) -> OseTable:
    names: list[Any] = []
    cats: list[str] = []
    per_cat: list[IntArray] = []
    offset = 0
    for cat in cfg.ose_categories:
        codes, uniq = pd.factorize(ose_codes(df_sorted_internal, cat, cfg.aian_ranges), sort=True)
        per_cat.append(codes.astype(np.int64) + offset)
        names.extend(list(uniq))
        cats.extend([cat] * len(uniq))
        offset += len(uniq)
    return OseTable(names=np.array(names, dtype=object), category=np.array(cats, dtype=object),
                    block_ose=per_cat)


def spine_osed(spine: Spine, oses: OseTable) -> IntArray:
    """OSED (Algorithm 1) of every OSE on ``spine`` (ids as in ``oses``)."""
    parents = [spine.parent[l] for l in range(spine.n_levels - 1, 0, -1)]
    fanouts = [spine.fanout(l - 1) for l in range(spine.n_levels - 1, 0, -1)]
    res = np.zeros(len(oses.names), dtype=np.int64)
    for bo in oses.block_ose:
        top = osed_up(leaf_pairs(bo), parents, fanouts)[-1]
        res[top.ose] = top.c
    return res


# ----------------------------------------------------------------------------------------------------------
# Algorithm 2: tract groups (greedy leximax)
# ----------------------------------------------------------------------------------------------------------

def tract_groups_alg2(spine: Spine, oses: OseTable, fanout_cutoff: int) -> tuple[IntArray, int]:
    """Algorithm 2 on a spine that has a ``tract_group`` level (initially one tract per group).

    Works on the tract-level reduced tree: the (c, c') of every OSE at each tract unit do not depend on how
    tracts are grouped, so a candidate merge is evaluated by re-running the recursion from the tract level up.
    Returns the tract-group id (per tract unit, new numbering within counties) and the number of merges.
    """
    lt = spine.levels.index("tract")
    ltg = lt - 1
    lc = ltg - 1
    up_parents = [spine.parent[l] for l in range(spine.n_levels - 1, lt, -1)]
    up_fanouts = [spine.fanout(l - 1) for l in range(spine.n_levels - 1, lt, -1)]
    tract_pairs: list[OsedPairs] = [osed_up(leaf_pairs(bo), up_parents, up_fanouts)[-1]
                                    for bo in oses.block_ose]
    leaf = OsedPairs(ose=np.concatenate([p.ose for p in tract_pairs]),
                     unit=np.concatenate([p.unit for p in tract_pairs]),
                     c=np.concatenate([p.c for p in tract_pairs]),
                     cc=np.concatenate([p.cc for p in tract_pairs]))
    n_ose = len(oses.names)
    tract_county = spine.parent[ltg][spine.parent[lt]]
    group = np.arange(spine.n_units(lt), dtype=np.int64)  # tract group id per tract (global)
    upper_parents = [spine.parent[l] for l in range(lc, 0, -1)]
    upper_fanouts = [spine.fanout(l - 1) for l in range(lc, 0, -1)]

    def evaluate(g: IntArray) -> IntArray:
        codes, inv = np.unique(g, return_inverse=True)
        tg_county = np.zeros(codes.size, dtype=np.int64)
        tg_county[inv] = tract_county
        fan_tg = np.bincount(inv, minlength=codes.size).astype(np.int64)
        fan_c = np.bincount(tg_county, minlength=spine.n_units(lc)).astype(np.int64)
        return osed_root(leaf, [inv.astype(np.int64), tg_county, *upper_parents],
                         [fan_tg, fan_c, *upper_fanouts], n_ose)

    current = evaluate(group)
    merges = 0
    n_tracts_county = np.bincount(tract_county, minlength=spine.n_units(lc))
    changed = True
    while changed:
        changed = False
        for county in range(spine.n_units(lc)):
            cap = math.sqrt(int(n_tracts_county[county])) + fanout_cutoff
            restart = True
            while restart:
                restart = False
                members = np.flatnonzero(tract_county == county)
                gids = unique(group[members])
                sizes = {int(g): int(np.count_nonzero(group[members] == g)) for g in gids}
                for i in range(gids.size):
                    for j in range(i + 1, gids.size):
                        u, v = int(gids[i]), int(gids[j])
                        if sizes[u] + sizes[v] > cap:
                            continue
                        cand = group.copy()
                        cand[cand == v] = u
                        test = evaluate(cand)
                        if leximax_le(test, current):
                            group, current = cand, test
                            merges += 1
                            changed = True
                            restart = True
                            break
                    if restart:
                        break
    return group, merges


# ----------------------------------------------------------------------------------------------------------
# Algorithm 3: bypass to the Pareto frontier
# ----------------------------------------------------------------------------------------------------------

def move_to_pareto_frontier(spine: Spine, rule: Literal["zcdp", "puredp"],
                            force: Mapping[int, npt.NDArray[np.bool_]] | None = None) -> Spine:
    """Algorithm 3 with the Sec 5 bypass (§4.4): bottom-up from the level above the blocks to level 1 (the
    root is never bypassed). zCDP bypasses iff c = 1; pure DP iff min γ_child ≥ (c − 1)·γ_parent/2 (exact
    integer comparison of γ numerators). A bypassed parent P is replaced by c copies P_i (γ(P)+γ(ch_i), one
    child each) and γ(ch_i) := 0. Path sums of γ are unchanged. ``force[l]`` (analysis/tests only) replaces
    the rule's decision at level l by a given mask over that level's units.
    """
    parent = [p.copy() for p in spine.parent]
    gamma = [g.copy() for g in spine.gamma_num]
    labels = [lab.copy() for lab in spine.labels]
    bypassed = [0] * spine.n_levels
    for l in range(spine.n_levels - 2, 0, -1):
        ch_par = parent[l + 1]
        n = parent[l].shape[0]
        c = np.bincount(ch_par, minlength=n).astype(np.int64)
        big = np.iinfo(np.int64).max
        min_child = np.full(n, big, dtype=np.int64)
        np.minimum.at(min_child, ch_par, gamma[l + 1])
        mask = 2 * min_child >= (c - 1) * gamma[l] if rule == "puredp" else c == 1
        if force is not None and l in force:
            mask = np.asarray(force[l], dtype=bool).copy()
        mask &= c >= 1
        bypassed[l] = int(mask.sum())
        if not mask.any():
            continue
        # new level l: non-bypassed parents keep their place; each bypassed parent becomes one copy per child
        child_bp = mask[ch_par]
        keep_ids = np.flatnonzero(~mask)
        copy_children = np.flatnonzero(child_bp)
        new_src = np.concatenate([keep_ids, ch_par[copy_children]])   # source parent of each new unit
        order = np.argsort(new_src, kind="stable")                     # keep units grouped in original order
        new_src = new_src[order]
        is_copy = np.concatenate([np.zeros(keep_ids.size, bool), np.ones(copy_children.size, bool)])[order]
        copy_child = np.concatenate([np.full(keep_ids.size, -1), copy_children])[order]
        new_gamma = gamma[l][new_src].copy()
        new_gamma[is_copy] += gamma[l + 1][copy_child[is_copy]]
        new_labels = labels[l][new_src].copy()
        multi = c[new_src] > 1
        sel = is_copy & multi
        if sel.any():
            new_labels[sel] = np.char.add(np.char.add(new_labels[sel].astype(str), "~"),
                                          labels[l + 1][copy_child[sel]].astype(str)).astype(object)
        # remap children: kept parents' children → position of that parent; bypassed children → their copy
        pos_keep = np.full(n, -1, dtype=np.int64)
        keep_pos = np.flatnonzero(~is_copy)
        pos_keep[new_src[keep_pos]] = keep_pos
        new_ch_par = pos_keep[ch_par]
        copy_pos = np.flatnonzero(is_copy)
        new_ch_par[copy_child[copy_pos]] = copy_pos
        g_child = gamma[l + 1].copy()
        g_child[copy_children] = 0
        parent[l] = parent[l][new_src]
        parent[l + 1] = new_ch_par
        gamma[l] = new_gamma
        gamma[l + 1] = g_child
        labels[l] = new_labels
    out = Spine(levels=spine.levels, parent=parent, gamma_num=gamma, denominator=spine.denominator,
                labels=labels, block_geoid=spine.block_geoid, block_source_row=spine.block_source_row,
                beta=spine.beta, privacy_rule=rule, bypassed=bypassed, diagnostics=dict(spine.diagnostics),
                input_hash=spine.input_hash)
    return out


# ----------------------------------------------------------------------------------------------------------
# invariant, diagnostics, build
# ----------------------------------------------------------------------------------------------------------

def check_privacy_invariant(spine: Spine) -> dict[str, Any]:
    """S14: every γ ≥ 0 and every block's root-to-block γ sum equals Σβ (exact integers over the common
    denominator). Raises :class:`PrivacyInvariantError` otherwise; returns the certificate."""
    total = sum(spine.beta, Fraction(0))
    want = total * spine.denominator
    if want.denominator != 1:
        raise PrivacyInvariantError("Σβ is not representable over the γ denominator")
    for l, g in enumerate(spine.gamma_num):
        if (g < 0).any():
            raise PrivacyInvariantError(f"negative γ at level {spine.levels[l]}")
    bu = spine.block_unit
    path = np.zeros(spine.block_geoid.shape[0], dtype=np.int64)
    for l in range(spine.n_levels):
        path += spine.gamma_num[l][bu[l]]
    bad = np.flatnonzero(path != int(want))
    if bad.size:
        j = int(bad[0])
        raise PrivacyInvariantError(
            f"privacy invariant violated: block {spine.block_geoid[j]} has path sum "
            f"{Fraction(int(path[j]), spine.denominator)} ≠ Σβ = {total} ({bad.size} blocks affected)")
    return {"invariant": "for every block, Σ_ancestors γ = Σβ exactly; every γ ≥ 0",
            "sum_beta": str(total), "denominator": spine.denominator,
            "blocks_checked": int(path.shape[0]), "violations": 0,
            "min_path_sum": str(Fraction(int(path.min(initial=int(want))), spine.denominator)),
            "max_path_sum": str(Fraction(int(path.max(initial=int(want))), spine.denominator))}


def level_diagnostics(spine: Spine) -> list[dict[str, Any]]:
    """S24 per level: units, fanout distribution, bypassed count, γ histogram."""
    out = []
    for l, name in enumerate(spine.levels):
        rec: dict[str, Any] = {"level": name, "units": spine.n_units(l),
                               "bypassed": spine.bypassed[l] if spine.bypassed else 0}
        if l < spine.n_levels - 1:
            f = spine.fanout(l)
            vals, cnt = np.unique(f, return_counts=True)
            rec["fanout_hist"] = {int(v): int(c) for v, c in zip(vals, cnt, strict=True)}
            rec["max_fanout"] = int(f.max(initial=0))
        vals, cnt = np.unique(spine.gamma_num[l], return_counts=True)
        rec["gamma_hist"] = {str(Fraction(int(v), spine.denominator)): int(c)
                             for v, c in zip(vals, cnt, strict=True)}
        out.append(rec)
    return out


def _hash_inputs(blocks: pd.DataFrame, cfg: SpineConfig) -> str:
    h = hashlib.sha256()
    h.update(repr(sorted(blocks.columns)).encode())
    h.update(pd.util.hash_pandas_object(blocks[sorted(blocks.columns)], index=False).to_numpy().tobytes())
    h.update(repr(cfg).encode())
    h.update(b"dasflow-topdown-spine-v1")
    return h.hexdigest()


def build_spine(blocks: pd.DataFrame, cfg: SpineConfig, *, source: str = "<blocks>",
                cache_dir: str | os.PathLike[str] | None = None) -> Spine:
    """Build the optimised spine: AIAN spine → OBGs → (Alg 2) → Alg 3 → S14 check → diagnostics (S24).

    Deterministic; cached under ``cache_dir`` as ``spine-{key}.npz`` (:func:`spine_bytes`), key = SHA-256 of
    (block geography, config). A cache file that is unreadable, malformed, fails S14 or holds another key's spine
    is not used: the spine is rebuilt and the file overwritten.
    """
    key = _hash_inputs(blocks, cfg)
    cache_path = Path(cache_dir) / f"spine-{key}.npz" if cache_dir is not None else None
    spine = _BUILT.get(key)  # the same public geography and settings, already built (or read) in this process
    write = False
    if cache_path is not None:
        if spine is None:
            spine = _read_cached(cache_path, key)
        write = spine is None or not cache_path.exists()
    if spine is None:
        spine = _build(blocks, cfg, key, source)
    if _BUILT.get(key) is not spine:
        _BUILT.clear()  # one spine kept (≈ 0.3 GB per 1 M blocks): a process works on one release's geography
        _BUILT[key] = spine
    if cache_path is not None and write:
        data = spine_bytes(spine)
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_path.parent, prefix=".spine-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, cache_path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return spine


def _read_cached(path: Path, key: str) -> Spine | None:
    """The spine cached at ``path`` if it is there, well formed, passes S14 and was built for ``key``; else None."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        spine = spine_from_bytes(data, str(path))
    except (IntegrityError, PrivacyInvariantError) as exc:
        log.warning("spine cache not used, rebuilding: %s", exc)
        return None
    if spine.input_hash != key:
        log.warning("spine cache not used, rebuilding: %s holds the spine of inputs %s", path, spine.input_hash)
        return None
    return spine


#: the last spine built in this process, by the SHA-256 of its block geography and settings (``_hash_inputs``):
#: every TopDown stage of a release reads the public geography again, so a process running several of them
#: (the flow process) builds the spine once (≈ 100 CPU-s at national size). Spines are not changed after
#: ``build_spine`` returns, so sharing one is safe; the key covers every input it is a function of.
_BUILT: dict[str, Spine] = {}


def _build(blocks: pd.DataFrame, cfg: SpineConfig, key: str, source: str) -> Spine:
    """``build_spine``'s computation (no cache)."""
    df = normalise_blocks(blocks, source)
    # the "before" spine: AIAN spine with standard block groups (and one tract per tract group); only its
    # OSEDs are kept (each intermediate is dropped once used: at national size every block-level array counts)
    comps0, labs0 = _standard_components(df, cfg, obg=False, tract_group=None)
    before = _assemble(df, cfg.levels, comps0, labs0, cfg.beta, cfg.privacy_rule)
    del comps0, labs0
    oses_before = ose_table(df.set_index("ROW").loc[before.block_source_row].reset_index(), cfg)
    osed_before, names_before = spine_osed(before, oses_before), oses_before.names
    del before, oses_before
    comps, labs = _standard_components(df, cfg, obg=cfg.optimized_block_groups, tract_group=None)
    spine = _assemble(df, cfg.levels, comps, labs, cfg.beta, cfg.privacy_rule)
    del comps, labs
    df_int = df.set_index("ROW").loc[spine.block_source_row].reset_index()
    del df
    oses = ose_table(df_int, cfg)
    merges = 0
    if cfg.tract_groups and cfg.kind == "pl94":
        tg, merges = tract_groups_alg2(spine, oses, cfg.fanout_cutoff)
        lt = spine.levels.index("tract")
        tg_block = tg[spine.block_unit[lt]]
        df_int = df_int.assign(_TG=tg_block)
        comps, labs = _standard_components(df_int.drop(columns="_TG"), cfg, obg=cfg.optimized_block_groups,
                                           tract_group=_codes(df_int["_TG"]))
        spine = _assemble(df_int, cfg.levels, comps, labs, cfg.beta, cfg.privacy_rule)
        df_int = df_int.set_index("ROW").loc[spine.block_source_row].reset_index()
        oses = ose_table(df_int, cfg)
    osed_after = spine_osed(spine, oses)
    spine = move_to_pareto_frontier(spine, cfg.privacy_rule)
    cert = check_privacy_invariant(spine)
    spine.input_hash = key
    spine.diagnostics = {
        "certificate": cert,
        "levels": level_diagnostics(spine),
        "tract_group_merges": merges,
        "osed": pd.DataFrame({"OSE": oses.names, "CATEGORY": oses.category,
                              "OSED_BEFORE": _align(osed_before, names_before, oses.names),
                              "OSED_AFTER": osed_after}),
    }
    return spine


def _align(values: IntArray, names_from: ObjArray, names_to: ObjArray) -> IntArray:
    m = dict(zip(names_from.tolist(), values.tolist(), strict=True))
    return np.array([m.get(n, 0) for n in names_to.tolist()], dtype=np.int64)


# ----------------------------------------------------------------------------------------------------------
# storage: one self-describing, deterministic object per spine (no pickle)
# ----------------------------------------------------------------------------------------------------------

#: the format tag in every stored spine's header; a reader refuses any other
SPINE_FORMAT = "dasflow-topdown-spine-v1"
_HEADER_KEYS = frozenset({"format", "levels", "denominator", "beta", "privacy_rule", "bypassed", "input_hash",
                          "diagnostics", "osed"})
#: pandas dtypes an ``osed`` column may have (text columns are stored as text, the rest as int64)
_OSED_DTYPES = ("str", "object", "int64")
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # fixed member timestamps: equal spines give equal bytes
_LOAD_ERRORS = (ValueError, OSError, EOFError, KeyError, NotImplementedError, RuntimeError, zipfile.BadZipFile,
                zlib.error)
U8Array = npt.NDArray[np.uint8]


def spine_bytes(spine: Spine) -> bytes:
    """``spine`` as one uncompressed ``.npz`` object: every integer array as int64, every text array as UTF-8
    bytes (uint8) + int64 offsets, and a JSON header (``header``: format tag, levels, β as fraction strings,
    denominator, rule, bypass counts, input hash, diagnostics; the ``osed`` table as typed columns).

    Deterministic (fixed zip timestamps, fixed member order); never pickles. Raises ``ValueError`` for a spine
    the format cannot hold exactly (an integer array not int64, a missing label, diagnostics not JSON).
    """
    diag = dict(spine.diagnostics)
    osed = diag.get("osed")
    if "osed" in diag:
        diag["osed"] = None  # keeps the key's place; the table is stored as arrays
    header: dict[str, Any] = {
        "format": SPINE_FORMAT, "levels": list(spine.levels), "denominator": int(spine.denominator),
        "beta": [str(Fraction(b)) for b in spine.beta], "privacy_rule": spine.privacy_rule,
        "bypassed": [int(b) for b in spine.bypassed], "input_hash": spine.input_hash, "diagnostics": diag,
        "osed": None,
    }
    arrays: dict[str, npt.NDArray[Any]] = {}
    for l in range(spine.n_levels):
        arrays[f"parent_{l}"] = _int64(spine.parent[l], f"parent[{l}]")
        arrays[f"gamma_num_{l}"] = _int64(spine.gamma_num[l], f"gamma_num[{l}]")
        arrays[f"labels_{l}_data"], arrays[f"labels_{l}_offsets"] = _text_arrays(spine.labels[l], f"labels[{l}]")
    arrays["block_geoid_data"], arrays["block_geoid_offsets"] = _text_arrays(spine.block_geoid, "block_geoid")
    arrays["block_source_row"] = _int64(spine.block_source_row, "block_source_row")
    if isinstance(osed, pd.DataFrame):
        if not osed.index.equals(pd.RangeIndex(len(osed))):
            raise ValueError("spine_bytes: the osed table must have a default index")
        columns = []
        for i, (name, col) in enumerate(osed.items()):
            dtype = str(col.dtype)
            if not isinstance(name, str) or dtype not in _OSED_DTYPES:
                raise ValueError(f"spine_bytes: osed column {name!r} of dtype {dtype} cannot be stored")
            if dtype == "int64":
                arrays[f"osed_{i}"] = col.to_numpy(dtype=np.int64)
            else:
                arrays[f"osed_{i}_data"], arrays[f"osed_{i}_offsets"] = _text_arrays(col, f"osed {name}")
            columns.append([name, dtype])
        header["osed"] = {"rows": len(osed), "columns": columns}
    elif osed is not None:
        raise ValueError("spine_bytes: diagnostics['osed'] must be a DataFrame")
    try:
        text = json.dumps(header, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except TypeError as exc:
        raise ValueError(f"spine_bytes: the header is not JSON: {exc}") from exc
    if _diagnostics_from_json(json.loads(text)["diagnostics"]) != diag:
        raise ValueError("spine_bytes: the diagnostics do not survive JSON exactly")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, arr in {"header": np.frombuffer(text.encode(), dtype=np.uint8), **arrays}.items():
            with zf.open(zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_TIME), "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)
    return out.getvalue()


def spine_from_bytes(data: bytes, source: str) -> Spine:
    """The spine :func:`spine_bytes` wrote, equal in every field. Reads with ``allow_pickle=False``, checks the
    structure strictly (format tag, array set, dtypes, lengths, parent ranges, text offsets, UTF-8) and then the
    privacy invariant. Raises :class:`IntegrityError` naming ``source`` for a malformed object and
    :class:`PrivacyInvariantError` for a spine whose γ path sums are off."""
    arrays = _read_npz(data, source)
    header = _header(arrays, source)
    levels: list[str] = header["levels"]
    n = len(levels)
    osed_spec = header["osed"]
    want = {"header", "block_geoid_data", "block_geoid_offsets", "block_source_row"}
    for l in range(n):
        want |= {f"parent_{l}", f"gamma_num_{l}", f"labels_{l}_data", f"labels_{l}_offsets"}
    if osed_spec is not None:
        for i, (_, dtype) in enumerate(osed_spec["columns"]):
            want |= {f"osed_{i}"} if dtype == "int64" else {f"osed_{i}_data", f"osed_{i}_offsets"}
    if set(arrays) != want:
        missing, extra = sorted(want - set(arrays)), sorted(set(arrays) - want)
        raise IntegrityError(f"{source}: spine object has missing arrays {missing} / unexpected arrays {extra}")
    parent = [_int_array(arrays, f"parent_{l}", source) for l in range(n)]
    gamma = [_int_array(arrays, f"gamma_num_{l}", source) for l in range(n)]
    if parent[0].tolist() != [-1]:
        raise IntegrityError(f"{source}: level 0 ({levels[0]}) must be one root unit with parent -1")
    for l in range(1, n):
        p, above = parent[l], parent[l - 1].shape[0]
        if p.size == 0 or p[0] != 0 or p[-1] != above - 1 or ((np.diff(p) < 0) | (np.diff(p) > 1)).any():
            bad = p[(p < 0) | (p >= above)]
            what = f"parent index {int(bad[0])} out of range [0, {above})" if bad.size else \
                "parents not in order or a unit above without children"
            raise IntegrityError(f"{source}: level {levels[l]}: {what}")
    for l in range(n):
        if gamma[l].shape != parent[l].shape:
            raise IntegrityError(f"{source}: level {levels[l]}: {gamma[l].size} γ for {parent[l].size} units")
    labels = [_text_from(arrays, f"labels_{l}", parent[l].size, source) for l in range(n)]
    nb = parent[-1].size
    block_geoid = _text_from(arrays, "block_geoid", nb, source)
    block_source_row = _int_array(arrays, "block_source_row", source)
    if block_source_row.size != nb:
        raise IntegrityError(f"{source}: {block_source_row.size} block source rows for {nb} blocks")
    diagnostics = _diagnostics_from_json(header["diagnostics"], source)
    if osed_spec is not None:
        cols: dict[str, Any] = {}
        for i, (name, dtype) in enumerate(osed_spec["columns"]):
            if dtype == "int64":
                values: npt.NDArray[Any] = _int_array(arrays, f"osed_{i}", source)
                if values.size != osed_spec["rows"]:
                    raise IntegrityError(f"{source}: osed column {name!r} has {values.size} rows, not "
                                         f"{osed_spec['rows']}")
            else:
                values = _text_from(arrays, f"osed_{i}", osed_spec["rows"], source)
            cols[name] = pd.Series(values, dtype=dtype)
        diagnostics["osed"] = pd.DataFrame(cols) if cols else pd.DataFrame(index=pd.RangeIndex(osed_spec["rows"]))
    spine = Spine(levels=tuple(levels), parent=parent, gamma_num=gamma, denominator=header["denominator"],
                  labels=labels, block_geoid=block_geoid, block_source_row=block_source_row,
                  beta=tuple(Fraction(b) for b in header["beta"]), privacy_rule=header["privacy_rule"],
                  bypassed=list(header["bypassed"]), diagnostics=diagnostics, input_hash=header["input_hash"])
    check_privacy_invariant(spine)
    return spine


def _int64(arr: npt.NDArray[Any], what: str) -> IntArray:
    if arr.dtype != np.int64 or arr.ndim != 1:
        raise ValueError(f"spine_bytes: {what} is {arr.dtype} with {arr.ndim} dimensions, not a 1-D int64 array")
    return arr


def _text_arrays(values: npt.NDArray[Any] | pd.Series, what: str) -> tuple[U8Array, IntArray]:
    """Strings as (concatenated UTF-8 bytes, int64 offsets: string i = bytes[off[i]:off[i+1]]), via Arrow."""
    arr = pa.array(values, type=pa.large_string())
    if arr.null_count:
        raise ValueError(f"spine_bytes: {what} holds a missing value")
    _, off_buf, data_buf = arr.buffers()
    off = np.frombuffer(off_buf, dtype=np.int64)[arr.offset: arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8)[int(off[0]): int(off[-1])]
    return data, off - off[0]


def _read_npz(data: bytes, source: str) -> dict[str, Any]:
    """Every member of an npz object, read without pickle."""
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise IntegrityError(f"{source}: not a spine object (a single array, not an npz archive)")
        with loaded as z:
            if len(set(z.files)) != len(z.files):
                raise IntegrityError(f"{source}: spine object repeats a member name")
            return {name: z[name] for name in z.files}
    except _LOAD_ERRORS as exc:
        raise IntegrityError(f"{source}: not a readable spine object: {type(exc).__name__}: {exc}") from exc


def _array(arrays: Mapping[str, Any], name: str, dtype: type[np.generic], source: str) -> npt.NDArray[Any]:
    a = arrays.get(name)
    if a is None:
        raise IntegrityError(f"{source}: spine object has no array {name!r}")
    if not isinstance(a, np.ndarray) or a.dtype != np.dtype(dtype) or a.ndim != 1:
        got = f"{a.dtype} with shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
        raise IntegrityError(f"{source}: array {name!r} is {got}, not a 1-D {np.dtype(dtype)} array")
    return a


def _int_array(arrays: Mapping[str, Any], name: str, source: str) -> IntArray:
    out: IntArray = _array(arrays, name, np.int64, source)
    return out


def _text_from(arrays: Mapping[str, Any], name: str, n: int, source: str) -> ObjArray:
    """``n`` strings from ``{name}_data`` + ``{name}_offsets`` as an object array of str (offsets and UTF-8
    checked)."""
    data = _array(arrays, f"{name}_data", np.uint8, source)
    off = _int_array(arrays, f"{name}_offsets", source)
    if off.size != n + 1:
        raise IntegrityError(f"{source}: {name}: {off.size - 1} strings for {n} units")
    if off[0] != 0 or off[-1] != data.size or (np.diff(off) < 0).any():
        raise IntegrityError(f"{source}: {name}: text offsets are not monotone within [0, {data.size}]")
    text = pa.LargeStringArray.from_buffers(n, pa.py_buffer(off), pa.py_buffer(data))
    try:
        text.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise IntegrityError(f"{source}: {name}: {exc}") from exc
    return np.asarray(text.to_numpy(zero_copy_only=False), dtype=object)


def _header(arrays: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The JSON header, its every field type-checked."""
    raw = _array(arrays, "header", np.uint8, source)
    try:
        h: Any = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"{source}: spine header is not JSON: {exc}") from exc
    fmt = h.get("format") if isinstance(h, dict) else None
    if fmt != SPINE_FORMAT:
        raise IntegrityError(f"{source}: not a {SPINE_FORMAT} object (format {fmt!r})")
    if set(h) != _HEADER_KEYS:
        raise IntegrityError(f"{source}: spine header fields {sorted(h)} are not {sorted(_HEADER_KEYS)}")

    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    levels, beta, osed = h["levels"], h["beta"], h["osed"]
    problems = [
        (isinstance(levels, list) and len(levels) > 0 and all(isinstance(v, str) for v in levels), "levels"),
        (is_int(h["denominator"]) and h["denominator"] > 0, "denominator"),
        (isinstance(beta, list) and all(isinstance(b, str) and _is_fraction(b) for b in beta)
         and len(beta) == len(levels), "beta"),
        (h["privacy_rule"] in ("zcdp", "puredp"), "privacy_rule"),
        (isinstance(h["bypassed"], list) and all(is_int(b) for b in h["bypassed"])
         and len(h["bypassed"]) in (0, len(levels)), "bypassed"),
        (isinstance(h["input_hash"], str), "input_hash"),
        (isinstance(h["diagnostics"], dict), "diagnostics"),
        (osed is None or (isinstance(osed, dict) and set(osed) == {"rows", "columns"} and is_int(osed["rows"])
                          and osed["rows"] >= 0 and isinstance(osed["columns"], list)
                          and all(isinstance(c, list) and len(c) == 2 and isinstance(c[0], str)
                                  and c[1] in _OSED_DTYPES for c in osed["columns"])
                          and len({c[0] for c in osed["columns"]}) == len(osed["columns"])
                          and isinstance(h["diagnostics"], dict) and h["diagnostics"].get("osed", 0) is None),
         "osed"),
    ]
    bad = [name for ok, name in problems if not ok]
    if bad:
        raise IntegrityError(f"{source}: malformed spine header field(s) {bad}")
    out: dict[str, Any] = h
    return out


def _is_fraction(text: str) -> bool:
    try:
        return str(Fraction(text)) == text
    except (ValueError, ZeroDivisionError):
        return False


def _diagnostics_from_json(diag: dict[str, Any], source: str = "spine_bytes") -> dict[str, Any]:
    """The diagnostics as built: the per-level ``fanout_hist`` keys back to ints (JSON keys are text)."""
    out = dict(diag)
    levels = out.get("levels")
    if isinstance(levels, list):
        recs = []
        for rec in levels:
            if isinstance(rec, dict) and isinstance(rec.get("fanout_hist"), dict):
                hist = rec["fanout_hist"]
                if not all(k.isascii() and k.isdigit() and str(int(k)) == k for k in hist):
                    raise IntegrityError(f"{source}: fanout_hist keys {sorted(hist)[:3]} are not integers")
                rec = {**rec, "fanout_hist": {int(k): v for k, v in hist.items()}}
            recs.append(rec)
        out["levels"] = recs
    return out

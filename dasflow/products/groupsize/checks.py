"""Group sizes' validation: the GX suite of the occupied housing units, the cross-file facts (geography, the
public invariant n), the phase-0 Parquet check and the release-file rules (headers; a consistent, non-negative
release across nation, states and counties, hierarchical-groupsize.md H3/C4).

Fail-closed argument: input checks run in the validate stage and draw no noise (a failure stops the release
before preprocessing); output checks read only the release tables (post-processing). Summaries hold counts only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.files import input_prefix
from dasflow.io.store import ObjectStore
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct, build_hierarchy, tabulate_households
from dasflow.products.plugin import InputChecks
from dasflow.validation.gx import Check
from dasflow.validation.preflight import check_parquet_files
from dasflow.validation.products import InputSuite, fact, scalar_fact
from dasflow.validation.stream import Chunk, RowFact, StreamedSuite, parquet_chunks, shifted
from dasflow.validation.suites import STATE_FIPS, cols, in_set, regex

#: occupied housing units as the plugin builds them (STATE, COUNTY text; SIZE integer ≥ 1)
HOUSEHOLDS_SUITE: list[Check] = [
    *cols(["STATE", "COUNTY", "SIZE"]), in_set("STATE", STATE_FIPS), regex("COUNTY", "[0-9]{3}"),
    Check("ExpectColumnValuesToBeBetween", {"column": "SIZE", "min_value": 1}),
]

#: the release tables and their spec headers (the nation's STATE is "US")
HEADERS: dict[str, list[str]] = {
    "groupsize_nation": ["STATE", "HOUSEHOLD_SIZE", "COUNT"],
    "groupsize_state": ["STATE", "HOUSEHOLD_SIZE", "COUNT"],
    "groupsize_county": ["STATE", "COUNTY", "HOUSEHOLD_SIZE", "COUNT"],
}


def preflight(store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
    """Phase 0 of the confidential unit files: every Parquet part decodes (the public side is read by pandas,
    whose errors already name the file)."""
    if not public:
        check_parquet_files(store, input_prefix(inputs, "groupsize", "confidential/groupsize/"))


def input_checks(confidential: Mapping[str, Any], public: Mapping[str, Any],
                 config: GroupSizeConfig) -> InputChecks:
    """The households' suite, (STATE, COUNTY) in the public tree, the invariant n, households per state, and the
    product's own tabulation (``prepare``) as the own check."""
    hh: pd.DataFrame = confidential["households"]
    source = str(confidential.get("households_source", "<households>"))
    geo: pd.DataFrame = public["geography"]
    key = hh["STATE"].astype(str) + "\x00" + hh["COUNTY"].astype(str)
    known = pd.Index(geo["STATE"].astype(str) + "\x00" + geo["COUNTY"].astype(str))
    facts = [
        fact("(STATE, COUNTY) in the public geography", source, "COUNTY",
             ~np.asarray(key.isin(known).to_numpy(), dtype=bool)),
        scalar_fact("occupied units = public invariant n", source, "SIZE", len(hh) == int(public["n_groups"])),
    ]
    per_state = {str(k): int(v) for k, v in hh["STATE"].value_counts().sort_index().items()}
    summary = {"rows": {source: len(hh)}, "n_groups": int(public["n_groups"]), "households_per_state": per_state}

    def own() -> None:
        GroupSizeProduct(config).prepare(confidential, public)

    return InputChecks(suites=[InputSuite("groupsize.households", source, {c: hh[c] for c in hh.columns},
                                          HOUSEHOLDS_SUITE)], facts=facts, summary=summary, own=own)


#: the unit files' columns the households are built from
UNIT_COLUMNS = ("TABBLKST", "TABBLKCOU", "HHGQ", "SIZE")
#: what the unit files are called in messages (as the plugin names them)
UNIT_FILES = "group-size unit files"


def _labels(column: pd.Series, label: Callable[[Any], str]) -> np.ndarray:
    """``label`` of every value of a code column, formatted once per distinct value (object array)."""
    codes, uniq = pd.factorize(column, use_na_sentinel=False)
    return np.asarray([label(v) for v in uniq], dtype=object)[codes]


def _household_chunks(store: ObjectStore, prefix: str, chunk_rows: int) -> Iterator[Chunk]:
    """The occupied housing units (HHGQ 0, SIZE ≥ 1) of the unit files in batches, as the plugin's reader builds
    them (STATE, COUNTY zero-padded text; SIZE), rows numbered in the concatenated households table."""
    offset = 0
    for chunk in parquet_chunks(store, prefix, UNIT_COLUMNS, chunk_rows, UNIT_FILES):
        units = pd.DataFrame({c: np.asarray(v) for c, v in chunk.columns.items()})
        hh = units[(units["HHGQ"] == 0) & (units["SIZE"] >= 1)]
        frame = {"STATE": pd.Series(_labels(hh["TABBLKST"], lambda v: str(v).zfill(2))),
                 "COUNTY": pd.Series(_labels(hh["TABBLKCOU"], lambda v: str(int(v)).zfill(3))),
                 "SIZE": pd.Series(hh["SIZE"].to_numpy())}
        yield Chunk(prefix, offset, frame)
        offset += len(hh)


def stream_checks(store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                  config: GroupSizeConfig, chunk_rows: int) -> InputChecks:
    """:func:`input_checks` over the unit files in batches of at most ``chunk_rows`` units: per batch the
    suite's domain, the geography fact, per-state counts and the product's own tabulation checks
    (``tabulate_households``); the invariant n from the count. Own check: the first error of the first batch
    holding one, then n (as ``prepare`` words it)."""
    prefix = input_prefix(inputs, "groupsize", "confidential/groupsize/")
    geo: pd.DataFrame = public["geography"]
    n_public = int(public["n_groups"])
    known = pd.Index(pd.unique(geo["STATE"].astype(str) + "\x00" + geo["COUNTY"].astype(str)))
    suite = StreamedSuite("groupsize.households", HOUSEHOLDS_SUITE)
    part = suite.part(prefix, lambda: _household_chunks(store, prefix, chunk_rows))
    in_geo = RowFact("(STATE, COUNTY) in the public geography", prefix, "COUNTY")
    per_state: dict[str, int] = {}
    rows = 0
    error: list[InputError] = []
    try:
        hier = build_hierarchy(geo)
    except InputError as exc:
        error.append(exc)
    for chunk in part.source():
        hh = pd.DataFrame(dict(chunk.columns))
        part.add(chunk)
        key = hh["STATE"].astype(str) + "\x00" + hh["COUNTY"].astype(str)
        in_geo.add(known.get_indexer(pd.Index(key)) < 0, chunk)
        for k, v in hh["STATE"].value_counts().items():
            per_state[str(k)] = per_state.get(str(k), 0) + int(v)
        rows += len(hh)
        size = pd.to_numeric(hh["SIZE"], errors="coerce")
        # tabulate_households (the product's own check: SIZE an integer >= 1, (STATE, COUNTY) in the public tree)
        # can only fail on a batch where one of these masks does: only such a batch is handed to it
        suspect = bool((size.isna() | (size != np.floor(size)) | (size < 1)).any()) or in_geo.violations > 0
        if suspect and not error:
            try:
                shifted(lambda h=hh: tabulate_households(h, hier, int(config.k), prefix),  # type: ignore[misc]
                        chunk.offset)
            except InputError as exc:
                error.append(exc)
    if not error and rows != n_public:
        error.append(InputError(f"households table has {rows} occupied units but the public invariant n is "
                                f"{n_public}", file=prefix))
    facts = [in_geo.record(), scalar_fact("occupied units = public invariant n", prefix, "SIZE", rows == n_public)]
    summary = {"rows": {prefix: rows}, "n_groups": n_public,
               "households_per_state": {k: per_state[k] for k in sorted(per_state)}}

    def own() -> None:
        if error:
            raise error[0]

    return InputChecks(suites=[suite], facts=facts, summary=summary, own=own)


def output_header(file: str) -> list[str] | None:
    """``groupsize_{nation,state,county}.csv``: the spec headers."""
    return HEADERS.get(Path(file).name.removesuffix(".csv"))


def check_outputs(frames: Mapping[str, pd.DataFrame]) -> InputError | None:
    """Group sizes promise a consistent, valid release (hierarchical-groupsize.md H3/C4): every count ≥ 0, every
    region has the same household-size rows, and for every size the counties of a state sum to the state and
    the states to the nation. ``frames``: file relative to ``release/groupsize/`` -> table; the error names the
    file relative to ``release/``."""
    files = {lvl: f"groupsize_{lvl}.csv" for lvl in ("nation", "state", "county")}
    if not all(f in frames for f in files.values()):
        return None
    names = {lvl: f"groupsize/{f}" for lvl, f in files.items()}
    tables = {lvl: frames[f].astype(str) for lvl, f in files.items()}
    for lvl, t in tables.items():
        counts = pd.to_numeric(t["COUNT"], errors="coerce").to_numpy()
        bad = ~(counts >= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return InputError(f"COUNT {t['COUNT'].iloc[i]!r} is not a valid (non-negative integer) count",
                              file=names[lvl], row=i + 2, column="COUNT")
    sizes = sorted(set(tables["nation"]["HOUSEHOLD_SIZE"]))
    for lvl, geo in (("state", ["STATE"]), ("county", ["STATE", "COUNTY"])):
        t = tables[lvl]
        per_region = t.groupby(geo)["HOUSEHOLD_SIZE"].apply(lambda s: sorted(s) == sizes)
        if not bool(per_region.all()):
            region = per_region.index[~per_region.to_numpy()][0]
            return InputError(f"region {region} does not have one row per household size {sizes}",
                              file=names[lvl], column="HOUSEHOLD_SIZE")
    for child, parent, geo in (("county", "state", ["STATE"]), ("state", "nation", [])):
        c, p = tables[child].copy(), tables[parent].copy()
        c["COUNT"], p["COUNT"] = c["COUNT"].astype(np.int64), p["COUNT"].astype(np.int64)
        sums = c.groupby([*geo, "HOUSEHOLD_SIZE"])["COUNT"].sum()
        key = [*geo, "HOUSEHOLD_SIZE"]
        joined = p.join(sums.rename("CHILDREN"), on=key)
        bad = (joined["CHILDREN"].fillna(0).astype(np.int64) != joined["COUNT"]).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return InputError(f"inconsistent: {parent} count {int(joined['COUNT'].iloc[i])} != sum of its "
                              f"{child} counts {int(joined['CHILDREN'].fillna(0).iloc[i])}", file=names[parent],
                              row=i + 2, column="COUNT")
    return None



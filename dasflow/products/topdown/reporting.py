"""TopDown in the accuracy report: the ground-truth twin (the product's own tables of the true block
histogram, test releases only) and the consistency diagnostics of the released geolevels."""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import IntegrityError
from dasflow.products.topdown.product import TopDown

#: TopDown's standard geolevels and GEOID widths (as ``dasflow.products.topdown.product.STANDARD_LEVELS``)
TOPDOWN_LEVELS = (("US", 0), ("state", 2), ("county", 5), ("tract", 11), ("block_group", 12), ("block", 15))


def topdown_truth(product: TopDown, confidential: Mapping[str, Any],
                  public: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
    """TopDown's published tables (table -> frame) computed from the true block histogram: the product's own
    ``prepare()`` (persons tabulated onto the spine's blocks, vectorised) fed to its own ``tables()`` in place of
    the estimated blocks — so the truth has exactly the published files, geolevels and key columns, nonzero
    cells only (as published: an absent cell is 0, ``zero_filled``). Reads confidential data: test releases
    only."""
    spine = product.spine(public)
    hist = product.prepare(confidential, public)[f"hist/{spine.levels[-1]}"]
    block = pd.DataFrame({"GEOID": spine.block_geoid[hist["UNIT"].to_numpy(np.int64)].astype(str),
                          "CELL": hist["CELL"].to_numpy(np.int64), "COUNT": hist["COUNT"].to_numpy(np.int64)})
    return product.tables({"block": block})


def topdown_consistency(files: Mapping[str, pd.DataFrame], workers: int | None = None) -> list[dict[str, Any]]:
    """Released values only: each present standard geolevel against the sum of the next present one below.

    Both levels are read in Arrow tables of text (``files.text_tables(rel)`` when the mapping streams them, as
    the release's :class:`~dasflow.release.accuracy.ReleaseFiles` does; else its frame, sorted by GEOID) and
    compared one state at a time: the published tables are sorted by GEOID, and every GEOID below the nation
    starts with its state's code, so a state's rows are consecutive in both. The child rows are summed to their
    parents' keys table by table; a state's sums are joined with its parent rows when the next state begins.
    Memory is bounded by the largest state's parent rows and sums, not by the nation (``benchmarks/
    consistency.py``), per pair of levels; a file whose states are out of order is refused (``IntegrityError``:
    the release stage wrote it sorted), never mis-summed. The sums are exact (integer counts in float64). Same
    cells, differing cells and largest difference as :func:`~dasflow.products.reporting.hierarchy_check` on the
    whole frames.

    The pairs of levels are independent: they are checked on ``workers`` threads (default: the machine's cores,
    at most one per pair), the finest first (they cost the most); Arrow's reads, sums and joins release the GIL.
    The rows come in level order whatever the number of threads."""
    present = [(name, w) for name, w in TOPDOWN_LEVELS if f"topdown_{name}.csv" in files
               or f"topdown_{name}.parquet" in files]
    pairs = list(itertools.pairwise(present))
    threads = max(1, min(len(pairs), workers if workers is not None else os.cpu_count() or 1))
    if threads == 1:
        return [_pair_check(files, parent, child) for parent, child in pairs]
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="topdown-consistency") as pool:
        futures = {i: pool.submit(_pair_check, files, *pairs[i]) for i in reversed(range(len(pairs)))}
        return [futures[i].result() for i in range(len(pairs))]


def _pair_check(files: Mapping[str, pd.DataFrame], parent_level: tuple[str, int],
                child_level: tuple[str, int]) -> dict[str, Any]:
    """One row of :func:`topdown_consistency`: a geolevel against the sum of the next present one below."""
    (pname, pw), (cname, _cw) = parent_level, child_level
    prel = f"topdown_{pname}.csv" if f"topdown_{pname}.csv" in files else f"topdown_{pname}.parquet"
    crel = f"topdown_{cname}.csv" if f"topdown_{cname}.csv" in files else f"topdown_{cname}.parquet"
    cut = 2 if pw else 0  # the unit held at once: a state (below the nation), else the whole level
    parents = _by_state(_text_tables(files, prel), cut, prel)
    children = _by_state(_text_tables(files, crel), cut, crel, functools.partial(_sums_to_parents, width=pw))
    cells = bad = 0
    worst = 0.0
    kids: tuple[str, list[pa.Table]] | None = None
    for state, held in parents:
        parent = pa.concat_tables(held)
        while kids is None or kids[0] < state:  # children of states without parent rows are not compared
            got = next(children, None)
            if got is None:
                kids = (chr(0x10FFFF), [])
                break
            kids = got
        attrs = [c for c in parent.column_names if c not in ("GEOID", "COUNT")]
        keys = ["GEOID", *attrs]
        par = parent.select(keys).append_column("PARENT", pc.cast(parent.column("COUNT"), pa.float64()))
        diff = np.abs(par.column("PARENT").to_numpy())
        if kids[0] == state and kids[1]:
            sums = _sum_by(pa.concat_tables(kids[1]), keys, "CHILDREN")
            merged = par.join(sums, keys=keys, join_type="left outer")
            diff = np.abs(merged.column("PARENT").to_numpy()
                          - pc.fill_null(merged.column("CHILDREN"), 0.0).to_numpy())
        cells += int(diff.size)
        bad += int((diff > 0).sum())
        worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return {"product": "topdown", "check": f"{pname} = Σ {cname}", "cells": cells, "inconsistent": bad,
            "max_abs_diff": worst}


def _by_state(tables: Iterable[pa.Table], cut: int, rel: str,
              reduce: Callable[[pa.Table], pa.Table] = lambda t: t) -> Iterator[tuple[str, list[pa.Table]]]:
    """Consecutive rows grouped by the first ``cut`` characters of GEOID (0: one group of all rows): ``(key,
    tables)`` per key in file order, each key once and in ascending order (``IntegrityError`` naming ``rel``
    otherwise), each slice of a table passed through ``reduce`` as it is cut (the children's sums), so only the
    current key's reduced slices are held."""
    key: str | None = None
    held: list[pa.Table] = []
    for table in tables:
        if table.num_rows == 0:
            continue
        if cut == 0:
            key = ""
            held.append(reduce(table))
            continue
        prefix = pc.utf8_slice_codeunits(table.column("GEOID"), 0, cut)
        change = pc.not_equal(prefix.slice(1), prefix.slice(0, table.num_rows - 1)).to_numpy(zero_copy_only=False)
        starts = [0, *(np.flatnonzero(change) + 1).tolist()]
        for i, start in enumerate(starts):
            stop = starts[i + 1] if i + 1 < len(starts) else table.num_rows
            k = str(prefix[start].as_py())
            if key is not None and k != key:
                if k < key:
                    raise IntegrityError(f"{rel}: rows are not in GEOID order (state {k} after {key})")
                yield key, held
                held = []
            key = k
            held.append(reduce(table.slice(start, stop - start)))
    if key is not None:
        yield key, held


def _text_tables(files: Mapping[str, pd.DataFrame], rel: str) -> Iterator[pa.Table]:
    """A release file as Arrow tables with every column as text (as the release files are read,
    ``dtype=str``): streamed when ``files`` can, else its frame as one table."""
    stream = getattr(files, "text_tables", None)
    if stream is not None:
        yield from stream(rel)
        return
    frame = files[rel]
    frame = frame.iloc[np.argsort(frame["GEOID"].astype(str).to_numpy(), kind="stable")]
    yield pa.table({c: pa.array(frame[c].astype(str).to_numpy(), pa.string()) for c in frame.columns})


def _sums_to_parents(table: pa.Table, width: int) -> pa.Table:
    """One table of child rows summed per (parent GEOID = the first ``width`` characters, or ``US``; the other
    columns but COUNT)."""
    attrs = [c for c in table.column_names if c not in ("GEOID", "COUNT")]
    geo = table.column("GEOID")
    parent = pc.utf8_slice_codeunits(geo, 0, width) if width else pa.array(["US"] * table.num_rows, pa.string())
    cols = {"GEOID": parent, **{a: table.column(a) for a in attrs},
            "COUNT": pc.cast(table.column("COUNT"), pa.float64())}
    return _sum_by(pa.table(cols), ["GEOID", *attrs], "COUNT")


def _sum_by(table: pa.Table, keys: list[str], name: str) -> pa.Table:
    """``COUNT`` summed per ``keys`` (columns by name, whatever order Arrow returns them in), as ``name``."""
    agg = table.group_by(keys).aggregate([("COUNT", "sum")])
    return pa.table({**{k: agg.column(k) for k in keys}, name: agg.column("COUNT_sum")})

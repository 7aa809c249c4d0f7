"""TopDown in the accuracy report: the ground-truth twin (the product's own tables of the true block
histogram, test releases only) and the consistency diagnostics of the released geolevels."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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


def topdown_consistency(files: Mapping[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """Released values only: each present standard geolevel against the sum of the next present one below.

    The child level is read in Arrow tables of text (``files.text_tables(rel)`` when the mapping streams them,
    as the release's :class:`~dasflow.release.accuracy.ReleaseFiles` does; else its frame) and summed to its
    parents' keys table by table, so the nation's block table is never held whole, nor as Python strings; the
    parent level is still read whole, and with the partial sums it sets the memory (block groups: about half the
    block rows; ``benchmarks/consistency.py``). The sums are exact (integer counts in float64). Same cells,
    differing cells and largest difference as :func:`~dasflow.products.reporting.hierarchy_check` on the whole
    frames."""
    rows: list[dict[str, Any]] = []
    present = [(name, w) for name, w in TOPDOWN_LEVELS if f"topdown_{name}.csv" in files
               or f"topdown_{name}.parquet" in files]
    for (pname, pw), (cname, _cw) in itertools.pairwise(present):
        prel = f"topdown_{pname}.csv" if f"topdown_{pname}.csv" in files else f"topdown_{pname}.parquet"
        crel = f"topdown_{cname}.csv" if f"topdown_{cname}.csv" in files else f"topdown_{cname}.parquet"
        parent = pa.concat_tables(list(_text_tables(files, prel)))
        attrs = [c for c in parent.column_names if c not in ("GEOID", "COUNT")]
        keys = ["GEOID", *attrs]
        sums = [_sums_to_parents(t, pw, attrs) for t in _text_tables(files, crel)]
        kids = _sum_by(pa.concat_tables(sums), keys, "CHILDREN")
        par = parent.select(keys).append_column("PARENT", pc.cast(parent.column("COUNT"), pa.float64()))
        merged = par.join(kids, keys=keys, join_type="left outer")
        diff = np.abs(merged.column("PARENT").to_numpy()
                      - pc.fill_null(merged.column("CHILDREN"), 0.0).to_numpy())
        rows.append({"product": "topdown", "check": f"{pname} = Σ {cname}", "cells": int(merged.num_rows),
                     "inconsistent": int((diff > 0).sum()), "max_abs_diff": float(diff.max() if diff.size else 0.0)})
    return rows


def _text_tables(files: Mapping[str, pd.DataFrame], rel: str) -> Iterator[pa.Table]:
    """A release file as Arrow tables with every column as text (as the release files are read,
    ``dtype=str``): streamed when ``files`` can, else its frame as one table."""
    stream = getattr(files, "text_tables", None)
    if stream is not None:
        yield from stream(rel)
        return
    frame = files[rel]
    yield pa.table({c: pa.array(frame[c].astype(str).to_numpy(), pa.string()) for c in frame.columns})


def _sums_to_parents(table: pa.Table, width: int, attrs: list[str]) -> pa.Table:
    """One table of child rows summed per (parent GEOID = the first ``width`` characters, or ``US``; attrs)."""
    geo = table.column("GEOID")
    parent = pc.utf8_slice_codeunits(geo, 0, width) if width else pa.array(["US"] * table.num_rows, pa.string())
    cols = {"GEOID": parent, **{a: table.column(a) for a in attrs},
            "COUNT": pc.cast(table.column("COUNT"), pa.float64())}
    return _sum_by(pa.table(cols), ["GEOID", *attrs], "COUNT")


def _sum_by(table: pa.Table, keys: list[str], name: str) -> pa.Table:
    """``COUNT`` summed per ``keys`` (columns by name, whatever order Arrow returns them in), as ``name``."""
    agg = table.group_by(keys).aggregate([("COUNT", "sum")])
    return pa.table({**{k: agg.column(k) for k in keys}, name: agg.column("COUNT_sum")})

"""TopDown in the accuracy report: the ground-truth twin (the product's own tables of the true block
histogram, test releases only) and the consistency diagnostics of the released geolevels."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.products.reporting import hierarchy_check
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
    """Released values only: each present standard geolevel against the sum of the next present one below."""
    rows: list[dict[str, Any]] = []
    present = [(name, w) for name, w in TOPDOWN_LEVELS if f"topdown_{name}.csv" in files
               or f"topdown_{name}.parquet" in files]
    for (pname, pw), (cname, _cw) in itertools.pairwise(present):
        parent = files.get(f"topdown_{pname}.csv", files.get(f"topdown_{pname}.parquet"))
        child = files.get(f"topdown_{cname}.csv", files.get(f"topdown_{cname}.parquet"))
        assert parent is not None and child is not None
        attrs = [c for c in child.columns if c not in ("GEOID", "COUNT")]
        geo = child["GEOID"].astype(str)
        link = pd.DataFrame({"GEOID": (geo.str[:pw] if pw else pd.Series(["US"] * len(child))).to_numpy()})
        parent = parent.assign(GEOID=parent["GEOID"].astype(str))
        c, d, m = hierarchy_check(parent, child, ["GEOID"], link, attrs)
        rows.append({"product": "topdown", "check": f"{pname} = Σ {cname}", "cells": c, "inconsistent": d,
                     "max_abs_diff": m})
    return rows

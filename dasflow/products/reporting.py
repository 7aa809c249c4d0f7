"""Consistency diagnostics shared by the products' accuracy-report hooks (``ProductPlugin.consistency``).

Post-processing only: these compare released values with each other (and with public invariants), never with
confidential data.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def hierarchy_check(parent: pd.DataFrame, child: pd.DataFrame, parent_keys: list[str],
                    child_parent: pd.DataFrame, attrs: list[str]) -> tuple[int, int, float]:
    """Compare each parent cell with the sum of its children: (cells compared, cells differing, max |diff|).

    ``child_parent`` holds, row-aligned with ``child``, the parent key columns of each child row.
    """
    kids = child_parent.copy()
    for a in attrs:
        kids[a] = child[a].astype(str).to_numpy()
    kids["COUNT"] = pd.to_numeric(child["COUNT"]).to_numpy(np.float64)
    sums = kids.groupby([*parent_keys, *attrs], as_index=False)["COUNT"].sum()
    par = parent[[*parent_keys, *attrs]].astype(str)
    par["PARENT"] = pd.to_numeric(parent["COUNT"]).to_numpy(np.float64)
    merged = par.merge(sums, on=[*parent_keys, *attrs], how="left").fillna({"COUNT": 0.0})
    diff = np.abs(merged["PARENT"].to_numpy() - merged["COUNT"].to_numpy())
    return len(merged), int((diff > 0).sum()), float(diff.max() if len(diff) else 0.0)

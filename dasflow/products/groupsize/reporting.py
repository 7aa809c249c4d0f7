"""Group sizes in the accuracy report: the ground-truth twin (exact tabulation, test releases only) and the
consistency diagnostics of the released tables (nation ⊇ states ⊇ counties per household size, and the nation
total against the public invariant n)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.products.reporting import hierarchy_check


def groupsize_truth(households: pd.DataFrame, geography: pd.DataFrame, k: int) -> dict[str, pd.DataFrame]:
    """Households per (geography, size) by exact tabulation, per level (``nation``, ``state``, ``county``) in the
    release layout (key columns, ``HOUSEHOLD_SIZE``, ``COUNT``). Reads confidential data: test releases only."""
    size = np.minimum(households["SIZE"].to_numpy(np.int64), k)
    labels = [str(s) if s < k else f"{k}+" for s in range(1, k + 1)]
    geo = geography[["STATE", "COUNTY"]].astype(str)
    out: dict[str, pd.DataFrame] = {}
    for level, cols in (("nation", []), ("state", ["STATE"]), ("county", ["STATE", "COUNTY"])):
        dom = geo[cols].drop_duplicates() if cols else pd.DataFrame({"STATE": ["US"]})
        dom = dom.merge(pd.DataFrame({"SIZE": np.arange(1, k + 1)}), how="cross")
        tab = pd.DataFrame({c: households[c].astype(str).to_numpy() for c in cols} | {"SIZE": size})
        if not cols:
            tab["STATE"] = "US"
        keys = cols or ["STATE"]
        counts = tab.groupby([*keys, "SIZE"], as_index=False).size().rename(columns={"size": "COUNT"})
        frame = dom.merge(counts, on=[*keys, "SIZE"], how="left").fillna({"COUNT": 0})
        frame["HOUSEHOLD_SIZE"] = [labels[s - 1] for s in frame["SIZE"]]
        out[level] = frame[[*keys, "HOUSEHOLD_SIZE", "COUNT"]].astype({"COUNT": np.int64})
    return out


def groupsize_consistency(files: Mapping[str, pd.DataFrame], n: int | None) -> list[dict[str, Any]]:
    """Released values only: nation = Σ states and state = Σ counties per size, Σ nation = the public n."""
    rows: list[dict[str, Any]] = []
    nation, state, county = (files.get(f"groupsize_{x}.csv") for x in ("nation", "state", "county"))
    if nation is not None and state is not None:
        link = pd.DataFrame({"STATE": ["US"] * len(state)})
        c, d, m = hierarchy_check(nation, state, ["STATE"], link, ["HOUSEHOLD_SIZE"])
        rows.append({"product": "groupsize", "check": "nation = Σ states (per size)", "cells": c,
                     "inconsistent": d, "max_abs_diff": m})
    if state is not None and county is not None:
        link = pd.DataFrame({"STATE": county["STATE"].astype(str).to_numpy()})
        c, d, m = hierarchy_check(state, county, ["STATE"], link, ["HOUSEHOLD_SIZE"])
        rows.append({"product": "groupsize", "check": "state = Σ counties (per size)", "cells": c,
                     "inconsistent": d, "max_abs_diff": m})
    if nation is not None and n is not None:
        total = float(pd.to_numeric(nation["COUNT"]).sum())
        rows.append({"product": "groupsize", "check": f"Σ nation = invariant n ({n})", "cells": 1,
                     "inconsistent": int(total != n), "max_abs_diff": abs(total - n)})
    return rows

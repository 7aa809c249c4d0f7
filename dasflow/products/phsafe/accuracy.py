"""Accuracy report: private release files against the ground truth (evaluation only, never published).

Compared with the untruncated ground truth (``run_non_private``) the error is truncation bias plus noise;
compared with the truncated twin (``run_non_private(..., truncate=True)``) it is noise only, and the share of
cells within the 90% MOE (1.645·√VARIANCE, Table 10's convention) should be close to 0.9.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from dasflow.products.phsafe.planning import Z90
from dasflow.products.phsafe.tables import data_cell_column


def _level(code: str) -> str:
    return "*" if code == "*" else ("H,I" if code in ("H", "I") else "A-G")


def accuracy_report(private: Mapping[str, pd.DataFrame], truth: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Per (table, REGION_TYPE, iteration level): cells, mean |error|, RMSE, √VARIANCE, share within 90% MOE,
    and the mean signed error (negative = undercount, e.g. truncation bias)."""
    rows = []
    z = float(Z90)
    for table, p in private.items():
        if table not in truth:
            continue
        t = truth[table]
        keys = ["REGION_ID", "REGION_TYPE", data_cell_column(table)]
        if "ITERATION_CODE" in p.columns:
            keys.append("ITERATION_CODE")
        m = p.merge(t, on=keys, suffixes=("", "_TRUE"), validate="one_to_one")
        if len(m) != len(p):
            raise ValueError(f"{table}: {len(p)} private rows but {len(m)} matched the truth")
        level = m["ITERATION_CODE"].map(_level) if "ITERATION_CODE" in m.columns else pd.Series("*", m.index)
        err = (m["COUNT"] - m["COUNT_TRUE"]).to_numpy(dtype=np.float64)
        sd = np.sqrt(m["VARIANCE"].to_numpy(dtype=np.float64))
        frame = pd.DataFrame({"REGION_TYPE": m["REGION_TYPE"], "LEVEL": level, "err": err,
                              "within": np.abs(err) <= z * sd, "sd": sd})
        for (rt, lv), g in frame.groupby(["REGION_TYPE", "LEVEL"], sort=True):
            e = g["err"].to_numpy()
            rows.append({"table": table, "region_type": rt, "level": lv, "cells": len(g),
                         "mean_abs_error": float(np.abs(e).mean()), "rmse": float(np.sqrt((e**2).mean())),
                         "noise_sd": float(g["sd"].mean()), "within_moe90": float(g["within"].mean()),
                         "mean_error": float(e.mean())})
    return pd.DataFrame(rows)

"""Error metrics of published tables against the truth, over repeated runs.

Input: one row per (run, published cell) with the cell's true count ``TRUE``, its published-minus-true error
``ERROR`` and the 90 % MOE stated for it ``MOE90`` (NaN where none is stated), labelled by ``product``,
``table``, ``geolevel`` and ``budget_scale``. Output: one row per (product, table, geolevel, pop_bin,
budget_scale) with the issue's columns. Everything is computed by pandas group-bys (no loop over cells).

Definitions (per group, over every cell of every run):

* ``runs``: number of runs; ``cells``: published cells per run (the mean over runs, rounded — an adaptive
  product such as SafeTab-P publishes a different cell set in each run);
* ``mae`` mean |error|; ``rmse`` √mean(error²); ``bias`` mean error (signed);
* ``mean_relative_error``: mean of |error| / true over cells with true > 0 (empty for the "0" bin);
* ``within_moe``: share of cells with |error| ≤ the stated 90 % MOE (empty where no MOE is stated);
* ``q90_abs_error``: the 90th percentile of |error| (linear interpolation).

``pop_bin`` bins the cell's true count (population size of the cell) as the accuracy report does, plus an
``all`` bin over every cell of the group.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dasflow.release.accuracy import SIZE_BINS, SIZE_LABELS
from dasflow.release.experiments import COLUMNS as COLUMNS

GROUP = ("product", "table", "geolevel", "pop_bin", "budget_scale")
ALL_BIN = "all"
BIN_ORDER = (*SIZE_LABELS, ALL_BIN)


def pop_bins(true: np.ndarray) -> np.ndarray:
    """The population-size label of each true count (``SIZE_LABELS`` of the accuracy report)."""
    index = np.digitize(np.asarray(true, dtype=np.float64), SIZE_BINS[1:])
    return np.asarray(SIZE_LABELS, dtype=object)[index]


def metrics(obs: pd.DataFrame) -> pd.DataFrame:
    """The metrics table (``COLUMNS``) of cell observations (see the module docstring for both layouts)."""
    need = {"product", "table", "geolevel", "budget_scale", "run", "TRUE", "ERROR", "MOE90"}
    missing = need - set(obs.columns)
    if missing:
        raise ValueError(f"cell observations lack columns {sorted(missing)}")
    true = obs["TRUE"].to_numpy(np.float64)
    err = obs["ERROR"].to_numpy(np.float64)
    moe = obs["MOE90"].to_numpy(np.float64)
    absolute = np.abs(err)
    frame = pd.DataFrame({
        "product": obs["product"].to_numpy(), "table": obs["table"].to_numpy(),
        "geolevel": obs["geolevel"].astype(str).to_numpy(), "budget_scale": obs["budget_scale"].to_numpy(),
        "run": obs["run"].to_numpy(),
        "err": err, "abs": absolute, "sq": err * err,
        "rel": np.where(true > 0, absolute / np.where(true > 0, true, 1.0), np.nan),
        "within": np.where(np.isfinite(moe), (absolute <= moe).astype(np.float64), np.nan),
    })
    both = pd.concat([frame.assign(pop_bin=pop_bins(true)), frame.assign(pop_bin=ALL_BIN)], ignore_index=True)
    grouped = both.groupby(list(GROUP), sort=False)
    out = grouped.agg(runs=("run", "nunique"), n=("err", "size"), mae=("abs", "mean"), sq=("sq", "mean"),
                      mean_relative_error=("rel", "mean"), bias=("err", "mean"), within_moe=("within", "mean"))
    out["q90_abs_error"] = grouped["abs"].quantile(0.9)
    out = out.reset_index()
    out["rmse"] = np.sqrt(out.pop("sq"))
    out["cells"] = np.rint(out.pop("n") / out["runs"]).astype(np.int64)
    out["pop_bin"] = pd.Categorical(out["pop_bin"], categories=list(BIN_ORDER), ordered=True)
    out = out.sort_values(["product", "table", "geolevel", "pop_bin", "budget_scale"], kind="stable")
    out["pop_bin"] = out["pop_bin"].astype(str)
    return out[list(COLUMNS)].reset_index(drop=True)

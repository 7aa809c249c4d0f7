"""The metrics of a fixed estimate/truth pair, computed by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasflow.experiment.metrics import COLUMNS, metrics, pop_bins


def _obs() -> pd.DataFrame:
    # two runs of one table: cells with true counts 0, 5, 50 (three population bins)
    true = [0, 5, 50, 0, 5, 50]
    err = [2, -1, 10, -2, 3, -4]
    moe = [2.5, 2.5, 5.0, 2.5, 2.5, 5.0]
    return pd.DataFrame({"product": "p", "table": "t.csv", "geolevel": "STATE", "budget_scale": 1.0,
                         "run": [0, 0, 0, 1, 1, 1], "TRUE": true, "ERROR": err, "MOE90": moe})


def test_columns_are_exactly_the_issues() -> None:
    assert list(metrics(_obs()).columns) == list(COLUMNS) == [
        "product", "table", "geolevel", "pop_bin", "budget_scale", "runs", "cells", "mae", "rmse",
        "mean_relative_error", "bias", "within_moe", "q90_abs_error"]


def test_hand_computed_metrics_per_bin_and_overall() -> None:
    m = metrics(_obs()).set_index("pop_bin")
    assert list(m.index) == ["0", "1–9", "10–99", "all"]
    zero, small, mid, everything = (m.loc[b] for b in ("0", "1–9", "10–99", "all"))
    # bin 0: errors 2, -2
    assert (zero["runs"], zero["cells"]) == (2, 1)
    assert zero["mae"] == 2 and zero["bias"] == 0 and zero["rmse"] == 2
    assert np.isnan(zero["mean_relative_error"])          # no true count > 0
    assert zero["within_moe"] == 1.0
    assert zero["q90_abs_error"] == 2
    # bin 1–9: errors -1, 3 on a true count of 5
    assert small["mae"] == 2 and small["bias"] == 1 and small["rmse"] == pytest.approx(np.sqrt(5))
    assert small["mean_relative_error"] == pytest.approx(0.4)   # (1/5 + 3/5) / 2
    assert small["within_moe"] == 0.5                            # |3| > 2.5
    assert small["q90_abs_error"] == pytest.approx(1 + 0.9 * 2)  # linear interpolation between 1 and 3
    # bin 10–99: errors 10, -4 on 50
    assert mid["bias"] == 3 and mid["rmse"] == pytest.approx(np.sqrt(58))
    assert mid["mean_relative_error"] == pytest.approx(0.14) and mid["within_moe"] == 0.5
    # all: six observations, three cells per run
    assert (everything["runs"], everything["cells"]) == (2, 3)
    assert everything["mae"] == pytest.approx(22 / 6)
    assert everything["bias"] == pytest.approx(8 / 6)
    assert everything["rmse"] == pytest.approx(np.sqrt((4 + 1 + 100 + 4 + 9 + 16) / 6))
    assert everything["mean_relative_error"] == pytest.approx((0.2 + 0.2 + 0.6 + 0.08) / 4)
    assert everything["within_moe"] == pytest.approx(4 / 6)   # 2, 1, 2, 4 within; 10, 3 not
    assert everything["q90_abs_error"] == pytest.approx(np.quantile([2, 1, 10, 2, 3, 4], 0.9))


def test_no_stated_moe_leaves_within_moe_empty_and_groups_stay_apart() -> None:
    obs = pd.concat([_obs(), _obs().assign(budget_scale=2.0, ERROR=lambda f: f["ERROR"] / 2, MOE90=np.nan)])
    m = metrics(obs)
    assert len(m) == 8
    half = m[(m["budget_scale"] == 2.0) & (m["pop_bin"] == "all")].iloc[0]
    assert np.isnan(half["within_moe"]) and half["mae"] == pytest.approx(11 / 6)
    assert list(m["budget_scale"].iloc[:2]) == [1.0, 2.0]   # sorted by bin, then scale


def test_pop_bins_and_missing_columns() -> None:
    assert list(pop_bins(np.array([0, 1, 9, 10, 999, 1000, 10_000]))) == [
        "0", "1–9", "1–9", "10–99", "100–999", "1,000–9,999", "10,000+"]
    with pytest.raises(ValueError, match="MOE90"):
        metrics(_obs().drop(columns="MOE90"))

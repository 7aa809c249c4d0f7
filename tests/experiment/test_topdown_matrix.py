"""TopDown and the matrix product in accuracy experiments: their ground truth equals an independent pandas
tabulation of the synthetic persons, production releases are refused it, and an experiment over them produces
metrics rows for every published table and geolevel. Deterministic checks only (no statistical thresholds)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dasflow.config import parse_release_config
from dasflow.experiment import run_experiment
from dasflow.experiment.runner import experiment_context
from dasflow.release import accuracy
from tests.dag.helpers import topdown_release

ATTRS = ["HHGQ", "VOTINGAGE", "HISPANIC", "CENRACE"]
WIDTHS = {"US": 0, "state": 2, "county": 5, "tract": 11, "block_group": 12, "block": 15}


def _persons(store_dir: Path) -> pd.DataFrame:
    """The synthetic persons read directly with pyarrow (not through the product's code)."""
    frame = pq.read_table(store_dir / "confidential/synth/topdown/persons").to_pandas()
    geoid = (frame["TABBLKST"].astype(str).str.zfill(2) + frame["TABBLKCOU"].astype(str).str.zfill(3)
             + frame["TABTRACTCE"].astype(str).str.zfill(6) + frame["TABBLK"].astype(str).str.zfill(4))
    return pd.DataFrame({"GEOID": geoid, **{a: frame[a].astype(np.int64) for a in ATTRS}})


@pytest.fixture(scope="module")
def td_raw(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return topdown_release(tmp_path_factory.mktemp("td"), "td-exp", states=("44", "10"), persons=3000, synth_seed=5)


def test_topdown_truth_is_the_tabulation_of_the_persons(td_raw: dict[str, Any]) -> None:
    ctx = experiment_context(parse_release_config(td_raw))
    truth = accuracy.truth_frames(ctx)["topdown"]
    assert sorted(truth) == sorted(f"topdown_{lv}.csv" for lv in WIDTHS)
    persons = _persons(Path(td_raw["store"]))
    for level, width in WIDTHS.items():
        geo = persons["GEOID"].str[:width] if width else pd.Series("US", index=persons.index)
        expected = (persons.assign(GEOID=geo).groupby(["GEOID", *ATTRS]).size().rename("COUNT").reset_index()
                    .sort_values(["GEOID", *ATTRS], ignore_index=True))
        got = truth[f"topdown_{level}.csv"]
        got = got.assign(GEOID=got["GEOID"].astype(str)).sort_values(["GEOID", *ATTRS], ignore_index=True)
        assert list(got.columns) == ["GEOID", *ATTRS, "COUNT"]
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)
        assert int(got["COUNT"].sum()) == len(persons) == 3000


def test_truth_is_refused_for_a_production_release(td_raw: dict[str, Any]) -> None:
    raw = {**td_raw, "rng": {"mode": "production"}, "account": "any"}
    ctx = experiment_context(parse_release_config(raw))
    with pytest.raises(accuracy.TruthRefused):
        accuracy.truth_frames(ctx)


def test_topdown_experiment_has_rows_for_every_table_and_geolevel(td_raw: dict[str, Any]) -> None:
    exp = run_experiment(parse_release_config(td_raw), runs=2, seed=3)
    assert exp.meta["products"] == ["topdown"] and exp.meta["skipped"] == {}
    m = exp.metrics
    overall = m[m["pop_bin"] == "all"].set_index("table")
    assert sorted(overall.index) == sorted(f"topdown_{lv}.csv" for lv in WIDTHS)
    assert (overall["geolevel"] == overall.index.str[len("topdown_"):-len(".csv")]).all()
    assert (overall["runs"] == 2).all() and (overall["rmse"] > 0).all()
    # an absent cell is a published 0: with the total invariant every table sums to the true total in every
    # run, so the signed errors over the (zero-filled) cells cancel exactly — an inner join would not
    assert np.allclose(overall["bias"].to_numpy(np.float64), 0.0, atol=1e-12)
    # true cells missed by a run are observed (error −true) and false positives fall in the "0" bin
    assert {"0", "1–9"} <= set(m.loc[m["table"] == "topdown_block.csv", "pop_bin"])
    assert overall["within_moe"].isna().all()   # TopDown states no per-cell MOE


def test_matrix_truth_and_experiment(tmp_path: Path) -> None:
    from dasflow import synth

    root = tmp_path / "store" / "confidential/synth"
    synth.generate(root, persons=2000, seed=4, states=["44"], formats=("topdown",))
    workload = {"schema": {"HHGQ": 8, "VOTINGAGE": 2, "HISPANIC": 2, "CENRACE": 63},
                "workload": {"total": "total", "va_hisp": ["VOTINGAGE", "HISPANIC"]}, "rho": "1/2",
                "level": "nation"}
    raw = {"release_id": "mx-exp", "universe": "US", "store": str(tmp_path / "store"),
           "inputs": {"matrix": "confidential/synth/topdown/persons/"},
           "products": [{"name": "matrix", "config_text": json.dumps(workload)}],
           "cap": {"rho": "1/2"}, "rng": {"mode": "test", "seed": 2}}
    config = parse_release_config(raw)
    truth = accuracy.truth_frames(experiment_context(config))["matrix"]
    persons = _persons(tmp_path / "store")
    assert truth["nation_total.csv"]["COUNT"].tolist() == [2000]
    expected = persons.groupby(["VOTINGAGE", "HISPANIC"]).size().reindex(
        pd.MultiIndex.from_product([range(2), range(2)], names=["VOTINGAGE", "HISPANIC"]), fill_value=0)
    got = truth["nation_va_hisp.csv"].set_index(["VOTINGAGE", "HISPANIC"])["COUNT"]
    assert got.sort_index().tolist() == expected.tolist()

    exp = run_experiment(config, runs=3, seed=1)
    overall = exp.metrics[exp.metrics["pop_bin"] == "all"].set_index("table")
    assert sorted(overall.index) == ["nation_total.csv", "nation_va_hisp.csv"]
    assert (overall["geolevel"] == "nation").all()
    assert overall.loc["nation_total.csv", "cells"] == 1 and overall.loc["nation_va_hisp.csv", "cells"] == 4
    assert overall["within_moe"].notna().all()   # Z90·√VARIANCE of the published estimate


def test_topdown_budget_sweep_changes_its_noise(td_raw: dict[str, Any]) -> None:
    """A scaled TopDown run draws with the scaled strategy budget (its noise is not read from the planned key):
    8× the budget cuts the block table's RMSE well below the unscaled one (σ ∝ 1/√ρ; a ratio of 0.8 leaves a
    wide margin for post-processing and the 2-run sample; deterministic for the fixed seed)."""
    exp = run_experiment(parse_release_config(td_raw), runs=2, seed=5, scales=(Fraction(1, 2), Fraction(4)))
    rmse = exp.metrics[(exp.metrics["pop_bin"] == "all") & (exp.metrics["table"] == "topdown_block.csv")] \
        .set_index("budget_scale")["rmse"]
    assert rmse[4.0] < 0.8 * rmse[0.5]

"""Budget-split sweeps (``--budget-split PRODUCT:LEVEL=WEIGHT,...``): parsing, the product's total kept exactly
(Fractions), every key's noise from the accountant (and from the product's own calibration for SafeTab-P's real
plan, TotalOnly noise included), TopDown's scaled twin, and an end-to-end split sweep with ``split_metrics.csv``.

The seeded check is two-sided at z = 3.29 per table (false-failure rate 0.1 % each, 2 checks: ≤ 0.2 % for a new
seed; the seed is fixed, so the outcome is deterministic)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dasflow.cli import main
from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.experiment import run_experiment
from dasflow.experiment.record import SPLIT_FILE
from dasflow.experiment.runner import SPLIT_COLUMNS, experiment_context, prepare_product, variant
from dasflow.experiment.scaling import Split, parse_split, scale_plan, split_factors, split_plan
from dasflow.io.store import LocalStore
from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec
from tests.dag.helpers import release_config, seed_inputs, topdown_release
from tests.release.helpers import give_counts_truth

Z = 3.29


def _spec(key: str, level: str, budget: Fraction, defn: str = "zcdp", delta2: Fraction = Fraction(1),
          **detail: Any) -> MeasurementSpec:
    if defn == "zcdp":
        mech, noise = "discrete_gaussian", accounting.gaussian_sigma2_sq(budget, delta2)
        variance: Fraction | float = noise
    else:
        mech, noise = "two_sided_geometric", accounting.geometric_scale(budget, delta2)
        variance = float(accounting.geometric_variance(noise))
    return MeasurementSpec(product="p", key=key, level=level, privacy_defn=defn, mechanism=mech,  # type: ignore[arg-type]
                           budget=budget, sensitivity=delta2, noise=noise, cells=1, variance=variance, detail=detail)


def test_parse_split() -> None:
    sp = parse_split("safetab-p:(USA, 1)=2,(STATE, 1)=1/2, (COUNTY, 2) = 0.25")
    assert sp.product == "safetab-p"
    assert sp.weights == (("(USA, 1)", Fraction(2)), ("(STATE, 1)", Fraction(1, 2)), ("(COUNTY, 2)", Fraction(1, 4)))
    for bad, what in (("nolevels", "PRODUCT:LEVEL"), ("p:a=0", "positive"), ("p:a=x", "--budget-split"),
                      ("p:a=1,A=2", "twice"), ("p:a", "LEVEL=WEIGHT")):
        with pytest.raises(InputError, match=what):
            parse_split(bad)


@pytest.mark.parametrize("defn", ["zcdp", "puredp"])
def test_split_keeps_the_total_exactly_and_noise_is_the_accountants(defn: str) -> None:
    plan = [_spec("a1", "A", Fraction(1, 7), defn, Fraction(3)), _spec("a2", "A", Fraction(2, 9), defn),
            _spec("b", "B", Fraction(1, 3), defn, Fraction(2)), _spec("c", "C", Fraction(5, 11), defn)]
    sp = parse_split("p:a=3,b=1")                   # level names match case-insensitively
    factors = split_factors(plan, sp)
    pool = Fraction(1, 7) + Fraction(2, 9) + Fraction(1, 3)
    assert factors["A"] * (Fraction(1, 7) + Fraction(2, 9)) == pool * Fraction(3, 4)
    assert factors["B"] * Fraction(1, 3) == pool * Fraction(1, 4) and factors["C"] == 1
    out = split_plan(plan, sp)
    total = sum((s.budget for s in out if s.budget is not None), Fraction(0))
    assert total == sum((s.budget for s in plan if s.budget is not None), Fraction(0))
    assert all(isinstance(s.budget, Fraction) for s in out)
    for old, new in zip(plan, out, strict=True):
        assert new.budget == old.budget * factors[old.level]  # type: ignore[operator]
        if defn == "zcdp":
            assert new.noise == accounting.gaussian_sigma2_sq(new.budget, old.sensitivity) == new.variance
        else:
            assert new.noise == accounting.geometric_scale(new.budget, old.sensitivity)
            assert new.variance == float(accounting.geometric_variance(new.noise))
    with pytest.raises(InputError, match="no plan level 'D'"):
        split_plan(plan, parse_split("p:D=1"))


def test_safetab_detail_budgets_follow_the_key() -> None:
    tob = Fraction(1, 20)
    spec = _spec("s2", "(USA, 1)", Fraction(3, 40), total_only_budget=tob,
                 total_only_noise=accounting.gaussian_sigma2(tob, 1),
                 total_only_variance=accounting.gaussian_sigma2(tob, 1),
                 per_query_budget=Fraction(3, 80), level_budget=Fraction(1, 8))
    out = scale_plan([spec], Fraction(4, 3))[0]
    d = out.detail
    assert d["total_only_budget"] == tob * Fraction(4, 3)
    assert d["total_only_noise"] == d["total_only_variance"] == accounting.gaussian_sigma2(tob * Fraction(4, 3), 1)
    assert d["per_query_budget"] == Fraction(1, 20) and d["level_budget"] == Fraction(1, 6)
    assert spec.detail["total_only_budget"] == tob          # the plan itself is not modified


def test_real_safetab_plan_split_matches_the_products_calibration(tmp_path: Path) -> None:
    from dasflow.demo import prepare_demo
    from dasflow.products.safetab_p.plan import noise_for

    config = prepare_demo(tmp_path / "store", 1000, 2)
    ctx = experiment_context(config)
    plugin = ctx.plugin("safetab-p")
    cfg = ctx.product_config("safetab-p")
    public = plugin.public_inputs(ctx.post_store(), config.inputs, cfg)
    plan = list(plugin.product(cfg).plan(cfg, public))
    levels = list(dict.fromkeys(s.level for s in plan))
    sp = parse_split(f"safetab-p:{levels[0]}=3,{levels[1]}=1")
    out = split_plan(plan, sp)
    assert sum((s.budget for s in out), Fraction(0)) == sum((s.budget for s in plan), Fraction(0))  # type: ignore[misc]
    changed = 0
    for s in out:
        d = s.detail
        per_query = d["level_budget"] * (d["gamma"] if d["stage"] == 1 else 1 - d["gamma"]) / d["stability"]
        assert d["per_query_budget"] == per_query
        assert s.noise == noise_for(public["config"], per_query)          # the product's own calibration
        if d["stage"] == 2:
            assert d["total_only_noise"] == noise_for(public["config"], d["level_budget"] / d["stability"])
        changed += s.level in levels[:2]
    assert changed == 4
    by_level = {lv: sum((s.budget for s in out if s.level == lv), Fraction(0)) for lv in levels[:2]}
    assert by_level[levels[0]] == 3 * by_level[levels[1]]            # type: ignore[operator]


def test_topdown_scaled_twin_and_split_refused(tmp_path: Path) -> None:
    config = parse_release_config(topdown_release(tmp_path, "td-split", states=("44",), persons=1500, synth_seed=3))
    state = prepare_product(experiment_context(config), "topdown")
    twin, specs = variant(state, Fraction(2))
    assert twin is not state.product
    expected = scale_plan(state.plan, Fraction(2))           # the accountant's recomputation of every key
    assert [(s.key, s.budget, s.noise, s.variance) for s in specs] == \
        [(s.key, s.budget, s.noise, s.variance) for s in expected]
    from dasflow.privacy import rng

    published = state.publish(specs, rng.seeded(1), "US", twin)
    assert int(published["topdown_US.csv"]["COUNT"].sum()) == 1500
    nmf = twin.measure(state.prepared, specs[0], rng.seeded(2))
    assert {float(v) for v in nmf.table["VARIANCE"]} <= {float(Fraction(v)) for v in
                                                         specs[0].detail["noise_by_gamma"].values()}
    with pytest.raises(InputError, match="budget splits are not simulated"):
        variant(state, split=Split("topdown", (("US", Fraction(1)),), "topdown:US=1"))


@pytest.fixture
def counts_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ReleaseConfig:
    give_counts_truth(monkeypatch)
    seed_inputs(LocalStore(tmp_path / "store"))
    return release_config(str(tmp_path / "store"))   # ρ: state 1/2 (σ² = 1), state_sex 1/4 (σ² = 2)


def test_split_sweep_end_to_end(counts_config: ReleaseConfig, tmp_path: Path) -> None:
    runs = 300
    exp = run_experiment(counts_config, runs=runs, seed=6, splits=[parse_split("counts:state=1,state_sex=1")])
    assert list(exp.splits.columns) == list(SPLIT_COLUMNS)
    rows = exp.splits[exp.splits["pop_bin"] == "all"].set_index("table")
    assert set(rows["budget_split"]) == {"counts:state=1,state_sex=1"}
    sigma2 = float(accounting.gaussian_sigma2(Fraction(3, 8), 1))      # both levels at (1/2 + 1/4)/2 = 3/8
    k = np.arange(-40, 41)
    p = np.exp(-k.astype(float) ** 2 / (2 * sigma2))
    p /= p.sum()
    var, fourth = float((p * k**2).sum()), float((p * k**4).sum())
    for table, row in rows.iterrows():
        n = row["cells"] * row["runs"]
        assert abs(row["rmse"] ** 2 - var) < Z * np.sqrt((fourth - var**2) / n), table
    assert set(exp.metrics["budget_scale"]) == {1.0}                 # the plan's own split ran too


def test_cli_writes_split_metrics(counts_config: ReleaseConfig, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "release.json"
    path.write_text(json.dumps(json.loads(counts_config.canonical_json()) | {"store": str(tmp_path / "store")}))
    out = tmp_path / "exp"
    code = main(["experiment", str(path), "--runs", "2", "--out", str(out), "--budget-split",
                 "counts:state=1,state_sex=3", "--budget-split", "counts:state=3,state_sex=1"])
    assert code == 0, capsys.readouterr().err
    table = pd.read_csv(out / SPLIT_FILE)
    assert list(table.columns) == list(SPLIT_COLUMNS)
    assert set(table["budget_split"]) == {"counts:state=1,state_sex=3", "counts:state=3,state_sex=1"}
    assert "Budget splits" in (out / "report.html").read_text()
    code = main(["experiment", str(path), "--runs", "1", "--out", str(out), "--budget-split", "counts:county=1"])
    assert code == 2 and "no plan level 'county'" in capsys.readouterr().err

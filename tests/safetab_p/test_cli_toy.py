"""The toy dataset end to end with both toy configs through ``dasflow safetab-p`` (validate, execute); output
formats (t1/t2 columns, '*' sex marginals, manifest with the ST21 fields)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

from dasflow.cli import main
from dasflow.privacy import accounting
from tests.account_helpers import account_args
from tests.safetab_p.helpers import TOY, TOY_ZCDP, toy_config_dict, write_dir

T1_HEADER = "REGION_ID|REGION_TYPE|ITERATION_CODE|COUNT"
T2_HEADER = "REGION_ID|REGION_TYPE|ITERATION_CODE|AGESTART|AGEEND|SEX|COUNT"


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)


def _params(tmp_path: Path, name: str, **changes) -> Path:
    raw = toy_config_dict(name)
    raw.update(changes)
    # the puredp toy dir ships only config.json; its iteration files are the toy ones (the toy persons use
    # codes such as 1011 that the real 2020 list does not have)
    return write_dir(tmp_path / f"params-{name}", raw, iteration_dir=TOY_ZCDP)


@pytest.mark.parametrize("name", ["zcdp", "puredp"])
def test_toy_end_to_end(tmp_path: Path, name: str, capsys):
    params = TOY_ZCDP if name == "zcdp" else _params(tmp_path, name)
    assert main(["safetab-p", "validate", str(params), str(TOY)]) == 0
    out = tmp_path / "out"
    assert main(["safetab-p", "execute", str(params), str(TOY), str(out), *account_args(tmp_path)]) == 0
    t1 = out / "t1" / "t1_US.csv"
    t2 = out / "t2" / "t2_US.csv"
    assert t1.read_text().splitlines()[0] == T1_HEADER
    assert t2.read_text().splitlines()[0] == T2_HEADER
    df = _read(t1)
    assert set(df.REGION_TYPE) <= {"USA", "STATE", "COUNTY", "TRACT", "PLACE", "AIANNH"}
    assert {"USA", "STATE"} <= set(df.REGION_TYPE)
    assert df.COUNT.map(lambda v: v.lstrip("-").isdigit()).all()
    manifest = json.loads((out / "manifest.json").read_text())
    run = manifest["runs"]["US"]
    assert run["total_budget"] == ("627/100" if name == "zcdp" else "1107/50")
    assert manifest["rng_mode"] == "production"
    spec = run["plan"][0]
    for field in ("stability", "gamma", "thresholds", "level_budget"):
        assert field in spec["detail"]
    assert spec["mechanism"] == ("discrete_gaussian" if name == "zcdp" else "two_sided_geometric")
    assert "4001" in run["total_only_iterations"]["2"]
    assert not list(out.rglob("*.tmp-*"))


def test_toy_t2_format_with_low_thresholds(tmp_path: Path):
    """With thresholds low enough that groups get Sex × Age cells: each (group, sex) has one '*' row equal to
    the sum of its cells, and T1 of a stat ≥ 1 group equals the sum of its T2 cells (zero suppression off)."""
    low = {k: [1, 2, 3] for k in toy_config_dict("zcdp")["thresholds_p"]}
    params = _params(tmp_path, "zcdp", thresholds_p=low, zero_suppression_chance=0,
                     privacy_budget_p_level_2_usa=10)
    out = tmp_path / "out"
    assert main(["safetab-p", "execute", str(params), str(TOY), str(out), *account_args(tmp_path)]) == 0
    t2 = _read(out / "t2" / "t2_US.csv")
    t1 = _read(out / "t1" / "t1_US.csv")
    assert len(t2) > 0
    t2["COUNT"] = t2.COUNT.astype(int)
    keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
    for _, g in t2.groupby([*keys, "SEX"]):
        star = g[g.AGESTART == "*"]
        cells = g[g.AGESTART != "*"]
        assert len(star) == 1 and star.AGEEND.iloc[0] == "*"
        assert int(star.COUNT.iloc[0]) == int(cells.COUNT.sum())
        assert len(cells) in (4, 9, 23)
    cell_sum = t2[t2.AGESTART != "*"].groupby(keys).COUNT.sum()
    t1i = t1.set_index(keys).COUNT.astype(int)
    for k, v in cell_sum.items():
        assert t1i[k] == v


def test_toy_us_and_pr_are_separate_runs(tmp_path: Path):
    """run_pr=true: a separate Puerto Rico run with PR region types, its own plan total and output files."""
    params = _params(tmp_path, "zcdp", run_pr=True)
    out = tmp_path / "out"
    assert main(["safetab-p", "execute", str(params), str(TOY), str(out), *account_args(tmp_path)]) == 0
    pr = _read(out / "t1" / "t1_PR.csv")
    us = _read(out / "t1" / "t1_US.csv")
    assert set(pr.REGION_TYPE) <= {"PR-STATE", "PR-COUNTY", "PR-TRACT", "PR-PLACE"}
    assert "PR-STATE" in set(pr.REGION_TYPE)
    assert set(pr[pr.REGION_TYPE == "PR-STATE"].REGION_ID) == {"72"}
    assert "72" not in set(us[us.REGION_TYPE == "STATE"].REGION_ID)
    manifest = json.loads((out / "manifest.json").read_text())
    # PR: level 1 state, county 0.008 each; level 2 0.534 + 0.159 + 2.43 + 2.43
    assert manifest["runs"]["PR"]["total_budget"] == str(Fraction("0.016") + Fraction("5.553"))
    assert manifest["runs"]["PR"]["accounting"]["rho"] == manifest["runs"]["PR"]["total_budget"]


def test_toy_config_total_budgets():
    """The toy puredp config's ε total (US run) as printed by the plan: 1107/50 = 22.14."""
    raw = toy_config_dict("puredp")
    total = sum(accounting.parse_budget(v, k) for k, v in raw.items()
                if k.startswith("privacy_budget_p_level") and "_pr_" not in k)
    assert str(total) == "1107/50"

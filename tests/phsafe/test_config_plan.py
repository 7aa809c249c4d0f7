"""Config validation (R1, R2), the budget plan and accounting (R9, R12, R15) and the calculator (R13)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from dasflow.errors import InputError
from dasflow.products.phsafe import PHSAFE, load_config, parse_config, plan, planning, rho_for_moe
from dasflow.products.phsafe.tables import MEASURED
from tests.phsafe.builders import PR_CONFIG, US_CONFIG, config_with, raw_config


def test_r1_production_configs_load() -> None:
    us, pr = load_config(US_CONFIG), load_config(PR_CONFIG)
    assert us.universe == "US" and len(us.state_filter) == 51
    assert pr.universe == "PR" and pr.state_filter == ("72",)
    assert us.budgets["PH3"]["state_A-G"] == Fraction("0.662976")  # exact, not a float
    assert us.tau == {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10}


def _reject(raw: dict[str, Any], needle: str) -> None:
    with pytest.raises(InputError) as info:
        parse_config(raw, file="config.json")
    assert needle in str(info.value), str(info.value)
    assert "config.json" in str(info.value)


def test_r1_rejects_missing_extra_negative_and_non_numeric_budget_keys() -> None:
    raw = raw_config()
    del raw["privacy_budget"]["PH3"]["state_A-G"]
    _reject(raw, "privacy_budget.PH3.state_A-G")
    raw = raw_config()
    raw["privacy_budget"]["PH2"]["usa_A-G"] = 0.1  # PH2 takes only the * keys
    _reject(raw, "privacy_budget.PH2.usa_A-G")
    raw = raw_config()
    raw["privacy_budget"]["PH7"]["state_H,I"] = -0.5
    _reject(raw, "privacy_budget.PH7.state_H,I")
    raw = raw_config()
    raw["privacy_budget"]["PH1_num"]["usa_*"] = "lots"
    _reject(raw, "privacy_budget.PH1_num.usa_*")
    raw = raw_config()
    raw["privacy_budget"]["PH9"] = {"usa_*": 1}
    _reject(raw, "PH9")
    raw = raw_config()
    del raw["privacy_budget"]["PH6"]
    _reject(raw, "PH6")


def test_r1_rejects_bad_tau_state_filter_reader_defn_and_unknown_keys() -> None:
    good = {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10}
    for tau, needle in (({k: v for k, v in good.items() if k != "PH7"}, "tau"),
                        ({**good, "PH1_num": 0}, "tau.PH1_num"),
                        ({**good, "PH1_num": 1.5}, "tau.PH1_num")):
        raw = raw_config()
        raw["tau"] = tau
        _reject(raw, needle)
    for sf in ([], ["01", "01"], ["03"], ["01", "72"], ["1"]):
        raw = raw_config()
        raw["state_filter"] = sf
        _reject(raw, "state_filter")
    raw = raw_config()
    raw["reader"] = "spark"
    _reject(raw, "reader")
    raw = raw_config()
    raw["privacy_defn"] = "approxdp"
    _reject(raw, "privacy_defn")
    raw = raw_config()
    raw["extra"] = 1
    _reject(raw, "extra")
    raw = raw_config()
    del raw["tau"]
    _reject(raw, "tau")
    raw = config_with(states=["72"])  # PR with non-zero Nation budgets
    _reject(raw, "usa_")


def test_r1_infinity_budget_from_json_text(tmp_path: Path) -> None:
    text = US_CONFIG.read_text().replace("0.662976", "Infinity")
    p = tmp_path / "c.json"
    p.write_text(text)
    cfg = load_config(p)
    assert cfg.budgets["PH3"]["state_A-G"] is None
    spec = next(s for s in plan(cfg) if s.key == "PH3/state_A-G")
    assert spec.noise == 0 and spec.variance == 0 and spec.mechanism == "none"
    assert planning.total(plan(cfg)) is None


def test_r2_zero_budget_levels_are_not_planned() -> None:
    us, pr = plan(load_config(US_CONFIG)), plan(load_config(PR_CONFIG))
    assert len(us) == 7 * 6 + 2 * 2
    assert len(pr) == 7 * 3 + 2 * 1 and all(s.level.startswith("state_") for s in pr)
    raw = raw_config()
    for k in raw["privacy_budget"]["PH6"]:
        raw["privacy_budget"]["PH6"][k] = 0
    raw["privacy_budget"]["PH7"]["usa_A-G"] = 0
    keys = {s.key for s in plan(parse_config(raw))}
    assert not any(k.startswith("PH6/") for k in keys)
    assert "PH7/usa_A-G" not in keys and "PH7/usa_*" in keys


def test_r12_plan_total_equals_config_sum_and_bounded_is_double() -> None:
    us = plan(load_config(US_CONFIG))
    assert planning.total(us) == Fraction("1.257281")
    assert planning.bounded_total(us) == Fraction("2.514562")
    assert planning.config_total(load_config(US_CONFIG)) == Fraction("1.257281")
    pr = plan(load_config(PR_CONFIG))
    assert planning.total(pr) == Fraction("1.226649")
    per_table = {t: sum((s.budget or Fraction(0) for s in us if s.detail["table"] == t), Fraction(0))
                 for t in MEASURED}
    assert per_table["PH3"] == Fraction("0.679419") and per_table["PH1_denom"] == Fraction("0.001506")
    assert per_table["PH6"] == Fraction("0.007691") and per_table["PH2"] == Fraction("0.018990")
    # every charge is the configured rho, and no derived table is charged
    cfg = load_config(US_CONFIG)
    for s in us:
        assert s.budget == cfg.budgets[str(s.detail["table"])][s.level]
        assert s.detail["table"] not in ("PH5_num", "PH8_num")


def test_plan_is_data_independent_and_product_interface() -> None:
    cfg = load_config(US_CONFIG)
    assert PHSAFE.name == "phsafe"
    assert PHSAFE.plan(cfg, {}) == PHSAFE.plan(US_CONFIG, {"geo": "ignored"}) == plan(cfg)


# R15 / R9: sigma^2 = c^2/(2 rho) exactly, for the Table-10 parameters (phsafe.md §5 noise table).
SIGMA2 = {
    ("PH1_num", "usa_*"): (22, "0.002619", 92401.7),
    ("PH1_num", "state_*"): (22, "0.016371", 14782.2),
    ("PH1_num", "state_A-G"): (22, "0.141622", 1708.8),
    ("PH3", "usa_H,I"): (14, "0.001061", 92365.7),
    ("PH3", "state_H,I"): (14, "0.006630", 14781.3),
    ("PH3", "state_A-G"): (14, "0.662976", 147.8),
    ("PH6", "state_*"): (14, "0.006630", 14781.3),
    ("PH8_denom", "usa_A-G"): (2, "0.000022", 90909.1),
    ("PH5_denom", "state_*"): (2, "0.000135", 14814.8),
    ("PH1_denom", "state_A-G"): (2, "0.00117", 1709.4),
}


def test_r9_r15_variance_is_exact_sigma2_of_table10() -> None:
    specs = {s.key: s for s in plan(load_config(US_CONFIG))}
    for (table, level), (c, rho, printed) in SIGMA2.items():
        s = specs[f"{table}/{level}"]
        assert s.sensitivity == c * c  # Δ₂² of the level vector (the MeasurementSpec convention)
        assert s.variance == s.noise == Fraction(c * c) / (2 * Fraction(rho))
        assert round(float(s.variance), 1) == printed
        assert s.mechanism == "discrete_gaussian"
    assert specs["PH3/state_A-G"].variance == Fraction(196) / (2 * Fraction("0.662976"))


def test_r9_stability_constants() -> None:
    cfg = load_config(US_CONFIG)
    for table in ("PH1_num", "PH2", "PH4", "PH7"):
        assert planning.stability(cfg, table) == 22
    for table in ("PH3", "PH6"):
        assert planning.stability(cfg, table) == 14
    for table in ("PH1_denom", "PH5_denom", "PH8_denom"):
        assert planning.stability(cfg, table) == 2


def test_puredp_plan_uses_geometric_scale_c_over_eps() -> None:
    cfg = parse_config(config_with(defn="puredp"))
    s = next(x for x in plan(cfg) if x.key == "PH7/state_*")
    assert s.mechanism == "two_sided_geometric" and s.noise == Fraction(22) / Fraction("0.016371")
    assert s.detail["noise_distribution"] == "Two-Sided Geometric"
    assert isinstance(s.variance, float) and s.variance > 0


# R13: Table 10 (tau; MOE) -> unbounded rho, bounded = 2x (phsafe.md §5).
TABLE10 = [
    (22, 500, "0.002619"), (22, 200, "0.016371"), (22, 68, "0.141622"),
    (2, 500, "0.000022"), (2, 200, "0.000135"), (2, 68, "0.00117"),
    (14, 500, "0.001061"), (14, 200, "0.006630"), (14, 20, "0.662976"),
]


@pytest.mark.parametrize(("c", "moe", "rho"), TABLE10)
def test_r13_calculator_reproduces_table10(c: int, moe: int, rho: str) -> None:
    got = rho_for_moe(c, moe)
    assert got == Fraction(rho)
    assert 2 * got == 2 * Fraction(rho)
    # and every production config level is one of these
    assert planning.moe_for_rho(c, got) == pytest.approx(moe, abs=4.1)


def test_r13_config_budgets_are_calculator_values() -> None:
    raw = json.loads(US_CONFIG.read_text())
    values = {Fraction(r) for _, _, r in TABLE10}
    for levels in raw["privacy_budget"].values():
        for v in levels.values():
            assert Fraction(str(v)) in values


def test_phsafe_implements_the_product_protocol() -> None:
    from dasflow.products.base import Product
    assert isinstance(PHSAFE, Product)

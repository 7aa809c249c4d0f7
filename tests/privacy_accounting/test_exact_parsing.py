"""Exact budget parsing and bad input (the accounting helper's contract; DESIGN §4; spine spec S4).

Every rejection is a ValueError that names the parameter and shows the value.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest

from dasflow.privacy import accounting as acc


def test_json_budgets_stay_exact() -> None:
    """load_json_exact keeps 0.534 as Decimal('0.534') (→ 267/500), ints as int, and Infinity as +∞."""
    data = acc.load_json_exact('{"rho": 0.534, "n": 3, "inf": Infinity, "e": 1e-3, "list": [0.1, 0.2]}')
    assert data["rho"] == Decimal("0.534") and isinstance(data["n"], int)
    assert acc.parse_budget(data["rho"], "rho") == Fraction(267, 500)
    assert acc.parse_budget(data["n"], "n") == 3
    assert acc.parse_budget(data["e"], "e") == Fraction(1, 1000)
    assert acc.parse_budget(data["inf"], "inf") is None
    # no 0.30000000000000004:
    assert sum(acc.parse_budget(x, "x") or 0 for x in data["list"]) == Fraction(3, 10)
    assert acc.load_json_exact(b'[2.134]') == [Decimal("2.134")]


def test_json_nan_rejected() -> None:
    with pytest.raises(ValueError, match="NaN"):
        acc.load_json_exact('{"rho": NaN}')


# An excerpt of the 2020 SafeTab-P production config.json (Census format, spec safetab-p.md §8), as text.
_SAFETAB_CONFIG = """{
  "max_race_codes": 8,
  "privacy_budget_p_level_1_usa": 0.008, "privacy_budget_p_level_1_state": 0.008,
  "privacy_budget_p_level_1_county": 0.008, "privacy_budget_p_level_1_tract": 0.008,
  "privacy_budget_p_level_1_place": 0.008, "privacy_budget_p_level_1_aiannh": 0,
  "privacy_budget_p_level_2_usa": 2.134, "privacy_budget_p_level_2_state": 2.134,
  "privacy_budget_p_level_2_county": 0.159, "privacy_budget_p_level_2_tract": 0.159,
  "privacy_budget_p_level_2_place": 0.159, "privacy_budget_p_level_2_aiannh": 0.159,
  "privacy_budget_p_stage_1_fraction": 0.1,
  "zero_suppression_chance": 0.9999
}"""


def test_production_config_budgets_parse() -> None:
    """A Census-format config parses exactly: every privacy_budget_p_* is a Fraction; the US total is exactly
    4.944 (safetab-p.md §8), γ = 1/10, the zero-suppression chance 9999/10000."""
    cfg = acc.load_json_exact(_SAFETAB_CONFIG)
    budgets = {k: acc.parse_budget(v, k) for k, v in cfg.items() if k.startswith("privacy_budget_p_level")}
    assert budgets["privacy_budget_p_level_2_usa"] == Fraction("2.134")
    assert all(isinstance(b, Fraction) for b in budgets.values())
    assert sum((b for b in budgets.values() if b is not None), Fraction(0)) == Fraction("4.944")
    assert acc.parse_fraction_open(cfg["privacy_budget_p_stage_1_fraction"], "gamma") == Fraction(1, 10)
    assert acc.parse_fraction_open(cfg["zero_suppression_chance"], "chance") == Fraction(9999, 10000)


@pytest.mark.parametrize("value,expected", [
    (0, Fraction(0)), (7, Fraction(7)), (Fraction(1, 3), Fraction(1, 3)),
    (Decimal("0.008"), Fraction(1, 125)),
    ("0.159", Fraction(159, 1000)), (" 1/3 ", Fraction(1, 3)), ("2e-3", Fraction(1, 500)),
    (0.1, Fraction(1, 10)), (2.134, Fraction(2134, 1000)), (1e-10, Fraction(1, 10**10)),
])
def test_parse_budget_accepts_exact_values(value: object, expected: Fraction) -> None:
    """Floats are accepted only via their short repr: 0.1 → 1/10 (never 3602879701896397/2^55)."""
    assert acc.parse_budget(value, "rho") == expected


@pytest.mark.parametrize("value", [Decimal("Infinity"), math.inf, "Infinity", "inf", "+Infinity"])
def test_parse_budget_infinity_means_no_noise(value: object) -> None:
    """The Census configs' JSON literal Infinity: infinite budget → None → no noise, variance 0."""
    assert acc.parse_budget(value, "rho") is None
    assert acc.gaussian_sigma2(value, 22) == 0
    assert acc.geometric_scale(value, 2) == 0
    assert acc.geometric_variance(acc.geometric_scale(value, 1)) == 0
    assert acc.discrete_gaussian_variance(acc.gaussian_sigma2(value, 1)) == 0
    with pytest.raises(ValueError, match=r"rho=.*infinite budget is not allowed"):
        acc.parse_budget(value, "rho", allow_infinite=False)


@pytest.mark.parametrize("value,why", [
    (-0.5, "must be >= 0"), ("-1/3", "must be >= 0"), (Decimal("-0.1"), "must be >= 0"),
    (Decimal("NaN"), "finite"), (math.nan, "finite"), ("NaN", "finite"), (Decimal("-Infinity"), "finite"),
    (-math.inf, "finite"), (True, "boolean"), (False, "boolean"), (0.1 + 0.2, "float-drifted"),
    (1 / 3, "float-drifted"), ("abc", "not an exact"), ("1/0", "not an exact"), ("", "not an exact"),
    ([1], "unsupported type"), (None, "missing budget"),
])
def test_parse_budget_rejects_bad_values(value: object, why: str) -> None:
    """Negative, NaN, −∞, bool, float-drifted, unparsable and non-numeric budgets: ValueError naming the
    parameter and the value."""
    with pytest.raises(ValueError) as info:
        acc.parse_budget(value, "privacy_budget_p_level_2_usa")
    message = str(info.value)
    assert message.startswith("privacy_budget_p_level_2_usa=") and why in message
    assert repr(value) in message


def test_noise_calibrations_exact() -> None:
    """gaussian_sigma2 = Δ²/(2ρ), geometric_scale = Δ/ε, exact Fractions; zero budget and bad Δ rejected."""
    assert acc.gaussian_sigma2(Fraction("0.534") / 9, 1) == Fraction(9, 2) / Fraction("0.534")
    assert acc.gaussian_sigma2("1/2", 1) == 1
    assert acc.geometric_scale(Fraction("4.27") / 9, 1) == Fraction(900, 427)
    assert acc.gaussian_sigma2_sq(1, 2) == 1  # TopDown change-one: Δ² = 2 → σ² = 1/ρ
    for bad, name in ((0, "rho"), (Fraction(-1), "rho")):
        with pytest.raises(ValueError, match=name):
            acc.gaussian_sigma2(bad, 1)
    with pytest.raises(ValueError, match="epsilon=0"):
        acc.geometric_scale(0, 1)
    with pytest.raises(ValueError, match="sensitivity=0"):
        acc.gaussian_sigma2(1, 0)
    with pytest.raises(ValueError, match="sensitivity=-2"):
        acc.geometric_scale(1, -2)
    with pytest.raises(ValueError, match="sigma2=-1"):
        acc.discrete_gaussian_variance(-1)
    with pytest.raises(ValueError, match=r"scale=.*float-drifted"):
        acc.geometric_variance(0.1 + 0.2)


def test_round_rational_modes() -> None:
    """Rounding is explicit and exact on the rational (no binary detour); halves go up in half_up."""
    x = Fraction(5, 1000)  # 0.005
    assert acc.round_rational(x, 2, "half_up") == Fraction(1, 100)
    assert acc.round_rational(x, 2, "half_even") == 0
    assert acc.round_rational(x, 2, "floor") == 0 and acc.round_rational(x, 2, "ceil") == Fraction(1, 100)
    assert acc.round_rational(Fraction(-5, 1000), 2, "half_up") == Fraction(-1, 100)
    assert acc.round_rational(Decimal("0.58739"), 2, "half_up") == Fraction(59, 100)
    with pytest.raises(ValueError, match="mode"):
        acc.round_rational(x, 2, "banker")  # type: ignore[arg-type]


def test_s4_shares_exact() -> None:
    """Spine S4: shares > 0 summing exactly to 1; float drift or an inexact sum is rejected. The PL94 US
    persons geolevel_budget_prop (104, 1440, 447, 687, 1256, 165)/4099 sums to exactly 1."""
    shares = acc.validate_shares([Fraction(n, 4099) for n in (104, 1440, 447, 687, 1256, 165)], "beta")
    assert sum(shares) == 1
    quarter = Fraction(1, 4)
    assert acc.validate_shares(["0.5", "0.25", "0.25"], "alpha") == (2 * quarter, quarter, quarter)
    with pytest.raises(ValueError, match="alpha: shares sum to"):
        acc.validate_shares(["0.5", "0.25", "0.2"], "alpha")
    with pytest.raises(ValueError, match=r"beta\[1\]=0"):
        acc.validate_shares([1, 0], "beta")
    with pytest.raises(ValueError, match=r"beta\[0\]=.*float-drifted"):
        acc.validate_shares([0.1 + 0.2, 0.7], "beta")


def test_bad_parameters_name_themselves() -> None:
    """Non-rational or out-of-range parameters where exactness needs a rational: the message names them."""
    with pytest.raises(ValueError, match="alpha=1"):
        acc.geometric_rdp(1, "0.5")
    with pytest.raises(ValueError, match="delta=0"):
        acc.zcdp_to_approx_dp(1, 0)
    with pytest.raises(ValueError, match="gamma=1"):
        acc.safetab_level_calibration(6, "dgauss", gamma=1)
    with pytest.raises(ValueError, match=r"moe='6\.5'"):
        acc.dgauss_rho_for_moe("6.5")
    with pytest.raises(ValueError, match="mechanism"):
        acc.safetab_level_calibration(6, "laplace")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="definition='approxdp'"):
        acc.Spend("approxdp", Fraction(1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="degree=0"):
        acc.Spend("zcdp", Fraction(1), degree=0)
    with pytest.raises(ValueError, match=r"lvl\.budget=Fraction\(-1, 1\)"):
        acc.Spend("zcdp", Fraction(-1), label="lvl")
    with pytest.raises(ValueError, match=r"lvl\.stability=Fraction\(0, 1\)"):
        acc.Spend("zcdp", Fraction(1), stability=Fraction(0), label="lvl")

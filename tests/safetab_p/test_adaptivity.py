"""Adaptivity with noise off (ground-truth twin): stat levels follow the thresholds exactly (ST6, strict <),
Step-2 outputs cover the whole public (Sex, AgeK) domain (ST7, W6), outputs are integers (ST11)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pandas as pd

from dasflow.privacy import rng
from dasflow.products.safetab_p.measure import age_ranges, stat_levels
from dasflow.products.safetab_p.product import ground_truth_config, run_universe
from tests.safetab_p.helpers import config, person, persons_table, public, real_iterations, toy_config_dict

COUNTIES = ["01001", "01003", "01005", "01007", "01009", "01011"]
SIZES = [2, 3, 4, 5, 8, 9]          # with θ = (3, 5, 8): stat 0, 1 (=θ1), 1, 2 (=θ2), 3 (=θ3), 3
EXPECTED = [0, 1, 1, 2, 3, 3]


def _run():
    raw = toy_config_dict("zcdp")
    raw["thresholds_p"]["(COUNTY, 2)"] = [3, 5, 8]
    cfg = ground_truth_config(config(raw))
    blocks = [(c + "000001" + "0001", "99999", "9999") for c in COUNTIES]
    rows = []
    for c, n in zip(COUNTIES, SIZES, strict=True):
        for i in range(n):
            rows.append(person(c + "000001" + "0001", ["1340"], "9950", age=(i * 13) % 116, sex=1 + i % 2))
    pub = public(cfg, real_iterations(), blocks)
    return run_universe(pub, {"persons": persons_table(rows), "source": "p"}, rng.seeded(3))


def test_st6_stat_levels_follow_thresholds_exactly():
    """ST6: with noise off, stat = digitize(total, θ): boundaries θ1, θ2, θ3 go up (strict <)."""
    result = _run()
    m = result.measurements["safetab-p/US/COUNTY/2/stage2"]
    t = m.table
    slovak = t[t["ITERATION_CODE"].astype(str) == "1061"]
    stat = slovak.groupby("REGION_ID", observed=True)["STAT_LEVEL"].first()
    assert [int(stat[c]) for c in COUNTIES] == EXPECTED
    # groups with zero persons are tabulated too (stat 0, count 0)
    other = t[(t["ITERATION_CODE"].astype(str) == "1003")]
    assert len(other) == len(COUNTIES) and (other["NOISY"] == 0).all()
    assert (m.table["VARIANCE"] == 0).all() and m.spec.mechanism == "none"


def test_st6_digitize_is_exact():
    """ST6: integer totals against fractional thresholds: θ ≤ total ⇔ ⌈θ⌉ ≤ total."""
    th = (Fraction(9943, 2), Fraction(19971), Fraction(149971))
    got = stat_levels(np.array([4971, 4972, 19970, 19971, 149970, 149971, -5]), th)
    assert got.tolist() == [0, 1, 1, 2, 2, 3, 0]


def test_st7_full_public_cell_domain_and_t2_marginals():
    """ST7/W6: a stat-k group releases every Sex × AgeK cell (2·(len(bins)+1)), empty cells included, with the
    production age ranges; T1 = Σ cells; T2 carries per-sex '*' rows; stage-1 totals are not in the
    outputs."""
    result = _run()
    t2 = result.tables["t2"]
    t1 = result.tables["t1"]
    for c, n, k in zip(COUNTIES, SIZES, EXPECTED, strict=True):
        g = t2[(c == t2.REGION_ID) & (t2.ITERATION_CODE == "1061") & (t2.REGION_TYPE == "COUNTY")]
        cells = g[g.AGESTART != "*"]
        if k == 0:
            assert len(g) == 0
            continue
        starts, ends = age_ranges(k)
        assert len(cells) == 2 * len(starts)
        assert sorted(set(cells.AGESTART.astype(int))) == sorted(starts.tolist())
        assert sorted(set(cells.AGEEND.astype(int))) == sorted(ends.tolist())
        assert int(cells.COUNT.sum()) == n
        assert (cells.COUNT == 0).any()  # empty cells are present
        stars = g[g.AGESTART == "*"]
        assert len(stars) == 2 and (stars.AGEEND == "*").all()
        for sex in ("1", "2"):
            assert int(stars[stars.SEX.astype(str) == sex].COUNT.iloc[0]) == int(
                cells[cells.SEX.astype(str) == sex].COUNT.sum())
        row = t1[(c == t1.REGION_ID) & (t1.ITERATION_CODE == "1061") & (t1.REGION_TYPE == "COUNTY")]
        assert row.COUNT.tolist() == [n]
    assert t1.COUNT.dtype == np.int64 and t2.COUNT.dtype == np.int64
    assert age_ranges(3)[1][-1] == AGE23_LAST


AGE23_LAST = 115


def test_age_bins_production():
    """Age bins are digitize(QAGE, bins): AGE4 = [18, 45, 65] → 0-17, 18-44, 45-64, 65-115."""
    s, e = age_ranges(1)
    assert list(zip(s.tolist(), e.tolist(), strict=True)) == [(0, 17), (18, 44), (45, 64), (65, 115)]
    assert len(age_ranges(2)[0]) == 9 and len(age_ranges(3)[0]) == 23


def test_noisy_run_is_integer_and_keeps_negatives():
    """ST11: with noise, counts are integers and negative values are kept (allow_negative_counts=true);
    with allow_negative_counts=false they are clamped at 0."""
    raw = toy_config_dict("zcdp")
    raw["zero_suppression_chance"] = 0
    for k in list(raw):
        if k.startswith("privacy_budget_p_level"):
            raw[k] = Decimal("0.001") if k.endswith("_2_county") else 0
    blocks = [("010010000010001", "99999", "9999")]
    pub = public(config(raw), real_iterations(), blocks)
    res = run_universe(pub, {"persons": persons_table([person()]), "source": "p"}, rng.seeded(5))
    assert (res.tables["t1"].COUNT < 0).any()
    raw["allow_negative_counts"] = False
    pub = public(config(raw), real_iterations(), blocks)
    res = run_universe(pub, {"persons": persons_table([person()]), "source": "p"}, rng.seeded(5))
    assert (res.tables["t1"].COUNT >= 0).all()


def test_the_truth_tables_are_the_twins_release_tables_unsorted_with_categorical_keys():
    """``outputs.truth_tables`` (the accuracy report's and experiments' SafeTab-P truth): the rows and values of
    the twin's t1/t2 files, T1 in key order with its key columns categoricals of the same text."""
    from dasflow.products.safetab_p import outputs

    result = _run()
    cfg = ground_truth_config(config(toy_config_dict("zcdp")))
    truth = outputs.truth_tables(result.measurements, cfg)
    t1 = truth["t1"]
    assert list(t1.columns) == list(result.tables["t1"].columns)
    assert all(isinstance(t1[c].dtype, pd.CategoricalDtype) for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE"))
    assert not t1[["REGION_TYPE", "REGION_ID", "ITERATION_CODE"]].astype(str).equals(
        result.tables["t1"][["REGION_TYPE", "REGION_ID", "ITERATION_CODE"]].astype(str))  # not in release order
    ordered = outputs.release_t1(t1.astype({c: str for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE")}))
    pd.testing.assert_frame_equal(ordered, result.tables["t1"], check_dtype=False)
    assert len(t1) > 1000 and t1["COUNT"].dtype == np.int64
    pd.testing.assert_frame_equal(truth["t2"], result.tables["t2"])

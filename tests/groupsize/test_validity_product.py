"""Output validity V1-V3, metrics E1, generators E2 and the groupsize product end to end."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.postprocess.tree_dp import TreeShape
from dasflow.privacy import rng as prng
from dasflow.privacy import samplers
from dasflow.products.base import Product
from dasflow.products.groupsize.mechanisms import MECHANISM_QUERY, postprocess, query_sensitivity, true_query
from dasflow.products.groupsize.metrics import consistency_violations, l1_error, validity
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct
from dasflow.products.groupsize.synthetic import census_like, counts_from_groups, taxi_like

#: Running example (spec 1.6): GA has units A(3), B(1), C(1); NY has D(3), E(1), F(2). G = {1,2,3}, n = 6.
EXAMPLE = pd.DataFrame(
    {
        "STATE": ["GA", "GA", "GA", "NY", "NY", "NY"],
        "COUNTY": ["GA", "GA", "GA", "NY", "NY", "NY"],
        "UNIT": ["A", "B", "C", "D", "E", "F"],
        "SIZE": [3, 1, 1, 3, 1, 2],
    }
)
EXAMPLE_GEO = pd.DataFrame({"STATE": ["GA", "NY"], "COUNTY": ["GA", "NY"]})


def _noisy(counts, mech, eps, g, shape):
    q = MECHANISM_QUERY[mech]
    noisy, var = [], []
    for l, c in enumerate(counts):
        sens = query_sensitivity(q, shape.sizes[l], "l1")
        b = Fraction(sens * len(counts)) / eps
        t = true_query(c, q)
        noisy.append(t + samplers.two_sided_geometric(b, t.shape, g))
        a = math.exp(-1 / float(b))
        var.append(2 * a / (1 - a) ** 2)
    return noisy, var


def test_v3_running_example_truth_is_valid():
    """V3: the fixture's true counts are c^GA = (2,0,1), c^NY = (1,1,1), c^US = (3,1,2) and pass V1."""
    shape = TreeShape((np.zeros(2, dtype=np.int64), np.arange(2, dtype=np.int64)))
    leaf = np.array([0, 0, 0, 1, 1, 1])
    counts = counts_from_groups(shape, leaf, EXAMPLE["SIZE"].to_numpy(), 3)
    np.testing.assert_array_equal(counts[0], [[3, 1, 2]])
    np.testing.assert_array_equal(counts[1], [[2, 0, 1], [1, 1, 1]])
    assert validity(shape, counts, 6).ok


@pytest.mark.parametrize("mech", ["M_DP", "M_DPC", "M_DPC*", "M_DPC*-R", "TopDown"])
def test_v1_v3_every_mechanism_valid_for_any_noise(mech):
    """V1/V3: on the running example (3 levels: US > {GA, NY} > one county each) and a random tree, every exact
    mechanism returns non-negative integers, #CV = 0 and every level summing to n, for 40 noise draws at
    ε in {0.1, 1}."""
    g = prng.seeded(99)
    shape_ex = TreeShape((np.zeros(2, dtype=np.int64), np.arange(2, dtype=np.int64)))
    ex = counts_from_groups(shape_ex, np.array([0, 0, 0, 1, 1, 1]), EXAMPLE["SIZE"].to_numpy(), 3)
    rng = np.random.default_rng(3)
    shape_r = TreeShape((np.zeros(3, dtype=np.int64), np.array([0, 0, 1, 2, 2, 2], dtype=np.int64)))
    rand = counts_from_groups(shape_r, rng.integers(0, 6, size=40), rng.integers(1, 6, size=40), 5)
    for shape, counts in ((shape_ex, ex), (shape_r, rand)):
        n = int(counts[0].sum())
        for draw in range(20):
            eps = Fraction(1, 10) if draw % 2 else Fraction(1)
            noisy, var = _noisy(counts, mech, eps, g, shape)
            res = postprocess(mech, shape, noisy, n, var)
            v = validity(shape, res.levels, n)
            assert v.ok, (mech, draw, v)


def test_v2_relaxed_baselines_report_violations():
    """V2: M_H-R / M_HC-R return rounded outputs whose #CV is counted (not hidden); over noisy draws on a
    Census-like miniature the count is positive, while the relaxed (unrounded) solution is consistent."""
    data = census_like(4, n=3000, k=12, states=3, counties=12)
    g = prng.seeded(5)
    cvs = {"M_H-R": 0, "M_HC-R": 0}
    for mech in cvs:
        for _ in range(3):
            noisy, var = _noisy(data.counts, mech, Fraction(1, 2), g, data.shape)
            res = postprocess(mech, data.shape, noisy, data.n, var)
            assert "qp_status=Solved" in res.note
            cvs[mech] += consistency_violations(data.shape, res.levels)
    assert cvs["M_H-R"] > 0 and cvs["M_HC-R"] > 0


def test_e1_metrics_hand_computed():
    """E1: per-level L1 = mean over regions of sum_j |hat - true|; #CV counts (non-leaf r, j) mismatches."""
    shape = TreeShape((np.zeros(2, dtype=np.int64),))
    truth = [np.array([[3, 1]]), np.array([[2, 0], [1, 1]])]
    rel = [np.array([[3, 2]]), np.array([[2, 1], [2, 1]])]
    assert l1_error(rel, truth) == [1.0, 1.0]
    assert consistency_violations(shape, rel) == 1
    v = validity(shape, rel, 4)
    assert not v.ok and v.level_totals == (5, 6)


def test_e2_generators_seeded_with_manifest():
    """E2: generators are deterministic per seed, consistent across levels and describe themselves."""
    a, b = census_like(7, n=20_000, k=50), census_like(7, n=20_000, k=50)
    for x, y in zip(a.counts, b.counts, strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.manifest["n_groups"] == 20_000 == a.n
    assert a.manifest["regions_per_level"] == [1, 52, 3144] and a.manifest["k"] == 50
    assert validity(a.shape, a.counts, a.n).ok
    assert a.manifest["N_individuals"] > a.n
    t = taxi_like(3, taxis=500, k=3000)
    assert t.manifest["regions_per_level"] == [1, 6, 263] and t.n == 500
    assert validity(t.shape, t.counts, t.n).ok
    assert not np.array_equal(census_like(8, n=20_000, k=50).counts[2], a.counts[2])


@pytest.mark.parametrize("defn", ["puredp", "zcdp"])
def test_product_end_to_end_running_example(defn):
    """The Product interface on the running example: plan -> prepare -> measure -> postprocess -> tables."""
    prod = GroupSizeProduct(GroupSizeConfig(budget=Fraction(1), privacy_defn=defn, mechanism="M_DPC", k=3))
    assert isinstance(prod, Product)
    public = {"geography": EXAMPLE_GEO, "n_groups": 6}
    plan = prod.plan(prod.config, public)
    prepared = prod.prepare({"households": EXAMPLE}, public)
    g = prng.seeded(1)
    meas = {s.key: prod.measure(prepared, s, g) for s in plan}
    assert all(m.rng_mode == "test" for m in meas.values())
    est = prod.postprocess(meas, public)
    tabs = prod.tables(est)
    county = tabs["groupsize_county"]
    assert list(county.columns) == ["STATE", "COUNTY", "HOUSEHOLD_SIZE", "COUNT"]
    assert set(county["HOUSEHOLD_SIZE"]) == {"1", "2", "3+"}
    for level in ("nation", "state", "county"):
        assert int(tabs[f"groupsize_{level}"]["COUNT"].sum()) == 6
        assert (tabs[f"groupsize_{level}"]["COUNT"] >= 0).all()
    state = tabs["groupsize_state"].groupby("HOUSEHOLD_SIZE")["COUNT"].sum()
    nation = tabs["groupsize_nation"].set_index("HOUSEHOLD_SIZE")["COUNT"]
    pd.testing.assert_series_equal(state.sort_index(), nation.sort_index(), check_names=False)


def test_product_chain_mechanism_round_trip():
    """M_DPC* through the product: the chain vector is stored per (region, size) and decoded consistently."""
    prod = GroupSizeProduct(GroupSizeConfig(budget=Fraction(2), mechanism="M_DPC*", k=3))
    public = {"geography": EXAMPLE_GEO, "n_groups": 6}
    plan = prod.plan(None, public)
    assert [int(s.sensitivity) for s in plan] == [1, 2, 2]
    prepared = prod.prepare({"households": EXAMPLE}, public)
    g = prng.seeded(2)
    est = prod.postprocess({s.key: prod.measure(prepared, s, g) for s in plan}, public)
    assert all(int(e["COUNT"].sum()) == 6 for e in est.values())


def test_product_bad_input_names_file_row_column():
    """Bad input raises InputError naming file, row and column, before any noise is drawn."""
    prod = GroupSizeProduct(GroupSizeConfig(budget=Fraction(1), k=3))
    public = {"geography": EXAMPLE_GEO, "n_groups": 6}
    bad = EXAMPLE.copy()
    bad.loc[4, "SIZE"] = 0
    with pytest.raises(InputError) as e:
        prod.prepare({"households": bad, "households_source": "hh.csv"}, public)
    assert e.value.row == 6 and e.value.column == "SIZE" and e.value.file == "hh.csv"
    bad = EXAMPLE.copy()
    bad.loc[2, "COUNTY"] = "XX"
    with pytest.raises(InputError) as e:
        prod.prepare({"households": bad}, public)
    assert e.value.row == 4 and e.value.column == "COUNTY"
    with pytest.raises(InputError):
        prod.prepare({"households": EXAMPLE}, {"geography": EXAMPLE_GEO, "n_groups": 7})
    with pytest.raises(InputError):
        prod.prepare({"households": EXAMPLE.drop(columns="SIZE")}, public)

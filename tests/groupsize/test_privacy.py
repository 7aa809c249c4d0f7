"""Privacy requirements P1-P4 of spec hierarchical-groupsize.md for the groupsize mechanisms and product."""

from __future__ import annotations

import inspect
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dasflow.postprocess import chain_dp, relaxed_qp, tree_dp, twolevel_topdown
from dasflow.privacy import rng as prng
from dasflow.privacy import samplers
from dasflow.products.groupsize import mechanisms
from dasflow.products.groupsize.mechanisms import MECHANISM_QUERY, query_sensitivity, true_query
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct
from dasflow.products.groupsize.synthetic import counts_from_groups

from ._brute import random_shape


def _geo():
    return pd.DataFrame({"STATE": ["13", "13", "36", "36"], "COUNTY": ["001", "003", "005", "047"]})


def test_p1_two_sided_geometric_fit_at_planned_scale():
    """P1: the noise drawn at the plan's scale (2L/ε, ε = 1, L = 3) fits (1-a)/(1+a) a^|z|.

    200,000 draws from a seeded test generator. Chi-square over |z| <= 30 plus two tail bins at level 1e-4,
    mean within 5 standard errors of 0 and variance within 5 standard errors of 2a/(1-a)^2: false-failure
    rate below 2e-4 per run (the seed is fixed, so the outcome is deterministic).
    """
    spec = GroupSizeProduct(GroupSizeConfig(budget=Fraction(1), mechanism="M_DP")).plan(
        None, {"geography": _geo(), "n_groups": 6}
    )[0]
    assert spec.noise == Fraction(6)
    n = 200_000
    z = samplers.two_sided_geometric(spec.noise, n, prng.seeded(2024))
    a = math.exp(-1 / 6)
    support = np.arange(-30, 31)
    p = (1 - a) / (1 + a) * a ** np.abs(support)
    tail = (1 - p.sum()) / 2
    observed = np.r_[(z < -30).sum(), [(z == s).sum() for s in support], (z > 30).sum()]
    expected = n * np.r_[tail, p, tail]
    assert stats.chisquare(observed, expected).pvalue > 1e-4
    var = 2 * a / (1 - a) ** 2
    assert abs(z.mean()) < 5 * math.sqrt(var / n)
    m4 = float(np.mean(z.astype(np.float64) ** 4))
    assert abs(z.var() - var) < 5 * math.sqrt((m4 - var**2) / n)
    assert spec.variance == pytest.approx(var)


@pytest.mark.parametrize("defn", ["puredp", "zcdp"])
def test_p2_ledger_budget_per_level(defn):
    """P2: each of the L = 3 levels gets budget/L; the plan spends exactly the budget; explicit shares are
    recorded and must sum to 1."""
    geo = {"geography": _geo(), "n_groups": 6}
    for mech in ("M_DP", "M_DPC", "M_DPC*", "M_DPC*-R", "TopDown"):
        cfg = GroupSizeConfig(budget=Fraction(1, 2), privacy_defn=defn, mechanism=mech, k=3)
        plan = GroupSizeProduct(cfg).plan(cfg, geo)
        assert [s.level for s in plan] == ["nation", "state", "county"]
        assert all(s.budget == Fraction(1, 6) for s in plan)
        assert sum((s.budget for s in plan), Fraction(0)) == Fraction(1, 2)
        for s in plan:
            if defn == "zcdp":
                assert s.mechanism == "discrete_gaussian" and s.noise == s.sensitivity / (2 * s.budget)
            else:
                assert s.mechanism == "two_sided_geometric" and s.noise == s.sensitivity / s.budget
    shares = (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4))
    cfg = GroupSizeConfig(budget=Fraction(1), privacy_defn=defn, level_shares=shares)
    plan = GroupSizeProduct(cfg).plan(cfg, geo)
    assert [s.budget for s in plan] == list(shares)
    assert all(s.detail["shares_explicit"] for s in plan)
    with pytest.raises(ValueError):
        GroupSizeConfig(budget=Fraction(1), level_shares=(Fraction(1, 2), Fraction(1, 4), Fraction(1, 8)))
    with pytest.raises(ValueError):
        GroupSizeConfig(budget=Fraction(1), mechanism="M_H-R")  # inconsistent baselines are not releasable


def _neighbour_sensitivities(shape, leaf, size, k):
    """Max L1 (and L2^2) change per level and query over every fixed-group-set neighbour (±1 person)."""
    base = counts_from_groups(shape, leaf, size, k)
    out = {q: [[0, 0] for _ in shape.sizes] for q in ("counts", "cumulative", "chain")}
    for g in range(size.size):
        for delta in (+1, -1):
            if size[g] + delta < 1:
                continue  # the group would disappear: not a neighbour under the fixed group set (spec 1.3)
            s2 = size.copy()
            s2[g] += delta
            nb = counts_from_groups(shape, leaf, s2, k)
            for q in out:
                for l in range(shape.levels):
                    d = true_query(nb[l], q) - true_query(base[l], q)  # type: ignore[arg-type]
                    out[q][l][0] = max(out[q][l][0], int(np.abs(d).sum()))
                    out[q][l][1] = max(out[q][l][1], int((d * d).sum()))
    return out


def test_p3_sensitivity_by_neighbour_enumeration():
    """P3: max L1 change is 2 for c^r, 1 for Lambda(c^r) and |R_l| for the j-major chain vector (1/2/4 tree and
    random trees); L2^2 equals L1; the plan's sensitivity equals the enumerated value for every mechanism, so
    M_DPC* never ships with Δ = 1 at a level with more than one region."""
    rng = np.random.default_rng(17)
    shape_124 = tree_dp.TreeShape((np.zeros(2, dtype=np.int64), np.array([0, 0, 1, 1], dtype=np.int64)))
    shapes = [shape_124] + [random_shape(rng, 3, 3) for _ in range(4)]
    for shape in shapes:
        k = 4
        groups = 12
        leaf = rng.integers(0, shape.sizes[-1], size=groups)
        size = rng.integers(1, 7, size=groups)  # sizes above k are top-coded
        size[0] = 1
        size[1] = 2
        sens = _neighbour_sensitivities(shape, leaf, size, k)
        for l, regions in enumerate(shape.sizes):
            assert sens["counts"][l] == [2, 2]
            assert sens["cumulative"][l] == [1, 1]
            # chain: a move at the first region of a level touches exactly |R_l| entries
            assert sens["chain"][l][0] <= regions and sens["chain"][l][1] == sens["chain"][l][0]
            for q in ("counts", "cumulative", "chain"):
                assert query_sensitivity(q, regions, "l1") >= sens[q][l][0]
    sens = _neighbour_sensitivities(shape_124, np.array([0, 2, 3]), np.array([2, 1, 3]), 4)
    assert [s[0] for s in sens["chain"]] == [1, 2, 4]  # the spec's 1/2/4 check
    geo = {"geography": _geo(), "n_groups": 6}
    for mech, q in MECHANISM_QUERY.items():
        if mech in ("M_H-R", "M_HC-R"):
            continue
        plan = GroupSizeProduct(GroupSizeConfig(budget=Fraction(1), mechanism=mech)).plan(None, geo)
        assert [int(s.sensitivity) for s in plan] == [query_sensitivity(q, r, "l1") for r in (1, 2, 4)]
    assert [int(s.sensitivity) for s in GroupSizeProduct(GroupSizeConfig(budget=Fraction(1), mechanism="M_DPC*"))
            .plan(None, geo)] == [1, 2, 4]


def test_p4_postprocessing_signatures_take_only_noisy_and_public():
    """P4: post-processing entry points accept noisy arrays and public facts only (names checked), and the
    product post-processes from measurements + public geography/n without the confidential table."""
    allowed = {"mechanism", "shape", "noisy", "total", "variances", "window_multiplier", "qp_time_limit",
               "costs", "max_widenings", "chunk_entries", "noisy_cum", "time_limit", "chain", "targets", "radius",
               "measurements", "public", "self", "cols", "root_values", "roots", "solver", "qp_solver"}
    funcs = [mechanisms.postprocess, tree_dp.solve_tree, tree_dp.assign_columns, tree_dp.column_root_tables,
             tree_dp.assign_roots, chain_dp.solve_chain_isotonic, chain_dp.solve_chain_tables,
             relaxed_qp.relaxed_counts_qp, relaxed_qp.relaxed_cumulative_qp, twolevel_topdown.twolevel_topdown,
             GroupSizeProduct.postprocess]
    for f in funcs:
        names = set(inspect.signature(f).parameters)
        assert names <= allowed, (f.__name__, names - allowed)
        assert not names & {"households", "truth", "counts", "inputs", "prepared"}


def test_p2_config_parsing_exact():
    """P2: budgets parse exactly (decimal strings -> Fraction); an infinite budget is not a release config."""
    cfg = GroupSizeConfig.from_mapping({"budget": "0.3", "mechanism": "M_DP", "k": 5,
                                        "level_shares": ["0.5", "0.25", "0.25"]})
    assert cfg.budget == Fraction(3, 10) and cfg.shares() == (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4))
    with pytest.raises(ValueError):
        GroupSizeConfig.from_mapping({"budget": "Infinity"})
    with pytest.raises(ValueError):
        GroupSizeConfig.from_mapping({"budget": "1", "privacy_defn": "approxdp"})

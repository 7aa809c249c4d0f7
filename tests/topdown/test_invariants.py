"""State-population invariants and structural zeros (topdown-estimation.md "Invariants"): exact per-state totals
(AIAN-split state units), structural zeros at every level, consistency and integrality over random noise draws
including tiny budgets; the lifted root; bad invariants, bad block facts and impossible persons rejected with
file/row/column before noise; the per-level/per-parent API the partitioned driver uses; the two solvers."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.privacy import rng
from dasflow.products.topdown.estimate import (
    Constraints,
    EstimatorOptions,
    Histogram,
    combine_bottom_up,
    estimate_families,
    estimate_root,
    estimate_topdown,
)
from dasflow.products.topdown.invariants import (
    build_block_facts,
    check_state_invariants,
    state_units,
)
from dasflow.products.topdown.plugin import parse_topdown_config
from dasflow.products.topdown.product import TopDown, TopDownConfig
from dasflow.products.topdown.solvers import coupled_projection, round_network, weighted_simplex_projection
from dasflow.products.topdown.spine import preset
from dasflow.products.topdown.strategy import (
    LevelStrategy,
    QueryGroup,
    Schema,
    detailed_only_strategy,
    make_strategy,
)

from .helpers import small_geography

F = Fraction
SCHEMA = Schema((("HHGQ", 3), ("R", 3), ("H", 2)))
N_CELLS = 18
STRATEGY = LevelStrategy((QueryGroup("total", (), F(1, 5)), QueryGroup("hhgq", ("HHGQ",), F(1, 5)),
                          QueryGroup("detailed", ("HHGQ", "R", "H"), F(3, 5))))
BETA6 = [F(v, 4099) for v in (104, 1440, 447, 687, 1256, 165)]
STATES = ("01", "02", "04")


def _world(seed: int = 5, n: int = 2500) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Three states (AIAN-split state units), per-block facts with empty blocks, HU-less GQ blocks, state 02
    without any GQ of type 2 and state 04 without type 1; persons only in cells their block allows."""
    r = np.random.default_rng(seed)
    blocks = small_geography(seed=seed, states=STATES, counties=2, tracts=3, max_blocks=7)
    nb = len(blocks)
    st = blocks["GEOID"].str[:2].to_numpy()
    hu = np.where(r.random(nb) < 0.3, 0, r.integers(1, 20, nb))
    gq1 = np.where((r.random(nb) < 0.3) & (st != "04"), r.integers(1, 3, nb), 0)
    gq2 = np.where((r.random(nb) < 0.25) & (st != "02"), 1, 0)
    gq1[np.flatnonzero(st == "01")[:2]] = 1  # at least one GQ-only block
    hu[np.flatnonzero(st == "01")[:2]] = 0
    facts = pd.DataFrame({"GEOID": blocks["GEOID"], "HU": hu, "GQ1": gq1, "GQ2": gq2})
    blocks["GQ_TYPES"] = [f"{int(a > 0)}{int(b > 0)}00000" for a, b in zip(gq1, gq2, strict=True)]
    allowed = np.stack([hu > 0, gq1 > 0, gq2 > 0], axis=1)
    live = np.flatnonzero(allowed.any(axis=1))
    b = r.choice(live, n)
    p = allowed[b] / allowed[b].sum(axis=1, keepdims=True)
    code = (r.random(n)[:, None] < np.cumsum(p, axis=1)).argmax(axis=1)
    persons = pd.DataFrame({"GEOID": blocks["GEOID"].to_numpy()[b], "HHGQ": code, "R": r.integers(0, 3, n),
                            "H": r.integers(0, 2, n)})
    return blocks, facts, persons


def _public(blocks: pd.DataFrame, facts: pd.DataFrame, persons: pd.DataFrame) -> dict[str, Any]:
    per_state = persons["GEOID"].str[:2].value_counts()
    return {"blocks": blocks, "block_facts": facts,
            "invariants": {"total": len(persons), "state": {s: int(per_state.get(s, 0)) for s in STATES}}}


def _product(rho: Fraction, per_level: LevelStrategy = STRATEGY, **kw: Any) -> TopDown:
    sc = preset("pl94_persons", BETA6, 3)
    st = make_strategy(sc.levels, BETA6, rho, schema=SCHEMA, per_level=per_level)
    return TopDown(TopDownConfig(spine=sc, strategy=st, **kw))


@pytest.fixture(scope="module")
def world() -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return _world()


def _allowed_oracle(td: TopDown, pub: dict[str, Any], facts: pd.DataFrame) -> list[np.ndarray]:
    """Per level, units × HHGQ code: may the unit hold the code (any of its blocks has HU / GQ of the type)."""
    sp = td.spine(pub)
    f = facts.set_index("GEOID").loc[sp.block_geoid.astype(str), ["HU", "GQ1", "GQ2"]].to_numpy() > 0
    out = []
    for l in range(sp.n_levels):
        a = np.zeros((sp.n_units(l), 3), dtype=bool)
        np.logical_or.at(a, sp.block_unit[l], f)
        out.append(a)
    return out


def _check(td: TopDown, pub: dict[str, Any], facts: pd.DataFrame, persons: pd.DataFrame,
           est: dict[str, pd.DataFrame]) -> None:
    sp = td.spine(pub)
    diag = est["diagnostics"]
    assert (diag["consistency_violations"] == 0).all() and (diag["invariant_violations"] == 0).all()
    allowed = _allowed_oracle(td, pub, facts)
    code_of_cell = np.unravel_index(np.arange(N_CELLS), SCHEMA.shape)[0]
    hists = []
    for l, level in enumerate(sp.levels):
        e = est[f"internal/{level}"]
        assert e["COUNT"].dtype.kind == "i" and (e["COUNT"] > 0).all()
        h = Histogram(e["UNIT"].to_numpy(), e["CELL"].to_numpy(), e["COUNT"].to_numpy())
        assert allowed[l][h.unit, code_of_cell[h.cell]].all(), f"structural zero broken at {level}"
        hists.append(h)
    assert int(hists[0].count.sum()) == len(persons)
    for l in range(1, sp.n_levels):
        agg = hists[l].aggregate(sp.parent[l])
        assert np.array_equal(agg.dense(sp.n_units(l - 1), N_CELLS), hists[l - 1].dense(sp.n_units(l - 1), N_CELLS))
    lvl, fips = state_units(sp)
    got = pd.Series(hists[lvl].count).groupby(fips[hists[lvl].unit]).sum()
    for s, n in pub["invariants"]["state"].items():
        assert int(got.get(s, 0)) == n, s
    state_table = td.tables(est)["topdown_state"].groupby("GEOID")["COUNT"].sum()
    assert {k: int(v) for k, v in state_table.items()} == {k: v for k, v in pub["invariants"]["state"].items() if v}


@pytest.mark.parametrize(("rho", "seed"), [(F(1, 2), 1), (F(1, 2), 2), (F(1, 500), 3), (F(1, 500), 4),
                                           (F(1, 20000), 5)])
def test_state_totals_and_structural_zeros_exact(world, rho: Fraction, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Per-state totals exact (the AIAN/non-AIAN units of a state sum to its invariant), structural zeros at
    every level, children = parent in every cell, non-negative integers — for random draws, also at tiny
    budgets (ρ = 1/20000: σ ≈ 300 per answer, far off the truth)."""
    blocks, facts, persons = world
    td = _product(rho)
    pub = _public(blocks, facts, persons)
    sp = td.spine(pub)
    assert sp.n_units(1) > len(STATES)  # AIAN-split state units: the invariant is on their sums
    specs = td.plan(td.config, pub)
    prep = td.prepare({"persons": persons}, pub)
    g = rng.seeded(seed)
    ms = {s.key: td.measure(prep, s, g) for s in specs}
    est = td.postprocess(ms, pub)
    _check(td, pub, facts, persons, est)
    listed = est["invariants"]
    assert listed[listed.KIND == "state"].set_index("SCOPE")["VALUE"].to_dict() == pub["invariants"]["state"]
    assert int(listed[listed.KIND == "total"]["VALUE"].iloc[0]) == len(persons)
    zeros = listed[listed.KIND == "structural_zeros"].set_index("SCOPE")["VALUE"]
    assert zeros["block"] > zeros["US"] == 0
    root_status = est["diagnostics"]["status"].iloc[0]
    assert any(k.startswith("lifted_") for k in root_status), root_status  # state 02 has no GQ of type 2
    assert "fallback" not in est["diagnostics"]["status"].iloc[1]


def test_detailed_only_with_constraints(world) -> None:  # type: ignore[no-untyped-def]
    """Detailed-only strategy: the state-level family is the exact W-metric projection onto the coupled
    polytope, rounded by the controlled rounding; every other family is exact per cell under the zeros."""
    blocks, facts, persons = world
    td = _product(F(1, 50), per_level=detailed_only_strategy(SCHEMA))
    pub = _public(blocks, facts, persons)
    specs = td.plan(td.config, pub)
    prep = td.prepare({"persons": persons}, pub)
    g = rng.seeded(9)
    est = td.postprocess({s.key: td.measure(prep, s, g) for s in specs}, pub)
    _check(td, pub, facts, persons, est)


def test_invariant_config_switches(world) -> None:  # type: ignore[no-untyped-def]
    """invariants=("total",) ignores state totals; total_invariant=False holds nothing (older switch);
    structural_zeros=False lets estimates use cells the facts rule out (the zeros are what keeps them 0)."""
    blocks, facts, persons = world
    pub = _public(blocks, facts, persons)
    td = _product(F(1, 500))
    specs = td.plan(td.config, pub)
    prep = td.prepare({"persons": persons}, pub)
    g = rng.seeded(7)
    ms = {s.key: td.measure(prep, s, g) for s in specs}
    cfg = td.config
    only_total = TopDown(TopDownConfig(spine=cfg.spine, strategy=cfg.strategy, invariants=("total",),
                                       structural_zeros=False))
    assert only_total.config.invariant_kinds == ("total",)
    est = only_total.postprocess(ms, {"blocks": blocks, "invariants": {"total": len(persons)}})
    assert int(est["internal/US"]["COUNT"].sum()) == len(persons)
    allowed = _allowed_oracle(td, pub, facts)
    b = est["internal/block"]
    code = np.unravel_index(b["CELL"].to_numpy(), SCHEMA.shape)[0]
    assert not allowed[-1][b["UNIT"].to_numpy(), code].all()   # without the facts, zeros are not kept
    none = TopDownConfig(spine=cfg.spine, strategy=cfg.strategy, total_invariant=False, structural_zeros=False)
    assert none.invariant_kinds == ()
    with pytest.raises(InputError, match="contradicts"):
        TopDownConfig(spine=cfg.spine, strategy=cfg.strategy, total_invariant=False, invariants=("total",))
    with pytest.raises(InputError, match="unknown invariant"):
        TopDownConfig(spine=cfg.spine, strategy=cfg.strategy, invariants=("county",))
    raw = {"fanout_cutoff": 3, "budget": "1"}
    assert parse_topdown_config(raw).invariant_kinds == ("total", "state")
    assert parse_topdown_config({**raw, "invariants": ["state"]}).invariant_kinds == ("state",)
    assert parse_topdown_config({**raw, "total_invariant": False}).invariant_kinds == ()
    with pytest.raises(InputError) as e:
        parse_topdown_config({**raw, "invariants": "total"})
    assert e.value.column == "invariants"


def test_bad_invariants_and_facts_rejected(world) -> None:  # type: ignore[no-untyped-def]
    """Invariants naming a state outside the geography, missing a state, summing to another total, or
    disagreeing with the records; block facts missing a block, holding a negative count or disagreeing with
    GQ_TYPES; facts absent while configured — each an InputError with file and key/row/column."""
    blocks, facts, persons = world
    td = _product(F(1, 2))
    pub = _public(blocks, facts, persons)
    states = pub["invariants"]["state"]
    cases = [({**states, "05": 0}, "state.05"), ({k: v for k, v in states.items() if k != "04"}, "state.04"),
             ({**states, "01": states["01"] + 1}, "state")]
    for bad, column in cases:
        with pytest.raises(InputError) as e:
            td.constraints({**pub, "invariants": {"total": len(persons), "state": bad}})
        assert (e.value.file, e.value.column) == ("invariants.json", column), str(e.value)
    labels = tuple(sorted(states))
    totals = np.array([states[k] for k in labels])
    check_state_invariants(persons["GEOID"].to_numpy(), labels, totals)
    totals[1] += 1
    with pytest.raises(InputError) as e:
        check_state_invariants(persons["GEOID"].to_numpy(), labels, totals)
    assert (e.value.file, e.value.column) == ("invariants.json", "state.02")
    with pytest.raises(InputError) as e:
        td.constraints({**pub, "invariants": {"total": len(persons)}})
    assert e.value.column == "state"

    def facts_error(f: pd.DataFrame, b: pd.DataFrame = blocks) -> InputError:
        with pytest.raises(InputError) as e:
            _product(F(1, 2)).constraints({**pub, "blocks": b, "block_facts": f})
        return e.value

    e1 = facts_error(facts.iloc[1:])
    assert (e1.file, e1.column) == ("block_facts.csv", "GEOID") and "no row" in str(e1)
    neg = facts.copy()
    neg.loc[4, "HU"] = -1
    e2 = facts_error(neg)
    assert (e2.row, e2.column) == (6, "HU")
    gq = blocks.copy()
    gq.loc[3, "GQ_TYPES"] = "1" + gq.loc[3, "GQ_TYPES"][1:] if gq.loc[3, "GQ_TYPES"][0] == "0" else \
        "0" + gq.loc[3, "GQ_TYPES"][1:]
    e3 = facts_error(facts, gq)
    assert (e3.row, e3.column) == (5, "GQ1")
    e4 = facts_error(facts.drop(columns="GQ2"))
    assert e4.column == "GQ2"
    with pytest.raises(InputError) as e:
        td.constraints({k: v for k, v in pub.items() if k != "block_facts"})
    assert e.value.file == "block_facts.csv"


def test_person_in_structural_zero_rejected_before_noise(world) -> None:  # type: ignore[no-untyped-def]
    """A person in a household cell of a block without housing units (or a GQ type without a facility) is
    refused by the tabulation with file, row and column — before any measurement."""
    blocks, facts, persons = world
    td = _product(F(1, 2))
    pub = _public(blocks, facts, persons)
    no_hu = facts.loc[facts["HU"] == 0, "GEOID"].iloc[0]
    bad = persons.copy()
    bad.loc[11, ["GEOID", "HHGQ"]] = [no_hu, 0]
    with pytest.raises(InputError) as e:
        td.prepare({"persons": bad, "persons_source": "cef.parquet"}, pub)
    assert (e.value.file, e.value.row, e.value.column) == ("cef.parquet", 13, "HHGQ")
    assert "structural zero" in str(e.value)
    assert no_hu not in str(e.value)  # the person's block is not echoed (confidential: where a record is)
    no_gq2 = facts.loc[(facts["GQ2"] == 0) & (facts["HU"] > 0), "GEOID"].iloc[0]
    bad = persons.copy()
    bad.loc[0, ["GEOID", "HHGQ"]] = [no_gq2, 2]
    with pytest.raises(InputError) as e:
        td.prepare({"persons": bad, "persons_source": "cef.parquet"}, pub)
    assert (e.value.row, e.value.column) == (2, "HHGQ") and "structural zero" in str(e.value)


def test_partitioned_api_matches_whole_pass(world) -> None:  # type: ignore[no-untyped-def]
    """The driver's calls — estimate_root and estimate_families on parent subsets with
    ``constraints.for_level(l)`` — reproduce the whole pass exactly (families are independent)."""
    blocks, facts, persons = world
    td = _product(F(1, 5))
    pub = _public(blocks, facts, persons)
    specs = td.plan(td.config, pub)
    prep = td.prepare({"persons": persons}, pub)
    g = rng.seeded(12)
    ms = {s.key: td.measure(prep, s, g) for s in specs}
    sp = td.spine(pub)
    cons = td.constraints(pub)
    assert isinstance(cons, Constraints) and cons.has_states and cons.has_zeros
    opts = EstimatorOptions()
    groups = combine_bottom_up(sp, td.group_answers(ms), opts.bottom_up_max_entries)
    flat = EstimatorOptions(bottom_up=False)
    hists, _ = estimate_topdown(sp, groups, N_CELLS, len(persons), opts=flat, constraints=cons)
    root = estimate_root(sp, groups[0], N_CELLS, len(persons), flat, constraints=cons.for_level(0))
    assert np.array_equal(root.hist.count, hists[0].count) and np.array_equal(root.hist.cell, hists[0].cell)
    for l in (1, 3):
        c = cons.for_level(l)
        assert (l == 1) == c.has_states
        parents = np.arange(sp.n_units(l - 1))[::2]
        res = estimate_families(sp, l, parents, hists[l - 1], groups[l], flat, constraints=c)
        keep = np.isin(sp.parent[l][hists[l].unit], parents)
        assert np.array_equal(res.hist.unit, hists[l].unit[keep])
        assert np.array_equal(res.hist.count, hists[l].count[keep])
    with pytest.raises(ValueError, match="disagree"):
        estimate_root(sp, groups[0], N_CELLS, len(persons) + 1, flat, constraints=cons)


def test_coupled_projection_kkt_and_controlled_rounding() -> None:
    """coupled_projection meets the row and group totals and is the weighted projection (checked against
    scipy SLSQP on the same QP); round_network meets them in integers inside the floor/ceil box."""
    from scipy import sparse
    from scipy.optimize import Bounds, LinearConstraint, minimize

    r = np.random.default_rng(3)
    K, C = 6, 4
    z = r.normal(3, 4, (K, C))
    s = r.uniform(0.5, 2, (K, C))
    mask = r.random((K, C)) > 0.15
    mask[:, 0] = True
    t = r.integers(2, 12, K).astype(float)
    grp = np.tile(np.array([0, 0, 1, 1]), (K, 1))
    share = r.uniform(0.3, 0.7)
    g0 = np.floor(share * t.sum())
    totals = np.array([g0, t.sum() - g0])
    x, nu = coupled_projection(z, s, t, mask, grp, totals)
    # optimality certificate (Lagrangian duality): x minimises the Lagrangian at ν over the row simplices and
    # is feasible for the group totals
    xl, _ = weighted_simplex_projection(z - nu[grp] / s, s, t, mask)
    assert np.allclose(xl, x, atol=1e-9)
    assert np.allclose(x.sum(axis=1), t) and (x >= 0).all() and (x[~mask] == 0).all()
    assert np.allclose([x[:, :2].sum(), x[:, 2:].sum()], totals)
    idx = np.flatnonzero(mask.ravel())
    A = np.zeros((K + 2, idx.size))
    rows, cols = np.divmod(idx, C)
    A[rows, np.arange(idx.size)] = 1
    A[K + (cols >= 2), np.arange(idx.size)] = 1
    b = np.concatenate([t, totals])
    zf, sf = z.ravel()[idx], s.ravel()[idx]
    Ar, br = A[:-1], b[:-1]   # the last group total is implied by the rows and the first group (drop it)
    ref = minimize(lambda v: float((sf * (v - zf) ** 2).sum()), np.ones(idx.size), method="trust-constr",
                   jac=lambda v: 2 * sf * (v - zf), hess=lambda v: np.diag(2 * sf),
                   bounds=Bounds(0, np.inf), constraints=[LinearConstraint(Ar, br, br)],
                   options={"gtol": 1e-10, "xtol": 1e-12, "maxiter": 3000})
    obj = float((sf * (x.ravel()[idx] - zf) ** 2).sum())
    assert np.allclose(Ar @ ref.x, br, atol=1e-5) and obj <= ref.fun + 1e-6 * max(1.0, ref.fun)
    xi, widened = round_network(x.ravel()[idx], sf, sparse.csr_matrix(A), b.astype(np.int64))
    assert not widened and np.array_equal(A @ xi, b) and (xi >= 0).all()
    assert (np.abs(xi - x.ravel()[idx]) < 1 + 1e-9).all()
    with pytest.raises(ArithmeticError):
        coupled_projection(z, s, t, mask, grp, totals + np.array([t.sum(), 0]))
    # an x̃ that is not feasible: the floor/ceil box has no solution, the widened box (one step down) does
    xw, widened = round_network(np.array([1.0, 1.0, 0.4]), np.array([1.0, 2.0, 1.0]),
                                sparse.csr_matrix(np.array([[1.0, 1.0, 1.0]])), np.array([1]))
    assert widened and xw.tolist() == [0, 1, 0]
    with pytest.raises(ArithmeticError):
        round_network(np.array([0.0]), np.array([1.0]), sparse.csr_matrix(np.array([[1.0]])), np.array([5]))


def test_build_block_facts_from_units() -> None:
    """The facts builder counts housing units (vacant included) and GQ facilities per block; blocks without
    units get zeros; a unit outside the geography is refused with its row."""
    geoids = ["010010001001001", "010010001001002", "010010001001003"]
    units = pd.DataFrame({"TABBLKST": ["01"] * 5, "TABBLKCOU": [1] * 5, "TABTRACTCE": [100] * 5,
                          "TABBLK": [1001, 1001, 1002, 1001, 1002], "HHGQ": [0, 0, 3, 7, 0]})
    f = build_block_facts(units, geoids)
    assert f["HU"].tolist() == [2, 1, 0] and f["GQ3"].tolist() == [0, 1, 0] and f["GQ7"].tolist() == [1, 0, 0]
    units.loc[2, "TABBLK"] = 1009
    with pytest.raises(InputError) as e:
        build_block_facts(units, geoids, source="units.parquet")
    assert (e.value.file, e.value.row, e.value.column) == ("units.parquet", 4, "GEOID")

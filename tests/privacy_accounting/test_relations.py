"""Each product's conversion to the account's neighbouring relation, checked by neighbour enumeration on small
random inputs: the converted sensitivity bounds every neighbour's change and is attained (tight)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest

from dasflow import registry
from dasflow.errors import LedgerRefusal
from dasflow.privacy import relations
from dasflow.privacy.accounting import gaussian_sigma2_sq
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.products.groupsize import relation as groupsize_relation
from dasflow.products.groupsize.mechanisms import query_sensitivity, true_query
from dasflow.products.topdown.strategy import CHANGE_ONE_SENSITIVITY, QueryGroup, Schema

IntArray = npt.NDArray[np.int64]


def _norms(a: IntArray, b: IntArray) -> tuple[int, int]:
    d = (a - b).astype(np.int64)
    return int(np.abs(d).sum()), int((d * d).sum())


# ------------------------------------------------------------------------------------------- group sizes
def _counts(households: list[tuple[int, int]], regions: int, k: int) -> IntArray:
    c = np.zeros((regions, k), dtype=np.int64)
    for r, size in households:
        if size >= 1:
            c[r, min(size, k) - 1] += 1
    return c


def _neighbours(households: list[tuple[int, int]], regions: int,
                free: bool) -> list[list[tuple[int, int]]]:
    """Add or remove one person; ``free``: the person may also form / dissolve a one-person household."""
    out = []
    for i, (r, size) in enumerate(households):
        out.append([*households[:i], (r, size + 1), *households[i + 1:]])  # joins household i
        if size >= 2 or free:  # leaves it (dissolving it if it was alone: only under the free relation)
            out.append([*households[:i], (r, size - 1), *households[i + 1:]])
    if free:
        out.extend([*households, (r, 1)] for r in range(regions))  # forms a new household
    return out


@pytest.mark.parametrize("query", ["counts", "cumulative", "chain"])
@pytest.mark.parametrize("trial", range(6))
def test_groupsize_conversion_by_neighbour_enumeration(query: str, trial: int) -> None:
    gen = np.random.default_rng(1000 + trial)
    regions, k = int(gen.integers(1, 4)), int(gen.integers(2, 6))
    households = [(int(gen.integers(0, regions)), int(gen.integers(1, k + 2))) for _ in range(int(gen.integers(3, 9)))]
    households.append((0, 1))  # a household below the top code, so the planned sensitivity is attained
    base = true_query(_counts(households, regions, k), query)
    planned = query_sensitivity(query, regions, "l1")
    for free, factor in ((False, Fraction(1)), (True, groupsize_relation.groupsize_factor(query, k))):
        worst = [_norms(true_query(_counts(n, regions, k), query), base)
                 for n in _neighbours(households, regions, free)]
        l1, l2sq = max(w[0] for w in worst), max(w[1] for w in worst)
        assert l1 == l2sq == planned * factor  # bound attained: the conversion is exact, not only sound


def test_groupsize_factor_seven_on_the_demo_chain() -> None:
    """The issue's measurement: M_DP C* with k = 7 over 5 regions, planned Δ = 5, a new household moves 35."""
    spec = MeasurementSpec(product="groupsize", key="groupsize/chain/state", level="state", privacy_defn="zcdp",
                           mechanism="discrete_gaussian", budget=Fraction(1, 6), sensitivity=Fraction(5),
                           noise=Fraction(15), cells=35, variance=Fraction(15),
                           detail={"query": "chain", "k": 7})
    conv = relations.require("groupsize").convert(spec, relations.ADD_REMOVE)
    assert conv.budget(spec) == Fraction(7, 6)
    assert relations.require("groupsize").convert(spec, relations.CHANGE_ONE).budget(spec) == Fraction(28, 6)


# ------------------------------------------------------------------------------------------------ TopDown
@pytest.mark.parametrize("trial", range(4))
def test_topdown_conversion_by_neighbour_enumeration(trial: int) -> None:
    gen = np.random.default_rng(2000 + trial)
    schema = Schema((("A", 2), ("B", 3)))
    units = 3
    groups = [QueryGroup("total", (), Fraction(1, 3)), QueryGroup("a", ("A",), Fraction(1, 3)),
              QueryGroup("detailed", ("A", "B"), Fraction(1, 3))]
    records = [(int(gen.integers(units)), int(gen.integers(schema.n_cells))) for _ in range(6)]
    cells = [(u, c) for u in range(units) for c in range(schema.n_cells)]

    def answers(recs: list[tuple[int, int]], g: QueryGroup) -> IntArray:
        hist = np.zeros((units, schema.n_cells), dtype=np.int64)
        for u, c in recs:
            hist[u, c] += 1
        return (hist @ g.matrix(schema).T.astype(np.int64)).ravel()

    conv = relations.require("topdown").convert
    for g in groups:
        base = answers(records, g)
        change = [[*records[:i], x, *records[i + 1:]] for i in range(len(records)) for x in cells]
        add_remove = [[*records, x] for x in cells] + [records[:i] + records[i + 1:] for i in range(len(records))]
        for neighbours, relation in ((change, relations.CHANGE_ONE), (add_remove, relations.ADD_REMOVE)):
            worst = [_norms(answers(n, g), base) for n in neighbours]
            spec = _spec("topdown", CHANGE_ONE_SENSITIVITY)
            factor = conv(spec, relation).rho_factor
            assert max(w[0] for w in worst) == max(w[1] for w in worst) == CHANGE_ONE_SENSITIVITY * factor


# --------------------------------------------------------------------------- add/remove → change-one bound
def _spec(product: str, sensitivity: Fraction, defn: str = "zcdp") -> MeasurementSpec:
    return MeasurementSpec(product=product, key=f"{product}/k", level="l", privacy_defn=defn,  # type: ignore[arg-type]
                           mechanism="discrete_gaussian", budget=Fraction(1), sensitivity=sensitivity,
                           noise=gaussian_sigma2_sq(1, sensitivity), cells=1, variance=Fraction(1))


@pytest.mark.parametrize("trial", range(5))
def test_change_one_is_at_most_twice_add_remove_for_linear_queries(trial: int) -> None:
    """Any linear query of a histogram (random integer workload): max over change neighbours of the L2 change is
    at most twice the add/remove one, so the ×4 ρ / ×2 ε conversion of add/remove products is sound."""
    gen = np.random.default_rng(3000 + trial)
    w = gen.integers(-2, 3, size=(4, 5))
    columns = [w[:, i] for i in range(5)]
    add_l2sq = max(int(c @ c) for c in columns)
    add_l1 = max(int(np.abs(c).sum()) for c in columns)
    change_l2sq = max(int((a - b) @ (a - b)) for a in columns for b in columns)
    change_l1 = max(int(np.abs(a - b).sum()) for a in columns for b in columns)
    conv = relations.require("phsafe").convert(_spec("phsafe", Fraction(1)), relations.CHANGE_ONE)
    assert change_l2sq <= conv.rho_factor * add_l2sq and change_l1 <= conv.eps_factor * add_l1


def test_audit_refuses_noise_that_does_not_match_sensitivity_and_budget() -> None:
    spec = _spec("matrix", Fraction(1))
    assert relations.audit_record([spec])["matrix/k"]["sensitivity_l2sq"] == "1"
    with pytest.raises(Exception, match="recomputed"):
        relations.audit_record([dataclasses.replace(spec, noise=spec.noise / 2)])


def test_undeclared_products_cannot_spend_from_an_account() -> None:
    with pytest.raises(Exception, match="declares no neighbouring relation"):
        relations.convert_specs([_spec("nobody", Fraction(1))], relations.ADD_REMOVE)


def test_the_relation_is_the_plugins_and_a_plugin_without_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accounts read a product's relation from its plugin (``ProductPlugin.relation``); a registered plugin that
    declares none (the default) runs as ``undeclared`` but cannot spend from an account."""
    for name in registry.PLUGINS:
        assert relations.require(name) is registry.get_plugin(name).relation
    monkeypatch.setitem(registry.PLUGINS, "counts", "tests.plugin_product.plugin")
    plugin = registry.get_plugin("counts")
    assert relations.require("counts").relation == relations.ADD_REMOVE
    monkeypatch.setattr(type(plugin), "relation", None)
    spec = _spec("counts", Fraction(1))
    assert relations.audit_record([spec])["counts/k"]["relation"] == "undeclared"
    with pytest.raises(LedgerRefusal, match="'counts' declares no neighbouring relation"):
        relations.convert_specs([spec], relations.ADD_REMOVE)


# ------------------------------------------------------------------ SafeTab-P and matrix → change-one-person
@pytest.mark.parametrize("seed", range(3))
def test_safetab_p_change_one_person_by_neighbour_enumeration(seed: int) -> None:
    """Replacing one person moves at most 2s (group, cell) counts of a key, each by exactly 1: L1 = L2² ≤ 2s,
    twice the add/remove calibration s (ρ × 2, ε × 2)."""
    from dasflow.products.safetab_p.product import SafeTabP
    from tests.safetab_p.helpers import config, persons_table, public, real_iterations, toy_config_dict
    from tests.safetab_p.test_neighbours import BLOCKS, _diff, _random_people

    index = real_iterations()
    raw = toy_config_dict("zcdp")
    for k in list(raw):
        if k.startswith("privacy_budget_p_level") and not k.split("_")[-1].startswith("pr"):
            raw[k] = 1
    cfg = config(raw)
    pub = public(cfg, index, BLOCKS)
    gen = np.random.default_rng(4000 + seed)
    rows = _random_people(gen, index, 20)
    product = SafeTabP()
    base = product.prepare({"persons": persons_table(rows), "source": "p"}, pub)
    specs = {s.key.rsplit("/", 1)[0]: s for s in product.plan(cfg, pub)}
    conv = relations.require("safetab-p").convert
    worst_ratio = Fraction(0)
    for i in range(0, 20, 2):
        other = _random_people(gen, index, 1)
        nb = product.prepare({"persons": persons_table([*rows[:i], *other, *rows[i + 1:]]), "source": "p"}, pub)
        for key, frame in base.items():
            if not key.startswith("counts/"):
                continue
            _, universe, rt, lv = key.split("/")
            spec = specs[f"safetab-p/{universe}/{rt}/{lv}"]
            d = _diff(frame, nb[key])["D"].to_numpy()
            norm, planned = relations.whole_vector_sensitivity(spec)
            assert norm == "l2sq" and set(np.abs(d)) <= {1}
            l1, l2sq = int(np.abs(d).sum()), int((d * d).sum())
            assert l1 == l2sq <= planned * conv(spec, relations.CHANGE_ONE).rho_factor
            worst_ratio = max(worst_ratio, Fraction(l2sq) / planned)
    assert worst_ratio > 1  # some change exceeds the add/remove calibration: the conversion is needed


@pytest.mark.parametrize("trial", range(3))
def test_matrix_marginal_change_one_person_by_neighbour_enumeration(trial: int) -> None:
    gen = np.random.default_rng(5000 + trial)
    schema = Schema((("A", 2), ("B", 3), ("C", 2)))
    records = [int(gen.integers(schema.n_cells)) for _ in range(5)]
    spec = _spec("matrix", Fraction(1))  # one marginal per key, Δ₂² = 1 under add/remove
    factor = relations.require("matrix").convert(spec, relations.CHANGE_ONE).rho_factor
    for keep in [("A",), ("A", "C"), ("A", "B", "C")]:
        m = QueryGroup("q", keep, Fraction(1)).matrix(schema).astype(np.int64)

        def answer(recs: list[int], m: IntArray = m) -> IntArray:
            return m @ np.bincount(recs, minlength=schema.n_cells).astype(np.int64)

        base = answer(records)
        worst = [_norms(answer([*records[:i], x, *records[i + 1:]]), base)
                 for i in range(len(records)) for x in range(schema.n_cells)]
        assert max(w[0] for w in worst) == max(w[1] for w in worst) == factor  # attained: exact


def test_the_frozen_audit_record_carries_each_keys_conversions() -> None:
    """The plan entry keeps no product detail, so the conversion (which needs the group-size query and k) is
    frozen with the plan: certificate and ``account show`` read it from there."""
    spec = MeasurementSpec(product="groupsize", key="groupsize/chain/state", level="state", privacy_defn="zcdp",
                           mechanism="discrete_gaussian", budget=Fraction(1, 6), sensitivity=Fraction(5),
                           noise=Fraction(15), cells=35, variance=Fraction(15), detail={"query": "chain", "k": 7})
    record = relations.audit_record([spec])["groupsize/chain/state"]
    assert record["sensitivity_l2sq"] == "5" and record["relation"] == groupsize_relation.FIXED_HOUSEHOLDS
    assert record["conversions"]["add_remove_person"]["budget"] == "7/6"
    assert record["conversions"]["change_one_person"]["budget"] == "14/3"

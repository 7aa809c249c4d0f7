"""Weights for TopDown (eigen-design.md §7 option (1); E4/E6 restricted to marginal strategies)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from dasflow.errors import InputError
from dasflow.strategy.topdown_weights import optimize_marginal_weights, topdown_query_weights

SCHEMA = {"a": 3, "b": 2, "c": 4}


def _marginal_matrix(sizes: list[int], keep: set[int]) -> np.ndarray:
    mats = [np.eye(d) if i in keep else np.ones((1, d)) for i, d in enumerate(sizes)]
    out = np.ones((1, 1))
    for m in mats:
        out = np.kron(out, m)
    return out


def _dense_objective(sizes, work, cands, alpha):
    G = sum(_marginal_matrix(sizes, w).T @ _marginal_matrix(sizes, w) for w in work)
    X = sum(a * _marginal_matrix(sizes, q).T @ _marginal_matrix(sizes, q)
            for a, q in zip(alpha, cands, strict=True))
    return float(np.trace(G @ np.linalg.pinv(X)))


def test_shares_are_exact_fractions_summing_to_one():
    shares = topdown_query_weights(SCHEMA, [["a"], ["b", "c"], "detailed"],
                                   {"a": ["a"], "bc": ["b", "c"], "detailed": "detailed", "total": "total"})
    assert all(isinstance(v, Fraction) and v > 0 for v in shares.values())
    assert sum(shares.values()) == 1


def test_objective_matches_dense_trace_and_is_optimal():
    """E4 on the structured form: f(α) equals trace(G X⁻¹) computed densely; α* beats 300 random shares."""
    sizes = list(SCHEMA.values())
    work = [{0}, {1, 2}, {0, 1, 2}, {0, 2}]
    cands = [set(), {0}, {1}, {2}, {1, 2}, {0, 1, 2}]
    names = {f"q{i}": [list(SCHEMA)[j] for j in sorted(c)] for i, c in enumerate(cands)}
    wl = [[list(SCHEMA)[j] for j in sorted(w)] for w in work]
    plan = optimize_marginal_weights(SCHEMA, wl, names, denominator=1000)
    alpha = [plan.continuous[f"q{i}"] for i in range(len(cands))]
    assert plan.objective_continuous == pytest.approx(_dense_objective(sizes, work, cands, alpha), rel=1e-9)
    alpha_r = [float(plan.shares.get(f"q{i}", 0)) for i in range(len(cands))]
    assert plan.objective_rational == pytest.approx(_dense_objective(sizes, work, cands, alpha_r), rel=1e-9)
    rng = np.random.default_rng(3)
    for _ in range(300):
        r = rng.dirichlet(np.ones(len(cands)) * 0.7)
        assert plan.objective_continuous <= _dense_objective(sizes, work, cands, r) * (1 + 1e-9)
    assert plan.duality_gap <= 1e-9
    # E6: the singular value bound holds for the restricted optimum.
    assert plan.lower_bound <= plan.objective_continuous * (1 + 1e-12)
    G = sum(_marginal_matrix(sizes, w).T @ _marginal_matrix(sizes, w) for w in work)
    ev = np.clip(np.linalg.eigvalsh(G), 0, None)
    assert plan.lower_bound == pytest.approx(np.sum(np.sqrt(ev)) ** 2 / G.shape[0], rel=1e-9)
    # per-table errors add up to the objective (unit table weights)
    assert sum(plan.per_table_rational.values()) == pytest.approx(plan.objective_rational, rel=1e-12)


def test_rounding_loss_is_bounded_and_reported():
    plan = optimize_marginal_weights(SCHEMA, [["a"], ["b"], ["a", "b", "c"]],
                                     {"a": ["a"], "b": ["b"], "abc": "detailed"}, denominator=7)
    assert sum(plan.shares.values()) == 1
    assert all(v.denominator in (1, 7) for v in plan.shares.values())
    assert 0 <= plan.rounding_loss <= plan.rounding_bound + 1e-12
    fine = optimize_marginal_weights(SCHEMA, [["a"], ["b"], ["a", "b", "c"]],
                                     {"a": ["a"], "b": ["b"], "abc": "detailed"}, denominator=10**6)
    assert fine.rounding_loss <= 1e-5


def test_marginal_workload_matches_the_bound_with_its_own_tables():
    """Marginal workloads measured by their own marginals reach svdb ("matches the bound", Sec. 5)."""
    cands = {"ab": ["a", "b"], "bc": ["b", "c"], "ac": ["a", "c"], "abc": "detailed"}
    plan = optimize_marginal_weights(SCHEMA, [["a", "b"], ["b", "c"], ["a", "c"]], cands)
    assert plan.objective_continuous / plan.lower_bound <= 1.15
    assert plan.objective_continuous <= plan.objective_equal_shares


def test_expected_tse_scales_with_rho_and_sensitivity():
    plan = optimize_marginal_weights(SCHEMA, ["detailed"], {"d": "detailed"})
    assert plan.shares == {"d": Fraction(1)}
    assert plan.objective_rational == pytest.approx(24.0)
    assert plan.expected_tse(Fraction(1, 2)) == pytest.approx(24.0)
    assert plan.expected_tse(Fraction(1, 2), Fraction(2)) == pytest.approx(48.0)
    assert plan.expected_rms(Fraction(1, 2)) == pytest.approx(1.0)


@pytest.mark.parametrize("work,cands,match", [
    ([["a"]], {"b": ["b"]}, "cannot answer"),
    ([["z"]], {"b": ["b"]}, "unknown attribute"),
    ([["a"]], {}, "empty"),
    ([["a"]], {"x": ["a"], "y": ["a"]}, "same marginal"),
])
def test_bad_input_is_refused(work, cands, match):
    with pytest.raises(InputError, match=match):
        optimize_marginal_weights(SCHEMA, work, cands)


def test_bad_schema_and_denominator():
    with pytest.raises(InputError, match="size"):
        optimize_marginal_weights({"a": 0}, [["a"]], {"a": ["a"]})
    with pytest.raises(InputError, match="denominator"):
        optimize_marginal_weights(SCHEMA, [["a"]], {"a": ["a"]}, denominator=0)


def test_pl94_geolevel_shares_are_fast_and_near_bound():
    schema = {"hhgq": 8, "votingage": 2, "hispanic": 2, "cenrace": 63}
    attrs = list(schema)
    cands = {"*".join(c) or "total": list(c) for r in range(5) for c in itertools.combinations(attrs, r)}
    plan = optimize_marginal_weights(schema, list(cands.values()), cands)
    assert sum(plan.shares.values()) == 1
    assert plan.objective_rational <= plan.objective_equal_shares
    assert plan.objective_continuous >= plan.lower_bound * (1 - 1e-12)
    assert plan.rounding_loss <= plan.rounding_bound + 1e-12


def test_random_problems_converge_to_certified_optimum():
    """40 random schemas, workloads, table weights, candidates: gap ≤ 1e-10, no random share is better (dense)."""
    rng = np.random.default_rng(17)
    for _ in range(40):
        k = int(rng.integers(2, 4))
        sizes = [int(rng.integers(2, 6)) for _ in range(k)]
        schema = {f"x{i}": d for i, d in enumerate(sizes)}
        subsets = [set(c) for r in range(k + 1) for c in itertools.combinations(range(k), r)]
        picks = rng.choice(len(subsets), size=int(rng.integers(1, len(subsets) + 1)), replace=False)
        work = [subsets[j] for j in picks]
        cand_sets = [s for s in subsets if rng.random() < 0.6 or len(s) == k]
        omega = rng.uniform(0.1, 5, len(work))
        names = {f"c{i}": [f"x{j}" for j in sorted(c)] for i, c in enumerate(cand_sets)}
        wl = {f"w{i}": [f"x{j}" for j in sorted(c)] for i, c in enumerate(work)}
        plan = optimize_marginal_weights(schema, wl, names,
                                         workload_weights={f"w{i}": float(o) for i, o in enumerate(omega)})
        assert plan.duality_gap <= 1e-10
        assert sum(plan.shares.values()) == 1
        assert plan.objective_continuous >= plan.lower_bound * (1 - 1e-9)
        assert plan.rounding_loss <= plan.rounding_bound + 1e-12
        G = sum(o * _marginal_matrix(sizes, c).T @ _marginal_matrix(sizes, c) for o, c in zip(omega, work,
                                                                                            strict=True))
        grams = [_marginal_matrix(sizes, c).T @ _marginal_matrix(sizes, c) for c in cand_sets]
        alpha = [plan.continuous[f"c{i}"] for i in range(len(cand_sets))]
        X = sum(a * M for a, M in zip(alpha, grams, strict=True))
        assert plan.objective_continuous == pytest.approx(float(np.trace(G @ np.linalg.pinv(X))), rel=1e-8)
        for _ in range(10):
            r = rng.dirichlet(np.ones(len(cand_sets)))
            Xr = sum(a * M for a, M in zip(r, grams, strict=True))
            assert plan.objective_continuous <= float(np.trace(G @ np.linalg.pinv(Xr))) * (1 + 1e-9)

"""Strategy and calibration: S1-S4, S16-S19 (WLS oracles, Figure 2), S14 sensitivity checker."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Literal

import numpy as np
import pytest

from dasflow.errors import InputError
from dasflow.privacy import rng, samplers
from dasflow.products.topdown.spine import Spine, move_to_pareto_frontier
from dasflow.products.topdown.strategy import (
    LevelStrategy,
    QueryGroup,
    Schema,
    exact_share,
    kron_query,
    make_strategy,
)

from .helpers import all_rows, make_spine, measured_rows, wls_var_diag

F = Fraction


def test_s1_query_group_kronecker_fixture() -> None:
    """S1: I_63 ⊗ 1ᵀ_2 ⊗ I_2 is 126×252, one 1 per column, two per row; the builder agrees."""
    q = kron_query([("I", 63), ("1", 2), ("I", 2)])
    assert q.shape == (126, 252)
    assert (q.sum(axis=0) == 1).all() and (q.sum(axis=1) == 2).all()
    schema = Schema((("CENRACE", 63), ("HISPANIC", 2), ("VOTINGAGE", 2)))
    g = QueryGroup("cenrace_va", ("CENRACE", "VOTINGAGE"), F(1))
    assert np.array_equal(g.matrix(schema), q)
    rows = g.row_index(schema)
    assert np.array_equal(q[rows, np.arange(252)], np.ones(252))


def test_s1_pl94_schema_and_every_group_partitions_cells() -> None:
    s = Schema()
    assert s.n_cells == 2016 and s.shape == (8, 2, 2, 63)
    for g in make_strategy(("a",), [1], 1).per_level[0].groups:
        m = g.matrix(s)
        assert (m.sum(axis=0) == 1).all()
        assert m.shape[0] == g.n_rows(s)


def fig2_w() -> np.ndarray:
    return np.vstack([kron_query([("1", 2), ("1", 2)]), kron_query([("I", 2), ("1", 2)]),
                      kron_query([("1", 2), ("I", 2)]), kron_query([("I", 2), ("I", 2)])]).astype(float)


def test_s2_figure2_fixture() -> None:
    """S2: B = stack(1ᵀ_2, I_2), W 9×4, V = B⊗W is 27×8 with 64 ones."""
    B = np.vstack([np.ones((1, 2)), np.eye(2)])
    W = fig2_w()
    assert W.shape == (9, 4)
    V = np.kron(B, W)
    assert V.shape == (27, 8) and int(V.sum()) == 64 and set(np.unique(V)) == {0.0, 1.0}


def test_s19_figure2_gaussian_wls_64_27() -> None:
    """S19: ρ=1, β=(½,½), α=¼ → every diagonal of Var(Vx̂) is 64/27; raw per-query σ² is 8."""
    sp = make_spine([[0, 0]], [F(1, 2), F(1, 2)])
    A, gam = measured_rows(sp)
    B = all_rows(sp)
    W = fig2_w()
    alpha = np.repeat([0.25] * 4, [1, 2, 2, 4])
    d = wls_var_diag(B, W, A, gam, alpha, gaussian=True)
    assert np.allclose(d, 64 / 27, rtol=1e-12)
    st = make_strategy(("US", "block"), [F(1, 2), F(1, 2)], 1,
                       schema=Schema((("R", 2), ("C", 2))),
                       per_level=LevelStrategy(tuple(QueryGroup(n, k, F(1, 4)) for n, k in
                                                     [("t", ()), ("r", ("R",)), ("c", ("C",)),
                                                      ("d", ("R", "C"))])))
    assert st.noise_parameter(F(1, 2), F(1, 4)) == 8


def test_s3_noise_calibration_change_one() -> None:
    """S3: σ² = 1/(ργα) (never 1/(2ρ)); Laplace scale 2/(εγα); γ = 0 emits nothing."""
    st = make_strategy(("a", "b"), ["1/3", "2/3"], F(1, 2))
    assert st.noise_parameter(F(1, 3), F(1, 10)) == F(60)
    assert st.noise_parameter(F(1, 3), F(1, 10)) != 1 / (2 * F(1, 2) * F(1, 3) * F(1, 10))
    pd_st = make_strategy(("a", "b"), ["1/3", "2/3"], F(1, 2), privacy_defn="puredp")
    assert pd_st.noise_parameter(F(1, 3), F(1, 10)) == F(120)
    with pytest.raises(ValueError):
        st.noise_parameter(F(0), F(1, 10))


def test_s4_exact_shares() -> None:
    """S4: β, α > 0 summing to exactly 1, held as exact rationals; floats refused."""
    assert exact_share("0.1", "x") == F(1, 10)
    assert exact_share(Decimal("0.25"), "x") == F(1, 4)
    assert exact_share("1/3", "x") == F(1, 3)
    with pytest.raises(InputError, match="float"):
        exact_share(0.1, "x")
    with pytest.raises(InputError, match="not exactly 1"):
        make_strategy(("a", "b"), ["1/3", "0.6666666"], 1)
    with pytest.raises(InputError, match="> 0"):
        make_strategy(("a", "b"), ["0", "1"], 1)
    with pytest.raises(InputError, match="α"):
        LevelStrategy((QueryGroup("t", (), F(1, 2)), QueryGroup("d", (), F(1, 3))))


def _two_parent_tree(c: int, rule: str) -> Spine:
    return make_spine([[0, 0], [0] * c + [1] * c], [F(1, 3)] * 3, rule)


@pytest.mark.parametrize("c", [1, 2, 3, 4])
def test_s16_laplace_bypass_condition_wls(c: int) -> None:
    """S16 (Laplace, γ scaling): a bypass that meets the Thm 2 condition raises no diagonal element of
    Var(Vx̂) (rtol 1e-9); when it fails (c = 4 with equal β), some element rises."""
    sp = _two_parent_tree(c, "puredp")
    B = all_rows(sp)
    W = fig2_w()
    alpha = np.repeat([0.25] * 4, [1, 2, 2, 4])
    A0, g0 = measured_rows(sp)
    before = wls_var_diag(B, W, A0, g0, alpha, gaussian=False)
    forced = move_to_pareto_frontier(sp, "puredp", force={1: np.ones(2, bool)})
    A1, g1 = measured_rows(forced)
    after = wls_var_diag(B, W, A1, g1, alpha, gaussian=False)
    rule = move_to_pareto_frontier(sp, "puredp")
    if c <= 3:
        assert rule.bypassed[1] == 2
        assert (after <= before * (1 + 1e-9)).all()
    else:
        assert rule.bypassed[1] == 0
        assert (after > before * (1 + 1e-9)).any()


@pytest.mark.parametrize("c", [1, 2, 3])
def test_s16_gaussian_bypass_only_single_child(c: int) -> None:
    """S16 (Gaussian, √γ scaling): c = 1 leaves the diagonal unchanged to 1e-12; c ≥ 2 raises some element."""
    sp = _two_parent_tree(c, "zcdp")
    B = all_rows(sp)
    W = fig2_w()
    alpha = np.repeat([0.25] * 4, [1, 2, 2, 4])
    A0, g0 = measured_rows(sp)
    before = wls_var_diag(B, W, A0, g0, alpha, gaussian=True)
    forced = move_to_pareto_frontier(sp, "zcdp", force={1: np.ones(2, bool)})
    A1, g1 = measured_rows(forced)
    after = wls_var_diag(B, W, A1, g1, alpha, gaussian=True)
    if c == 1:
        assert np.allclose(after, before, rtol=1e-12)
        assert move_to_pareto_frontier(sp, "zcdp").bypassed[1] == 2
    else:
        assert (after > before * (1 + 1e-9)).any()
        assert move_to_pareto_frontier(sp, "zcdp").bypassed[1] == 0


@pytest.mark.parametrize(("c", "gp", "gc"), [(2, 0.3, 0.5), (3, 0.2, 0.1), (5, 0.1, 0.4)])
def test_s17_remark1_closed_forms(c: int, gp: float, gc: float) -> None:
    """S17: total-only W. Laplace: 2c/(cγp²+γc²) before, 2c/(γc+γp)² after; Gaussian: c/(cγp+γc) before,
    c/(γc+γp) after — all equal to the WLS variance of the parent total."""
    W = np.ones((1, 1))
    Bp = np.ones((1, c))
    Ab = np.vstack([np.ones((1, c)), np.eye(c)])
    gb = np.array([gp] + [gc] * c)
    Aa = np.eye(c)
    ga = np.full(c, gp + gc)
    one = np.ones(1)
    assert np.isclose(wls_var_diag(Bp, W, Ab, gb, one, False)[0], 2 * c / (c * gp**2 + gc**2))
    assert np.isclose(wls_var_diag(Bp, W, Aa, ga, one, False)[0], 2 * c / (gc + gp) ** 2)
    assert np.isclose(wls_var_diag(Bp, W, Ab, gb, one, True)[0], c / (c * gp + gc))
    assert np.isclose(wls_var_diag(Bp, W, Aa, ga, one, True)[0], c / (gc + gp))


def _exact_var_dgauss(s2: float) -> float:
    k = np.arange(-200, 201, dtype=float)
    p = np.exp(-(k**2) / (2 * s2))
    return float((k**2 * p).sum() / p.sum())


def test_s18_discrete_noise_oracles() -> None:
    """S18: exact variances (series) match the spec's numbers; the samplers match within Monte-Carlo error.

    n = 400,000 draws; the sample variance has relative s.e. ≈ √(2/n) ≈ 0.0022 (Gaussian; ≈ 0.0035 for the
    heavier-tailed geometric), the bound is 6 s.e. → false-failure rate < 1e-8 per check (seeded, so fixed).
    """
    assert abs((1 - _exact_var_dgauss(1.0)) - 2.1123e-7) < 1e-10
    assert abs((2 - _exact_var_dgauss(2.0)) - 2.2604e-15) < 5e-16
    a = np.exp(-1.0)
    assert abs(2 * a / (1 - a) ** 2 - 1.841347) < 1e-6
    g = rng.seeded(18)
    n = 400_000
    x = samplers.discrete_gaussian(F(1), n, g).astype(float)
    assert abs(x.var() - _exact_var_dgauss(1.0)) < 6 * np.sqrt(2 / n) * 1.0
    y = samplers.two_sided_geometric(F(1), n, g).astype(float)
    assert abs(y.var() - 1.841347) < 6 * 0.0035 * 1.841347 * 1.5


def test_s14_sensitivity_checker_small_spines() -> None:
    """S14: with the plan's calibration, max_j Σ_i D_ij/σ̂²_i = ρ (Gaussian) and Σ_i D_ij/b̂_i = ε/2
    (Laplace), exactly, on small optimised spines (both rules)."""
    rs = np.random.default_rng(14)
    schema = Schema((("R", 2), ("C", 3)))
    groups = LevelStrategy((QueryGroup("t", (), F(1, 5)), QueryGroup("r", ("R",), F(3, 10)),
                            QueryGroup("d", ("R", "C"), F(1, 2))))
    from .helpers import random_parents

    rules: tuple[Literal["zcdp", "puredp"], ...] = ("zcdp", "puredp")
    for rule in rules:
        for _ in range(5):
            par = random_parents(rs, [(1, 3), (1, 3), (1, 4)])
            beta = [F(1, 10), F(2, 10), F(3, 10), F(4, 10)]
            sp = move_to_pareto_frontier(make_spine(par, beta, rule), rule)
            budget = F(3, 2)
            st = make_strategy(sp.levels, beta, budget, schema=schema, per_level=groups,
                               privacy_defn=rule)
            nb = sp.block_geoid.shape[0]
            col = [F(0)] * (nb * schema.n_cells)
            bu = sp.block_unit
            for l in range(sp.n_levels):
                for u in range(sp.n_units(l)):
                    gam = F(int(sp.gamma_num[l][u]), sp.denominator)
                    if gam == 0:
                        continue
                    blocks = np.flatnonzero(bu[l] == u)
                    for g in groups.groups:
                        inv = 1 / st.noise_parameter(gam, g.alpha)
                        for b in blocks:
                            for j in range(schema.n_cells):
                                col[b * schema.n_cells + j] += inv  # each column of Q has exactly one 1
            want = budget if rule == "zcdp" else budget / 2
            assert max(col) == want and min(col) == want


def test_eigen_design_shares_option() -> None:
    """Eigen-Design weights (dasflow.strategy.topdown_weights) as the α option: exact, sum to 1, > 0."""
    from dasflow.products.topdown.strategy import eigen_level_strategy

    schema = Schema((("R", 3), ("C", 4), ("H", 2)))
    cands = {"total": [], "r": ["R"], "rc": ["R", "C"], "detailed": ["R", "C", "H"]}
    lv = eigen_level_strategy(schema, {"total": [], "rc": ["R", "C"], "detailed": ["R", "C", "H"]}, cands)
    assert sum((g.alpha for g in lv.groups), F(0)) == 1 and all(g.alpha > 0 for g in lv.groups)
    assert all(isinstance(g.alpha, Fraction) for g in lv.groups)
    assert {g.name for g in lv.groups} <= set(cands) and lv.has_detailed(schema)

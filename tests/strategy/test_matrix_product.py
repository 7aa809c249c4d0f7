"""The ``matrix`` product: exact plan, exact discrete-Gaussian measurement, least squares with Eq. 1 error."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.privacy import rng as dprng
from dasflow.privacy.measurement import NOISY_COLUMN, VARIANCE_COLUMN
from dasflow.products.base import Product
from dasflow.products.matrix import MatrixProduct, load_config, parse_config
from dasflow.products.matrix.estimate import broadcast_back, marginal_of, table_variance, wls_estimate

RAW = {
    "schema": {"a": 3, "b": 2, "c": 4},
    "workload": {"total": [], "a": ["a"], "bc": ["b", "c"], "detailed": "detailed"},
    "rho": "1/2",
    "level": "state",
}


def _records(n=500, seed=0):
    g = np.random.default_rng(seed)
    return pd.DataFrame({"a": g.integers(0, 3, n), "b": g.integers(0, 2, n), "c": g.integers(0, 4, n)})


def test_plan_is_exact_and_composes_to_rho():
    prod = MatrixProduct(parse_config(RAW))
    assert isinstance(prod, Product)
    specs = prod.plan(prod.config, {})
    assert sum(s.budget for s in specs) == Fraction(1, 2)
    for s in specs:
        assert s.mechanism == "discrete_gaussian" and s.sensitivity == 1
        assert s.noise == 1 / (2 * s.budget) and isinstance(s.noise, Fraction)
        assert s.key.startswith("matrix/state/")


def test_end_to_end_least_squares_matches_dense_solution():
    prod = MatrixProduct(parse_config(RAW))
    specs = prod.plan(prod.config, {})
    prepared = prod.prepare({"records": _records(), "records_source": "people.csv"}, {})
    g = dprng.seeded(7)
    meas = {s.key: prod.measure(prepared, s, g) for s in specs}
    for m in meas.values():
        assert "COUNT" not in m.table.columns and m.rng_mode == "test"
        assert m.table[NOISY_COLUMN].dtype == np.int64
    est = prod.postprocess(meas, {})
    # dense weighted least squares on the same noisy numbers
    shape = (3, 2, 4)
    rows, ys, ws = [], [], []
    for m in meas.values():
        attrs = m.spec.detail["attributes"]
        keep = [list(RAW["schema"]).index(a) for a in attrs]
        for _, r in m.table.iterrows():
            mask = np.ones(shape, dtype=bool)
            for a, ax in zip(attrs, keep, strict=True):
                sl = [slice(None)] * 3
                sl[ax] = np.arange(shape[ax]) != r[a]
                mask[tuple(sl)] = False
            rows.append(mask.reshape(-1).astype(float))
            ys.append(float(r[NOISY_COLUMN]))
            ws.append(1.0 / float(m.spec.noise))
    A = np.array(rows) * np.sqrt(ws)[:, None]
    xd = np.linalg.lstsq(A, np.array(ys) * np.sqrt(ws), rcond=None)[0]
    assert np.allclose(est["detailed"]["ESTIMATE"].to_numpy(), xd, atol=1e-8)
    # Eq. 1 per-cell variance against the dense covariance (AᵀA)⁻¹
    cov = np.linalg.inv(A.T @ A)
    assert est["detailed"][VARIANCE_COLUMN].iloc[0] == pytest.approx(np.mean(np.diag(cov)), rel=1e-9)
    Wa = np.kron(np.eye(3), np.ones((1, 8)))
    assert est["a"][VARIANCE_COLUMN].iloc[0] == pytest.approx(np.mean(np.diag(Wa @ cov @ Wa.T)), rel=1e-9)
    assert est["total"]["ESTIMATE"].iloc[0] == pytest.approx(xd.sum())
    out = prod.tables(est)
    assert set(out) == {"state_total", "state_a", "state_bc", "state_detailed"}


def test_error_formula_by_monte_carlo():
    """200 seeded repetitions: the mean squared error of the detailed estimate agrees with Eq. 1.

    The 24-cell squared-error average over 200 runs has relative standard error ≈ sqrt(2/(24·200)) ≈ 2%;
    we accept 10% (≈ 5 standard errors: false-failure rate < 1e-6; deterministic under the fixed seed).
    """
    prod = MatrixProduct(parse_config({**RAW, "rho": "2"}))
    specs = prod.plan(prod.config, {})
    prepared = prod.prepare({"records": _records(300, 1)}, {})
    truth = prod.histogram(_records(300, 1), "x").reshape(-1)
    sq = []
    root = dprng.seeded(11)
    for i in range(200):
        g = root.spawn(f"run{i}")
        est = prod.postprocess({s.key: prod.measure(prepared, s, g) for s in specs}, {})
        sq.append(np.mean((est["detailed"]["ESTIMATE"].to_numpy() - truth) ** 2))
    expected = est["detailed"][VARIANCE_COLUMN].iloc[0]
    assert np.mean(sq) == pytest.approx(expected, rel=0.10)


def test_structured_helpers():
    g = np.random.default_rng(3)
    h = g.integers(0, 9, (3, 2, 4)).astype(float)
    assert np.allclose(marginal_of(h, [0]), h.sum(axis=(1, 2)))
    assert broadcast_back(np.arange(3.0), [0], (3, 2, 4))[2, 1, 3] == 2.0
    # exact data with tiny noise → estimate reproduces the data when the detailed table is measured
    meas = [([0, 1, 2], h, 1.0), ([0], marginal_of(h, [0]), 4.0)]
    assert np.allclose(wls_estimate((3, 2, 4), meas), h)
    assert math.isinf(table_variance((3, 2, 4), [1], [([0], 1.0)]))


def test_bad_records_name_file_row_column():
    prod = MatrixProduct(parse_config(RAW))
    recs = _records(10)
    recs.loc[4, "c"] = 7
    with pytest.raises(InputError, match=r"file people.csv, row 6, column c"):
        prod.prepare({"records": recs, "records_source": "people.csv"}, {})
    with pytest.raises(InputError, match="column b"):
        prod.prepare({"records": recs.drop(columns=["b"]), "records_source": "people.csv"}, {})


@pytest.mark.parametrize("patch,column", [
    ({"rho": "0"}, "rho"),
    ({"rho": "abc"}, "rho"),
    ({"workload": {"x": ["zz"]}}, "workload.x"),
    ({"schema": {"a": 0}}, "schema.a"),
    ({"bogus": 1}, "bogus"),
    ({"candidates": {"a": ["a"]}}, "candidates"),
])
def test_bad_config(tmp_path, patch, column):
    p = tmp_path / "wl.json"
    p.write_text(json.dumps({**RAW, **patch}))
    with pytest.raises(InputError, match=column):
        prod = MatrixProduct(load_config(p))
        prod.plan(prod.config, {})


def test_e3_integral_matrix_mechanism():
    """Haar (±1 integer) strategy on all 16-cell ranges with the exact discrete Gaussian.

    200 seeded draws; the mean TSE has relative standard error ≈ 6%; we accept 30% (5 s.e., false-failure
    rate < 1e-6; deterministic).
    """
    from dasflow.products.matrix.mechanism import answer, measure
    from dasflow.strategy import workloads as wl

    n = 16
    A = wl.haar(n)
    W = wl.all_range_matrix(n).matrix()
    x = np.random.default_rng(0).integers(0, 50, n)
    root = dprng.seeded(3)
    tse = []
    for i in range(200):
        y, s2 = measure(A, x, Fraction(1, 2), root.spawn(str(i)))
        assert s2 == Fraction(5, 1)  # Δ² = 1 + log2(16) = 5, σ² = 5/(2·½)
        ans, expected = answer(A, y, W, s2)
        tse.append(float(np.sum((ans - W @ x) ** 2)))
    assert np.mean(tse) == pytest.approx(expected, rel=0.3)
    with pytest.raises(InputError, match="support"):
        answer(np.eye(n)[:8], np.zeros(8), W, Fraction(1))
    with pytest.raises(InputError, match="integer"):
        measure(A * 0.5, x, Fraction(1), root)

"""Measurement: noise statistics (R10), full-domain rows (R11), ledger (R12), derived tables (R14), R9, R15.

Statistical tests use the seeded test generator, so they are deterministic; each bound below is stated with
the false-failure probability it would have for a fresh seed.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import DasflowError, LedgerRefusal
from dasflow.privacy import accounting, rng
from dasflow.privacy.ledger import encode_nmf
from dasflow.products.phsafe import PHSAFE, PHSafe, load_config, parse_config, plan, run_non_private, run_private
from dasflow.products.phsafe.measure import KEY_COLUMNS
from dasflow.products.phsafe.product import measure_all, prepare_exact
from dasflow.products.phsafe.tables import OUTPUT_TABLES, data_cell_column
from tests.phsafe.builders import PR_CONFIG, US_CONFIG, Person, Unit, columns, config_with

UNITS = [Unit([Person(40), Person(38, rel=21), Person(10, rel=25), Person(3, rel=25)], state="01"),
         Unit([Person(70, race=2, hisp=2)], state="02", ten=3, hht=4, hht2=9, cplt=5),
         Unit([Person(33, race=4), Person(30, race=4, rel=22), *(Person(i, rel=25) for i in range(12))],
              state="06", ten=4, hht=5, hht2=3, cplt=3)]
US_ROWS = {"PH1_num": 1040, "PH1_denom": 520, "PH2": 416, "PH3": 3640, "PH4": 1040, "PH5_num": 1040,
           "PH5_denom": 520, "PH6": 832, "PH7": 1560, "PH8_num": 1040, "PH8_denom": 1040}
PR_ROWS = {"PH1_num": 20, "PH1_denom": 10, "PH2": 8, "PH3": 70, "PH4": 20, "PH5_num": 20, "PH5_denom": 10,
           "PH6": 16, "PH7": 30, "PH8_num": 20, "PH8_denom": 20}


def noise_sample(spec_key: str, n: int, config: Any, seed: int = 11) -> tuple[np.ndarray, Any]:
    """n noise draws of one planned key, measured through PHSAFE.measure on an all-zero level vector."""
    spec = next(s for s in plan(config) if s.key == spec_key)
    spec = dataclasses.replace(spec, cells=n)
    zeros = pd.DataFrame({"REGION_ID": ["1"] * n, "REGION_TYPE": ["USA"] * n, "ITERATION_CODE": ["*"] * n,
                          "DATA_CELL": np.arange(n), "COUNT": np.zeros(n, dtype=np.int64)})
    m = PHSAFE.measure({spec_key: zeros}, spec, rng.seeded(seed).spawn(spec_key))
    return m.table["NOISY"].to_numpy(), spec


def test_r10_discrete_gaussian_noise_statistics() -> None:
    """Mean, variance, 90% quantile of |noise|, and independence of neighbouring cells (PH3 State A-G,
    σ² = 196/(2·0.662976) ≈ 147.8). Bounds are ≥ 4.5 standard errors: false-failure rate < 1e-4 in total."""
    n = 40_000
    x, spec = noise_sample("PH3/state_A-G", n, load_config(US_CONFIG))
    s2 = float(spec.variance)
    sigma = math.sqrt(s2)
    assert x.dtype == np.int64
    assert abs(x.mean()) <= 4.5 * sigma / math.sqrt(n)
    assert abs(x.var() - s2) <= 4.5 * s2 * math.sqrt(2 / n)
    q90 = float(np.quantile(np.abs(x), 0.9))
    assert 1.645 * sigma - 1 <= q90 <= 1.645 * sigma + 1
    r = np.corrcoef(x[:-1], x[1:])[0, 1]
    assert abs(r) <= 4.5 / math.sqrt(n)
    assert (x < 0).any() and (x > 0).any()  # integers, negatives kept (no clamping)


def test_r10_keys_draw_independent_noise() -> None:
    """Two planned keys with the same σ² get independent draws: |corr| <= 4.5/sqrt(n) (false failure
    ~7e-6)."""
    n = 20_000
    cfg = load_config(US_CONFIG)
    a, _ = noise_sample("PH1_num/state_*", n, cfg)
    b, _ = noise_sample("PH4/state_*", n, cfg)
    assert abs(np.corrcoef(a, b)[0, 1]) <= 4.5 / math.sqrt(n)


def test_puredp_geometric_noise_variance() -> None:
    """Two-sided geometric, b = 2/ε for PH1_denom: sample variance within 4.5 s.e. (kurtosis-adjusted,
    1e-5)."""
    raw = config_with(defn="puredp")
    raw["privacy_budget"]["PH1_denom"]["state_*"] = 0.5
    cfg = parse_config(raw)
    n = 40_000
    x, spec = noise_sample("PH1_denom/state_*", n, cfg)
    assert spec.noise == 4
    v = float(accounting.geometric_variance(Fraction(4)))
    assert spec.variance == pytest.approx(v)
    # Laplace-like excess kurtosis 3 -> var(s^2) ≈ 5σ⁴/n
    assert abs(x.var() - v) <= 4.5 * v * math.sqrt(5 / n)


def test_r11_every_public_cell_is_emitted_us_and_pr() -> None:
    p, u, g = columns(UNITS)
    us = run_private(p, u, g, load_config(US_CONFIG), rng.seeded(1))
    assert {t: len(f) for t, f in us.items()} == US_ROWS
    measured = sum(len(f) for t, f in us.items() if t not in ("PH5_num", "PH8_num"))
    assert measured == 10_608
    pr_units = [dataclasses.replace(x, state="72") for x in UNITS]
    p, u, g = columns(pr_units)
    pr = run_private(p, u, g, load_config(PR_CONFIG), rng.seeded(1))
    assert {t: len(f) for t, f in pr.items()} == PR_ROWS
    assert sum(len(f) for t, f in pr.items() if t not in ("PH5_num", "PH8_num")) == 204
    assert set(pr["PH7"]["REGION_TYPE"]) == {"STATE"} and set(pr["PH7"]["REGION_ID"]) == {"72"}
    assert list(us["PH2"].columns) == ["REGION_ID", "REGION_TYPE", "PH2_DATA_CELL", "NOISE_DISTRIBUTION",
                                       "VARIANCE", "COUNT"]
    assert list(us["PH1_num"].columns) == ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "PH1_NUM_DATA_CELL",
                                           "NOISE_DISTRIBUTION", "VARIANCE", "COUNT"]


def test_r15_variance_and_distribution_columns() -> None:
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    out = run_private(p, u, g, cfg, rng.seeded(2))
    ph3 = out["PH3"]
    sel = (ph3["REGION_TYPE"] == "STATE") & ph3["ITERATION_CODE"].isin(list("ABCDEFG"))
    assert set(ph3.loc[sel, "VARIANCE"]) == {float(Fraction(196) / (2 * Fraction("0.662976")))}
    assert set(ph3["NOISE_DISTRIBUTION"]) == {"Discrete Gaussian"}
    for table, frame in out.items():
        assert frame["COUNT"].dtype == np.int64, table


def test_r14_derived_tables_from_noisy_values_only() -> None:
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    out = run_private(p, u, g, cfg, rng.seeded(3))
    ph4, ph5 = out["PH4"], out["PH5_num"]
    assert (ph4["COUNT"].to_numpy() == ph5["COUNT"].to_numpy()).all()
    assert (ph4["VARIANCE"].to_numpy() == ph5["VARIANCE"].to_numpy()).all()
    assert (ph4["PH4_DATA_CELL"].to_numpy() == ph5["PH5_NUM_DATA_CELL"].to_numpy()).all()
    def rows(frame: pd.DataFrame, cell_col: str) -> dict[tuple[str, str, int], tuple[int, float]]:
        return {(str(r), str(i), int(c)): (int(n), float(v)) for r, i, c, n, v in zip(
            frame["REGION_ID"], frame["ITERATION_CODE"], frame[cell_col], frame["COUNT"], frame["VARIANCE"],
            strict=True)}

    ph7 = rows(out["PH7"], "PH7_DATA_CELL")
    ph8 = rows(out["PH8_num"], "PH8_NUM_DATA_CELL")
    assert len(ph8) == 2 * len(ph7) // 3
    for (region, it, cell), (n, v) in ph8.items():
        if cell == 2:
            assert n == ph7[(region, it, 2)][0] + ph7[(region, it, 3)][0]
            assert v == 2 * ph7[(region, it, 2)][1]
        else:
            assert (n, v) == ph7[(region, it, 4)]
    # the derivation reads only measurements: feeding it different noisy values changes it accordingly
    specs = [s for s in plan(cfg) if s.detail["table"] == "PH7"]
    prepared = prepare_exact(p, u, g, cfg)
    ms = measure_all(prepared, specs, rng.seeded(3), None)
    for m in ms.values():
        m.table["NOISY"] = 1
    est = PHSAFE.postprocess(ms)
    assert set(est["PH8_num"].loc[est["PH8_num"]["DATA_CELL"] == 2, "NOISY"]) == {2}


def test_infinite_budget_private_equals_truncated_ground_truth() -> None:
    p, u, g = columns(UNITS)
    cfg = parse_config(config_with(budget="Infinity"))
    private = run_private(p, u, g, cfg, rng.seeded(4))
    truth = run_non_private(p, u, g, cfg, truncate=True)
    untruncated = run_non_private(p, u, g, cfg)
    for table in OUTPUT_TABLES:
        assert (private[table]["VARIANCE"] == 0).all()
        pt = private[table].drop(columns=["NOISE_DISTRIBUTION", "VARIANCE"])
        pd.testing.assert_frame_equal(pt.reset_index(drop=True), truth[table])
    # the 14-person renter household (tau = 10) makes truncation visible in PH7 (plus 1 renter in 02)
    col = data_cell_column("PH7")
    usa = (truth["PH7"]["REGION_ID"] == "1") & (truth["PH7"]["ITERATION_CODE"] == "*")
    assert truth["PH7"].loc[usa & (truth["PH7"][col] == 4), "COUNT"].item() == 11
    assert untruncated["PH7"].loc[usa & (untruncated["PH7"][col] == 4), "COUNT"].item() == 15


class _NoSpawn:
    mode = "test"

    def spawn(self, key: str) -> Any:
        raise AssertionError(f"noise drawn for {key} despite the refusal")


def test_r12_refuses_over_cap_before_any_noise() -> None:
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    specs = plan(cfg)
    prepared = prepare_exact(p, u, g, cfg)
    with pytest.raises(LedgerRefusal):
        measure_all(prepared, specs, _NoSpawn(), Fraction("1.257280"))
    with pytest.raises(LedgerRefusal):
        measure_all(prepared, [*specs, specs[0]], _NoSpawn(), None)
    with pytest.raises(LedgerRefusal):
        measure_all(prepared, plan(parse_config(config_with(budget="Infinity"))), _NoSpawn(), Fraction(5))
    # puredp: the cap is in ε and the plan's ε add (the ledger's one check, ``check_plan``)
    pure = plan(parse_config(config_with(defn="puredp")))
    eps = sum((s.budget or Fraction(0) for s in pure), Fraction(0))
    with pytest.raises(LedgerRefusal, match="epsilon"):
        measure_all(prepared, pure, _NoSpawn(), eps - Fraction(1, 10**6))
    with pytest.raises(LedgerRefusal, match="more than once"):
        measure_all(prepared, [*pure, pure[0]], _NoSpawn(), eps)
    ms = measure_all(prepared, specs, rng.seeded(5), Fraction("1.257281"))
    assert sum((m.spec.budget or 0 for m in ms.values()), Fraction(0)) == Fraction("1.257281")
    assert {m.rng_mode for m in ms.values()} == {"test"}


def test_seeded_runs_reproduce_and_measure_draws_one_key() -> None:
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    a = run_private(p, u, g, cfg, rng.seeded(9))
    b = run_private(p, u, g, cfg, rng.seeded(9))
    for t in a:
        pd.testing.assert_frame_equal(a[t], b[t])
    spec = next(s for s in plan(cfg) if s.key == "PH7/usa_*")
    prepared = prepare_exact(p, u, g, cfg)
    m = PHSAFE.measure(prepared, spec, rng.seeded(9).spawn("phsafe/PH7/usa_*"))
    assert list(m.table.columns) == [*KEY_COLUMNS, "NOISY", "VARIANCE", "NOISE_DISTRIBUTION"]
    assert len(m.table) == spec.cells == 3
    ph7 = a["PH7"]
    usa = ph7[(ph7["REGION_TYPE"] == "USA") & (ph7["ITERATION_CODE"] == "*")]
    assert usa["COUNT"].tolist() == m.table["NOISY"].tolist()  # the command spawns "phsafe/<key>"


def test_accuracy_report_noise_only_vs_truncation_bias() -> None:
    """R17: against the truncated twin the error is noise only (90% MOE coverage over 10,608 cells within
    ±0.03 of 0.9, ≥ 10 standard errors); against the untruncated truth the big renter household shows bias."""
    from dasflow.products.phsafe.accuracy import accuracy_report
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    private = run_private(p, u, g, cfg, rng.seeded(21))
    measured = {t: f for t, f in private.items() if t not in ("PH5_num", "PH8_num")}
    noise_only = accuracy_report(measured, run_non_private(p, u, g, cfg, truncate=True))
    cells = noise_only["cells"].sum()
    assert cells == 10_608
    coverage = float((noise_only["within_moe90"] * noise_only["cells"]).sum() / cells)
    assert abs(coverage - 0.9) <= 0.03
    exact = accuracy_report(run_private(p, u, g, parse_config(config_with(budget="Infinity")), rng.seeded(1)),
                            run_non_private(p, u, g, cfg))
    ph7 = exact[(exact["table"] == "PH7") & (exact["region_type"] == "USA") & (exact["level"] == "*")]
    assert ph7["mean_error"].item() < 0  # truncation undercounts the 14-person household


def test_a_bound_phsafe_prepares_counts_only_and_measures_the_same_nmf() -> None:
    """The pipeline's PHSafe (bound to its config) stores COUNT only per key and puts the public domain back in
    ``measure``: every key's measurement, and its NMF bytes, equal those of the full prepared frames; an
    unbound PHSafe refuses a counts-only frame, and a frame of the wrong length is refused."""
    p, u, g = columns(UNITS)
    cfg = load_config(US_CONFIG)
    bound = PHSafe(cfg)
    inputs, public = {"persons": p, "units": u}, {"config": cfg, "geo": g}
    compact, full = bound.prepare(inputs, public), PHSAFE.prepare(inputs, public)
    assert list(compact) == list(full) and len(full) == len(plan(cfg))
    nonzero = 0
    for spec in plan(cfg):
        assert list(compact[spec.key].columns) == ["COUNT"]
        nonzero += int(compact[spec.key]["COUNT"].to_numpy().any())
        a = PHSAFE.measure(full, spec, rng.seeded(4).spawn(spec.key))
        b = bound.measure(compact, spec, rng.seeded(4).spawn(spec.key))
        pd.testing.assert_frame_equal(a.table, b.table, check_exact=True)
        assert encode_nmf(a) == encode_nmf(b)
    assert nonzero > 0
    spec = plan(cfg)[0]
    with pytest.raises(DasflowError, match="bound to its config"):
        PHSAFE.measure(compact, spec, rng.seeded(4))
    with pytest.raises(DasflowError, match="plan says"):
        bound.measure({spec.key: compact[spec.key].iloc[1:]}, spec, rng.seeded(4))

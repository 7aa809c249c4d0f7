"""SafeTab-P's stated per-cell MOE in experiments: a hand-computed case (TotalOnly, stat-0 and summed t1 rows,
t2 cells and ``*`` rows) against a brute-force convolution, and a seeded experiment whose unsuppressed cells
(USA, STATE) are within their MOE at least 90 % of the time.

The seeded check is one-sided at z = 3.09 per geolevel and table (false-failure rate 0.1 % each, 3 checks: ≤ 0.3 %
for a new seed; the seed is fixed, so the outcome is deterministic). Clamping at 0 only shrinks errors, and the
MOE is the smallest integer with coverage ≥ 90 %, so the expected share is ≥ 90 %."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow.demo import prepare_demo
from dasflow.experiment import run_experiment
from dasflow.privacy import accounting
from dasflow.products.safetab_p.moe import cell_moes, sum_moe90

SIGMA2 = Fraction(9, 2)
TO_SIGMA2 = Fraction(7, 3)


def _brute_moe(sigma2: Fraction, n: int) -> int:
    """Smallest m with P(|S| ≤ m) ≥ 0.9, S a sum of n discrete Gaussians, by direct convolution."""
    x = np.arange(-60, 61)
    p = np.exp(-(x.astype(float) ** 2) / (2 * float(sigma2)))
    p /= p.sum()
    s = p
    for _ in range(n - 1):
        s = np.convolve(s, p)
    centre = len(s) // 2
    m = 0
    while s[centre - m:centre + m + 1].sum() < 0.9:
        m += 1
    return m


def test_hand_computed_cells() -> None:
    keys = pd.DataFrame({"REGION_TYPE": ["STATE"] * 3, "ITERATION_CODE": ["0001", "0002", "0003"],
                         "_MECH": ["discrete_gaussian"] * 3, "_NOISE": [TO_SIGMA2, SIGMA2, SIGMA2],
                         "_TOTAL_ONLY": [True, False, False]})
    t1 = pd.DataFrame({"REGION_ID": ["01", "01", "01"], "REGION_TYPE": "STATE",
                       "ITERATION_CODE": ["0001", "0002", "0003"], "COUNT": [5, 7, 40]})
    # group 0003 at stat level 1: 2 sexes × 4 age bins, plus one "*" row per sex
    starts = ["0", "18", "45", "65"]
    t2 = pd.DataFrame({"REGION_ID": "01", "REGION_TYPE": "STATE", "ITERATION_CODE": "0003",
                       "AGESTART": [*starts, *starts, "*", "*"], "AGEEND": ["17", "44", "64", "115"] * 2 + ["*", "*"],
                       "SEX": [1] * 4 + [2] * 4 + [1, 2], "COUNT": list(range(10))})
    m1, m2 = cell_moes(t1, t2, keys)
    single = accounting.dgauss_moe_exact(SIGMA2, Fraction(9, 10))
    assert m1.tolist() == [accounting.dgauss_moe_exact(TO_SIGMA2, Fraction(9, 10)), single, _brute_moe(SIGMA2, 8)]
    assert m2.tolist() == [single] * 8 + [_brute_moe(SIGMA2, 4)] * 2
    assert single == _brute_moe(SIGMA2, 1) and _brute_moe(SIGMA2, 8) > single


@pytest.mark.parametrize("n", [1, 2, 12, 48])
def test_sum_moe_matches_brute_force(n: int) -> None:
    assert sum_moe90("discrete_gaussian", SIGMA2, n) == _brute_moe(SIGMA2, n)


def test_unknown_iteration_is_refused() -> None:
    keys = pd.DataFrame({"REGION_TYPE": ["STATE"], "ITERATION_CODE": ["0001"], "_MECH": ["discrete_gaussian"],
                         "_NOISE": [SIGMA2], "_TOTAL_ONLY": [False]})
    t1 = pd.DataFrame({"REGION_ID": ["01"], "REGION_TYPE": ["STATE"], "ITERATION_CODE": ["9999"], "COUNT": [1]})
    t2 = pd.DataFrame(columns=["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "AGESTART", "AGEEND", "SEX", "COUNT"])
    with pytest.raises(ValueError, match="no planned key"):
        cell_moes(t1, t2, keys)


def test_seeded_experiment_fills_within_moe(tmp_path: Path) -> None:
    config = prepare_demo(tmp_path / "store", 1000, 3)
    exp = run_experiment(config, runs=2, seed=4, products=["safetab-p"])
    m = exp.metrics[exp.metrics["pop_bin"] == "all"]
    assert m["within_moe"].notna().all()          # every published SafeTab-P cell has a stated MOE now
    checked = 0
    for _, row in m[m["geolevel"].isin(["USA", "STATE"])].iterrows():
        n = row["cells"] * row["runs"]
        if n < 20:
            continue
        assert row["within_moe"] >= 0.9 - 3.09 * np.sqrt(0.09 / n), (row["table"], row["geolevel"])
        checked += 1
    assert checked >= 2

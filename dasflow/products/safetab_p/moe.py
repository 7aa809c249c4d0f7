"""The 90 % MOE SafeTab-P's plan states for each published t1/t2 cell (its release has no VARIANCE column).

Every published cell is the noisy answer of the stage-2 key of its (region type, iteration level) — found from
the cell's ``REGION_TYPE`` and ``ITERATION_CODE`` and the public iteration index (``plan.level_of``) — or a
sum of such answers (``dasflow.products.safetab_p.outputs``):

* t1 of a TotalOnly iteration: one draw of the key's TotalOnly noise (``detail["total_only_noise"]``);
* t1 of a group at stat level 0 (no t2 rows): one draw of the key's noise;
* t1 of a group at stat level ≥ 1: the sum of its n Sex × Age cells (n = its t2 rows other than ``*``);
* t2 Sex × Age cell: one draw; t2 ``*`` row of a sex: the sum of that sex's cells.

The MOE of a cell is the smallest integer m with P(|S| ≤ m) ≥ 90 % for S its noise (one draw or the sum of n
i.i.d. draws): exact summation for one draw (``accounting.dgauss_moe_exact`` / ``geometric_moe_exact``, as
the accuracy report's per-key MOEs), the product's own convolution of the exact pmf (``outputs.noise_pmf``, as
its suppression thresholds) for a sum. Everything here is computed from the plan, the public iteration index and
the published tables (the cell's stat level is read off the published t2), never from confidential data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dasflow.privacy import accounting
from dasflow.privacy.measurement import MeasurementSpec, Mechanism
from dasflow.products.safetab_p.outputs import noise_pmf
from dasflow.products.safetab_p.plan import level_of

KEY = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
CONFIDENCE = Fraction(9, 10)


def sum_moe90(mechanism: Mechanism, noise: Fraction, n_terms: int) -> int:
    """Smallest m ≥ 0 with P(|S| ≤ m) ≥ 90 %, S the sum of ``n_terms`` i.i.d. draws (0 without noise)."""
    if mechanism == "none" or noise == 0:
        return 0
    if n_terms == 1:
        return (accounting.dgauss_moe_exact(noise, CONFIDENCE) if mechanism == "discrete_gaussian"
                else accounting.geometric_moe_exact(noise, CONFIDENCE))
    m, pmf = noise_pmf(mechanism, noise, n_terms)
    inside = pmf[m] + 2 * np.cumsum(pmf[m + 1:])           # P(|S| ≤ k) for k = 1, 2, …
    if pmf[m] >= float(CONFIDENCE):
        return 0
    return int(np.searchsorted(inside, float(CONFIDENCE) - 1e-12, side="left")) + 1


def key_table(specs: Sequence[MeasurementSpec], public: Mapping[str, Any]) -> pd.DataFrame:
    """Per (REGION_TYPE, ITERATION_CODE) tabulated by a stage-2 key: its mechanism, noise and whether the
    iteration is TotalOnly (then its noise is the TotalOnly noise)."""
    rows: list[pd.DataFrame] = []
    for s in specs:
        d = s.detail
        if d.get("stage") != 2:
            continue
        level = level_of(public["config"], public["iterations"], d["region_type"], int(d["iteration_level"]))
        total_only = np.asarray(level.total_only, dtype=bool)
        rows.append(pd.DataFrame({
            "REGION_TYPE": d["region_type"], "ITERATION_CODE": np.asarray(level.iteration_codes).astype(str),
            "_MECH": s.mechanism,
            "_NOISE": [Fraction(d["total_only_noise"]) if t else s.noise for t in total_only],
            "_TOTAL_ONLY": total_only,
        }))
    out = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(
        columns=["REGION_TYPE", "ITERATION_CODE", "_MECH", "_NOISE", "_TOTAL_ONLY"])
    if out.duplicated(["REGION_TYPE", "ITERATION_CODE"]).any():
        raise ValueError("safetab-p: an iteration code is tabulated by two keys of one region type")
    return out


def _moes(frame: pd.DataFrame) -> np.ndarray:
    """MOE per row of a frame with _MECH, _NOISE, _N (one computation per distinct noise)."""
    if frame["_MECH"].isna().any():
        raise ValueError("safetab-p: a published cell's (region type, iteration code) has no planned key")
    cols = ["_MECH", "_NOISE", "_N"]
    distinct = frame[cols].drop_duplicates(ignore_index=True)   # a handful of noise settings, not cells
    distinct["_MOE"] = [float(sum_moe90(m, q, int(n))) for m, q, n in distinct.itertuples(index=False)]
    return frame[cols].merge(distinct, on=cols, how="left")["_MOE"].to_numpy(np.float64)


def cell_moes(t1: pd.DataFrame, t2: pd.DataFrame, keys: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The stated 90 % MOE of every row of one run's published t1 and t2 (row-aligned), from ``key_table``."""
    t2 = t2.astype({c: str for c in (*KEY, "AGESTART", "SEX")})
    t1 = t1.astype({c: str for c in KEY})
    cells = t2["AGESTART"] != "*"
    per_group = t2[cells].groupby(KEY, sort=False).size().rename("_CELLS").reset_index()
    per_sex = t2[cells].groupby([*KEY, "SEX"], sort=False).size().rename("_N").reset_index()

    left = t1[KEY].merge(keys, on=["REGION_TYPE", "ITERATION_CODE"], how="left", validate="many_to_one")
    left = left.merge(per_group, on=KEY, how="left", validate="many_to_one")
    left["_N"] = np.where(left["_TOTAL_ONLY"].fillna(False).astype(bool), 1,
                          left["_CELLS"].fillna(1).astype(np.int64))
    right = t2[[*KEY, "SEX"]].merge(keys, on=["REGION_TYPE", "ITERATION_CODE"], how="left", validate="many_to_one")
    right = right.merge(per_sex, on=[*KEY, "SEX"], how="left", validate="many_to_one")
    right["_N"] = np.where(cells.to_numpy(), 1, right["_N"].fillna(1).astype(np.int64))
    return _moes(left), _moes(right)

"""Post-processing of the stage-2 measurements into the t1/t2 release files (pure post-processing).

- T1 (``REGION_ID|REGION_TYPE|ITERATION_CODE|COUNT``): the TotalOnly count, the stat-0 total, or for stat ≥
  1 the sum
  of the group's released Sex × Age cells (free post-processing; the paper leaves T1 of such groups open).
- T2 (``…|AGESTART|AGEEND|SEX|COUNT``): the Sex × Age cells of groups with stat level ≥ 1, plus per sex a
  row with
  AGESTART = AGEEND = ``*`` holding the sum of that sex's cells.
- Zero suppression (production): for region types other than USA, STATE, PR-STATE a T1 count ≤ t is dropped, t
  the smallest integer with P(noise ≤ t) ≥ ``zero_suppression_chance`` for THAT count's noise distribution (a single
  draw for TotalOnly/stat-0 totals, the sum of 2·n_bins i.i.d. draws for a summed T1); no thresholding when the
  chance is 0 (t = −∞) or noise is off. Suppression uses the noisy value before any clamping.
- ``allow_negative_counts = false`` clamps every released count at 0 (after sums and suppression).
Nothing here reads private data: inputs are NoisyMeasurements and the public config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.products.base import NOISY_COLUMN, Estimates, Mechanism, NoisyMeasurement
from dasflow.products.safetab_p.config import SafeTabPConfig
from dasflow.products.safetab_p.plan import AGE_BINS
from dasflow.products.safetab_p.regions import UNSUPPRESSED_REGION_TYPES

T1_COLUMNS = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "COUNT"]
T2_COLUMNS = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "AGESTART", "AGEEND", "SEX", "COUNT"]


def noise_pmf(mechanism: Mechanism, noise: Fraction,
              n_terms: int = 1) -> tuple[int, npt.NDArray[np.float64]]:
    """pmf of the sum of ``n_terms`` i.i.d. noises on the integers −m..m: returns (m, pmf).

    Single term: discrete Gaussian ∝ exp(−x²/2σ²); two-sided geometric ∝ exp(−|x|/b). The support is cut where
    the tail mass is below 1e-17 and the n-fold convolution is done once in the Fourier domain.
    """
    v = float(noise)
    if mechanism == "discrete_gaussian":
        m1 = math.ceil(10.0 * math.sqrt(v)) + 2
        x = np.arange(-m1, m1 + 1, dtype=np.float64)
        p = np.exp(-(x * x) / (2.0 * v))
    else:
        m1 = math.ceil(40.0 * v) + 2
        x = np.arange(-m1, m1 + 1, dtype=np.float64)
        p = np.exp(-np.abs(x) / v)
    p /= p.sum()
    if n_terms == 1:
        return m1, p
    m = m1 * n_terms
    size = 2 * m + 1
    f = np.fft.rfft(p, size)
    out = np.fft.irfft(f ** n_terms, size)
    out = np.clip(out, 0.0, None)
    return m, out / out.sum()


def suppression_threshold(mechanism: Mechanism, noise: Fraction, n_terms: int, chance: Fraction) -> float:
    """The smallest integer t with P(noise ≤ t) ≥ chance (−inf for chance 0 or no noise)."""
    if chance == 0 or mechanism == "none" or noise == 0:
        return -math.inf
    m, pmf = noise_pmf(mechanism, noise, n_terms)
    cdf = np.cumsum(pmf)
    i = int(np.searchsorted(cdf, float(chance) - 1e-12, side="left"))
    return float(i - m)


def _thresholds(m: NoisyMeasurement, cfg: SafeTabPConfig) -> npt.NDArray[np.float64]:
    """Suppression threshold per STAT_LEVEL + 1 (index 0 = TotalOnly); −inf where nothing is suppressed."""
    d = m.spec.detail
    out = np.full(5, -math.inf)
    if d["region_type"] in UNSUPPRESSED_REGION_TYPES:
        return out
    chance = cfg.zero_suppression_chance
    out[0] = suppression_threshold(m.spec.mechanism, d["total_only_noise"], 1, chance)
    out[1] = suppression_threshold(m.spec.mechanism, m.spec.noise, 1, chance)
    for k, bins in AGE_BINS.items():
        out[k + 1] = suppression_threshold(m.spec.mechanism, m.spec.noise, 2 * (len(bins) + 1), chance)
    return out


def _t1_t2(m: NoisyMeasurement, cfg: SafeTabPConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    tab = m.table
    stat = tab["STAT_LEVEL"].to_numpy()
    noisy = tab[NOISY_COLUMN].to_numpy(dtype=np.int64)
    keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
    thr = _thresholds(m, cfg)
    single = stat <= 0
    keep = single & (noisy > thr[stat.astype(np.int64) + 1])  # suppression before building any frame
    t1_single = tab.loc[keep, keys].copy()
    t1_single["COUNT"] = noisy[keep]
    cells = tab.loc[~single, ["GROUP", *keys, "STAT_LEVEL", "SEX", "AGESTART", "AGEEND", NOISY_COLUMN]]
    summed = cells.groupby("GROUP", sort=False, observed=True).agg(
        REGION_ID=("REGION_ID", "first"), REGION_TYPE=("REGION_TYPE", "first"),
        ITERATION_CODE=("ITERATION_CODE", "first"), COUNT=(NOISY_COLUMN, "sum"),
        _STAT=("STAT_LEVEL", "first"))
    summed = summed[summed["COUNT"].to_numpy() > thr[summed["_STAT"].to_numpy().astype(np.int64) + 1]]
    t1 = pd.concat([t1_single, summed.reset_index()[T1_COLUMNS]], ignore_index=True)
    marg = cells.groupby(["GROUP", "SEX"], sort=False, observed=True).agg(
        REGION_ID=("REGION_ID", "first"), REGION_TYPE=("REGION_TYPE", "first"),
        ITERATION_CODE=("ITERATION_CODE", "first"), COUNT=(NOISY_COLUMN, "sum")).reset_index()
    marg["AGESTART"] = "*"
    marg["AGEEND"] = "*"
    t2c = cells.rename(columns={NOISY_COLUMN: "COUNT"}).copy()
    t2c["AGESTART"] = t2c["AGESTART"].astype(str)
    t2c["AGEEND"] = t2c["AGEEND"].astype(str)
    t2 = pd.concat([t2c[["GROUP", *T2_COLUMNS]], marg[["GROUP", *T2_COLUMNS]]], ignore_index=True)
    return t1[T1_COLUMNS], t2[T2_COLUMNS]


def postprocess(measurements: Mapping[str, NoisyMeasurement], cfg: SafeTabPConfig) -> Estimates:
    """T1 and T2 of a run from its stage-2 measurements (stage-1 totals are never published)."""
    t1s: list[pd.DataFrame] = []
    t2s: list[pd.DataFrame] = []
    for key in sorted(measurements):
        if key.endswith("/stage2"):
            t1, t2 = _t1_t2(measurements[key], cfg)
            t1s.append(t1.astype({"REGION_ID": str, "REGION_TYPE": str, "ITERATION_CODE": str}))
            t2s.append(t2.astype({"REGION_ID": str, "REGION_TYPE": str, "ITERATION_CODE": str}))
    t1 = pd.concat(t1s, ignore_index=True) if t1s else pd.DataFrame(columns=T1_COLUMNS)
    t2 = pd.concat(t2s, ignore_index=True) if t2s else pd.DataFrame(columns=T2_COLUMNS)
    t1["COUNT"] = t1["COUNT"].astype(np.int64)
    t2["COUNT"] = t2["COUNT"].astype(np.int64)
    if not cfg.allow_negative_counts:
        t1["COUNT"] = t1["COUNT"].clip(lower=0)
        t2["COUNT"] = t2["COUNT"].clip(lower=0)
    return {"t1": t1.reset_index(drop=True), "t2": t2.reset_index(drop=True)}


def tables(estimates: Estimates) -> dict[str, pd.DataFrame]:
    """The release files: t1 and t2 with the production columns, in a stable order."""
    t1 = estimates["t1"][T1_COLUMNS].sort_values(["REGION_TYPE", "REGION_ID", "ITERATION_CODE"],
                                                 kind="stable")
    t2 = estimates["t2"][T2_COLUMNS]
    return {"t1": t1.reset_index(drop=True), "t2": t2.reset_index(drop=True)}

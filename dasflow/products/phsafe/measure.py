"""Noise for one planned key (R9) and the zero-budget derivations PH5_num / PH8_num (R14).

``measure`` draws from the generator it is GIVEN, without spawning: the caller hands it a generator dedicated
to the key (the PHSafe command uses ``rng.spawn("phsafe/" + spec.key)``; the DAG does the same), so a seeded
test release is reproducible key by key and a retry of one key never shifts another key's noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import DasflowError
from dasflow.privacy import samplers
from dasflow.products.base import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    MeasurementSpec,
    NoisyMeasurement,
)
from dasflow.products.phsafe.tables import DERIVED, MEASURED, OUTPUT_TABLES

KEY_COLUMNS = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "DATA_CELL"]


def noise(spec: MeasurementSpec, size: int, rng: Any) -> np.ndarray:
    """Independent exact integer noise for ``size`` cells: N_Z(0, σ²) (zcdp) or geometric(b) (puredp)."""
    if spec.noise == 0:
        return np.zeros(size, dtype=np.int64)
    if spec.mechanism == "discrete_gaussian":
        return np.asarray(samplers.discrete_gaussian(spec.noise, size, rng), dtype=np.int64)
    if spec.mechanism == "two_sided_geometric":
        return np.asarray(samplers.two_sided_geometric(spec.noise, size, rng), dtype=np.int64)
    raise DasflowError(f"{spec.key}: mechanism {spec.mechanism!r} with non-zero noise {spec.noise}")


def measure(prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
    """Add noise to the exact level vector ``prepared[spec.key]`` (every public cell, zeros included).

    The output keeps the domain columns, adds ``NOISY`` (= COUNT + noise, integer, may be negative — no
    clamping or rounding), ``VARIANCE`` (σ² or the geometric variance, as a float for the file) and
    ``NOISE_DISTRIBUTION``. The exact counts are not carried into the measurement.
    """
    if spec.key not in prepared:
        raise DasflowError(f"no prepared tabulation for planned key {spec.key}")
    exact = prepared[spec.key]
    if len(exact) != spec.cells:
        raise DasflowError(f"{spec.key}: prepared {len(exact)} cells, plan says {spec.cells}")
    table = exact[KEY_COLUMNS].copy()
    table[NOISY_COLUMN] = exact["COUNT"].to_numpy(np.int64) + noise(spec, len(exact), rng)
    table[VARIANCE_COLUMN] = float(spec.variance)
    table[MECHANISM_COLUMN] = str(spec.detail["noise_distribution"])
    return NoisyMeasurement(spec=spec, table=table, rng_mode=str(getattr(rng, "mode", "unknown")))


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def derive(measurements: Mapping[str, NoisyMeasurement]) -> dict[str, pd.DataFrame]:
    """Post-processing of noisy measurements only (R14, R18): per output table, all levels stacked.

    PH5_num copies PH4 (same cells 2/3, COUNT and VARIANCE). PH8_num: owner (cell 2) = PH7[2] + PH7[3] with the
    two variances summed, renter (cell 3) = PH7[4]. Columns: domain + NOISY + VARIANCE + NOISE_DISTRIBUTION.
    """
    by_table: dict[str, list[pd.DataFrame]] = {}
    for m in measurements.values():
        table = str(m.spec.detail["table"])
        by_table.setdefault(table, []).append(m.table)
    out: dict[str, pd.DataFrame] = {}
    for table in MEASURED:
        if table in by_table:
            out[table] = _concat(by_table[table])
    for name, (source, mapping) in DERIVED.items():
        if source not in out:
            continue
        src = out[source]
        parts = []
        for new_cell, old_cells in mapping.items():
            sel = src[src["DATA_CELL"].isin(old_cells)]
            g = sel.groupby(["REGION_ID", "REGION_TYPE", "ITERATION_CODE"], sort=False, as_index=False).agg(
                NOISY=(NOISY_COLUMN, "sum"), VARIANCE=(VARIANCE_COLUMN, "sum"),
                NOISE_DISTRIBUTION=(MECHANISM_COLUMN, "first"))
            g["DATA_CELL"] = new_cell
            g["_order"] = np.arange(len(g))
            parts.append(g)
        d = pd.concat(parts, ignore_index=True).sort_values(["_order", "DATA_CELL"], kind="stable")
        out[name] = d[[*KEY_COLUMNS, NOISY_COLUMN, VARIANCE_COLUMN, MECHANISM_COLUMN]].reset_index(drop=True)
    return {t: out[t] for t in OUTPUT_TABLES if t in out}


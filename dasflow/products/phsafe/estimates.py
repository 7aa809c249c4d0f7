"""PHSafe statistical post-processing on the release files (phsafe.md §3; phsafe-production.md, last section).

Input: the PHSafe release frames (``PH1_num.csv`` … ``PH8_denom.csv``: pipe-delimited, one row per region ×
iteration × cell with ``COUNT``, ``NOISE_DISTRIBUTION`` and ``VARIANCE``). Output: frames the release writes as
``phsafe/estimates/{name}.csv``:

* one **count** frame per input table (same keys): ``COUNT`` and ``VARIANCE`` as published, then
  ``ESTIMATE``/``LOWER_90``/``UPPER_90`` — the truncated-normal posterior mean and 90 % equal-tailed credible
  interval of the true count (:func:`dasflow.postprocess.posterior.count_posterior`);
* one **average** frame per ratio table, ``PH1``, ``PH5`` and ``PH8`` (cell 1 = total, then the shell's
  lines), with ``ESTIMATE``/``LOWER_90``/``UPPER_90`` of the average and the posterior means of its numerator
  and denominator (:func:`dasflow.postprocess.posterior.ratio_posterior`).

Privacy: this reads only the published noisy counts and their public variances, so it is post-processing of a
DP release and costs no budget (phsafe.md §3 "Statistical postprocessing"). The intervals cover DA noise only,
not truncation bias or coverage error.

Decisions where the spec is silent (also in ``docs/release.md``):

* The noise is approximated by a continuous Gaussian with the published VARIANCE for both noise
  distributions (the Census did the same; for ``Two-Sided Geometric`` VARIANCE is the geometric variance).
* Bounds: every average lies in ``[lo, 10]`` (κ = τ = 10). ``lo`` is 1 for household averages (PH1 total,
  PH8 total/owner/renter: every occupied unit has its householder) and 2 for the family average (PH5 total).
  The age components of PH1 and PH5 (under 18, 18 and over) can be below 1 per household (households without
  children), so they get ``lo = 0``. Denominators are ``>= 1``.
* PH8's total uses numerator PH8_num[2] + PH8_num[3] (variance the sum: independent noise) over
  PH8_denom[2] + PH8_denom[3]; PH1/PH5 totals sum the two age cells over the shared denominator.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore
from dasflow.postprocess.posterior import count_posterior, ratio_posterior

KEYS = ("REGION_ID", "REGION_TYPE", "ITERATION_CODE")
#: κ: the upper bound of every average (the truncation threshold τ of the person tables)
KAPPA = 10.0
HOUSEHOLD_MIN = 1.0
FAMILY_MIN = 2.0


@dataclass(frozen=True)
class AverageDef:
    """One average table: numerator and denominator files and, per output cell, the numerator cells, the
    denominator cells (summed) and the lower bound of the average."""

    name: str
    numerator: str
    denominator: str
    cells: tuple[tuple[int, tuple[int, ...], tuple[int, ...], float], ...]


AVERAGES: tuple[AverageDef, ...] = (
    AverageDef("PH1", "PH1_num", "PH1_denom",
               ((1, (2, 3), (1,), HOUSEHOLD_MIN), (2, (2,), (1,), 0.0), (3, (3,), (1,), 0.0))),
    AverageDef("PH5", "PH5_num", "PH5_denom",
               ((1, (2, 3), (1,), FAMILY_MIN), (2, (2,), (1,), 0.0), (3, (3,), (1,), 0.0))),
    AverageDef("PH8", "PH8_num", "PH8_denom",
               ((1, (2, 3), (2, 3), HOUSEHOLD_MIN), (2, (2,), (2,), HOUSEHOLD_MIN),
                (3, (3,), (3,), HOUSEHOLD_MIN))),
)


def cell_column(table: str) -> str:
    return f"{table.upper()}_DATA_CELL"


def read_release_frames(store: ObjectStore, prefix: str) -> dict[str, pd.DataFrame]:
    """The PHSafe release files under ``prefix`` (``…/release/phsafe/``) as frames keyed by table name."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    out: dict[str, pd.DataFrame] = {}
    for key in store.list(prefix):
        rest = key[len(prefix):]
        if "/" in rest or not rest.endswith(".csv"):
            continue
        out[rest[:-4]] = parse_release_file(store.get(key), f"{store.uri}/{key}")
    return out


def parse_release_file(data: bytes, name: str) -> pd.DataFrame:
    """One pipe-delimited release file with key columns as text, COUNT as int64, VARIANCE as float."""
    frame = pd.read_csv(io.BytesIO(data), sep="|", dtype=str, keep_default_na=False)
    return checked_frame(frame, name)


def checked_frame(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    """Check one release frame (columns, integer COUNT, finite VARIANCE >= 0); ``InputError`` names the row."""
    table = name.rsplit("/", 1)[-1].removesuffix(".csv")
    need = ["REGION_ID", "REGION_TYPE", cell_column(table), "VARIANCE", "COUNT"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise InputError(f"missing column(s) {missing}", file=name, column=missing[0])
    out = frame.copy()
    for col, kind in (("COUNT", "integer"), ("VARIANCE", "number"), (cell_column(table), "integer")):
        values = pd.to_numeric(out[col], errors="coerce")
        bad = values.isna().to_numpy().copy()
        if kind == "integer":
            bad |= ~np.isfinite(values.to_numpy(np.float64, na_value=np.nan)) | (values % 1 != 0).to_numpy()
        else:
            bad |= ~np.isfinite(values.to_numpy(np.float64, na_value=np.nan)) | (values < 0).to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise InputError(f"{col} must be a{'n' if kind == 'integer' else ''} {kind}"
                             f"{' >= 0' if kind == 'number' else ''}, got {frame[col].iloc[row]!r}",
                             file=name, row=row + 2, column=col)
        out[col] = values.astype(np.int64 if kind == "integer" else np.float64)
    if "ITERATION_CODE" not in out.columns:
        out["ITERATION_CODE"] = "*"
    for col in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE"):
        out[col] = out[col].astype(str)
    return out


def count_estimates(table: str, frame: pd.DataFrame, level: float = 0.9) -> pd.DataFrame:
    """Per-cell posterior mean and credible interval of the true count (keys and published values kept)."""
    post = count_posterior(frame["COUNT"].to_numpy(np.float64), frame["VARIANCE"].to_numpy(np.float64), level)
    keys = [c for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE", cell_column(table)) if c in frame.columns]
    out = frame[[*keys, "COUNT", "VARIANCE"]].reset_index(drop=True).copy()
    out["ESTIMATE"] = post.mean
    out["LOWER_90"] = post.lower
    out["UPPER_90"] = post.upper
    return out


def _sums(frame: pd.DataFrame, table: str, cells: tuple[int, ...], index: pd.MultiIndex,
          name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per (region, iteration) of ``index``: the sum of COUNT and of VARIANCE over ``cells``."""
    part = frame[frame[cell_column(table)].isin(cells)]
    grouped = part.groupby(list(KEYS), sort=False)[["COUNT", "VARIANCE"]].agg(["sum", "size"])
    grouped = grouped.reindex(index)
    sizes = grouped[("COUNT", "size")].to_numpy()
    bad = np.flatnonzero(np.isnan(sizes.astype(np.float64)) | (sizes != len(cells)))
    if bad.size:
        key = index[int(bad[0])]
        raise InputError(f"{name}: no single row per cell {list(cells)} for region/iteration {key}",
                         file=f"{table}.csv", column=cell_column(table))
    return (grouped[("COUNT", "sum")].to_numpy(np.float64), grouped[("VARIANCE", "sum")].to_numpy(np.float64))


def average_estimates(frames: Mapping[str, pd.DataFrame], spec: AverageDef, level: float = 0.9) -> pd.DataFrame:
    """The average table ``spec.name`` (one row per region × iteration × output cell)."""
    num = frames[spec.numerator]
    den = frames[spec.denominator]
    index = pd.MultiIndex.from_frame(den[list(KEYS)].drop_duplicates())
    sums = [(*_sums(num, spec.numerator, num_cells, index, spec.name),
             *_sums(den, spec.denominator, den_cells, index, spec.name), np.full(len(index), float(lower)))
            for _, num_cells, den_cells, lower in spec.cells]
    # one posterior call for every output cell (each cell's result is its own: element-wise, per-row sums)
    zn, vn, zd, vd, lo = (np.concatenate(column) for column in zip(*sums, strict=True))
    post = ratio_posterior(zn, vn, zd, vd, lo=lo, hi=KAPPA, d_min=1.0, level=level)
    parts = []
    for i, (cell, *_) in enumerate(spec.cells):
        rows = slice(i * len(index), (i + 1) * len(index))
        part = index.to_frame(index=False)
        part[cell_column(spec.name)] = cell
        part["ESTIMATE"] = post.mean[rows]
        part["LOWER_90"] = post.lower[rows]
        part["UPPER_90"] = post.upper[rows]
        part["NUMERATOR_ESTIMATE"] = post.numerator_mean[rows]
        part["DENOMINATOR_ESTIMATE"] = post.denominator_mean[rows]
        part["_order"] = np.arange(len(part))
        parts.append(part)
    out = pd.concat(parts, ignore_index=True).sort_values(["_order", cell_column(spec.name)], kind="stable")
    return out.drop(columns="_order").reset_index(drop=True)


def phsafe_estimates(frames: Mapping[str, pd.DataFrame], level: float = 0.9) -> dict[str, pd.DataFrame]:
    """Count estimates for every released table and average estimates for PH1, PH5, PH8 (where both the
    numerator and the denominator were released; a table with zero budget is not released)."""
    out: dict[str, pd.DataFrame] = {}
    checked = {t: checked_frame(f, f"{t}.csv") for t, f in frames.items()}
    for table, frame in sorted(checked.items()):
        est = count_estimates(table, frame, level)
        if "ITERATION_CODE" not in frames[table].columns:  # PH2, PH6: Unattributed only, no iteration column
            est = est.drop(columns="ITERATION_CODE")
        out[table] = est
    for spec in AVERAGES:
        if spec.numerator in checked and spec.denominator in checked:
            out[spec.name] = average_estimates(checked, spec, level)
    return out


def estimate_file_name(name: str) -> str:
    """Where the integrator writes an estimate frame, relative to ``release/phsafe/``."""
    return f"estimates/{name}.csv"


def estimates_bytes(frame: pd.DataFrame) -> bytes:
    """Pipe-delimited text like the other release files; floats with 6 decimals (intervals are approximate
    to far fewer digits; fixed formatting keeps a re-run byte-identical)."""
    return str(frame.to_csv(index=False, sep="|", lineterminator="\n", float_format="%.6f")).encode()

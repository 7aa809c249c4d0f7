"""Release files in the Census production format, atomic writing, and the output validator (R11, R15, R16).

Private output, one pipe-delimited file per table (``PH1_num.csv`` … ``PH8_denom.csv``)::

    REGION_ID|REGION_TYPE|ITERATION_CODE|<TABLE>_DATA_CELL|NOISE_DISTRIBUTION|VARIANCE|COUNT

(no ITERATION_CODE for PH2 and PH6). The non-private ground truth has the same layout without
NOISE_DISTRIBUTION and VARIANCE. VARIANCE is written as Python's shortest round-trip float text, so the validator
compares it bit-exactly with ``float(σ²)`` recomputed from the config.

Files are written to ``<name>.tmp`` first and renamed only after every table is written, so an interrupted run
never leaves a set of files that looks complete.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.errors import DasflowError
from dasflow.products.base import MECHANISM_COLUMN, NOISY_COLUMN, VARIANCE_COLUMN
from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.planning import NOISE_NAMES, plan
from dasflow.products.phsafe.tables import DERIVED, MEASURED, OUTPUT_TABLES, data_cell_column
from dasflow.products.phsafe.tabulate import domain_frame


def has_iteration(table: str) -> bool:
    """PH2 and PH6 are Unattributed only and carry no ITERATION_CODE column."""
    src = DERIVED[table][0] if table in DERIVED else table
    return MEASURED[src].iterated


def columns(table: str, private: bool = True) -> list[str]:
    """The header of one output file."""
    cols = ["REGION_ID", "REGION_TYPE"]
    if has_iteration(table):
        cols.append("ITERATION_CODE")
    cols.append(data_cell_column(table))
    if private:
        cols += ["NOISE_DISTRIBUTION", "VARIANCE"]
    return [*cols, "COUNT"]


def release_frame(table: str, estimate: pd.DataFrame) -> pd.DataFrame:
    """A post-processed estimate (domain + NOISY + VARIANCE + NOISE_DISTRIBUTION) in the release layout."""
    out = pd.DataFrame({
        "REGION_ID": estimate["REGION_ID"].astype(str),
        "REGION_TYPE": estimate["REGION_TYPE"].astype(str),
        "ITERATION_CODE": estimate["ITERATION_CODE"].astype(str),
        data_cell_column(table): estimate["DATA_CELL"].astype(np.int64),
        "NOISE_DISTRIBUTION": estimate[MECHANISM_COLUMN].astype(str),
        "VARIANCE": estimate[VARIANCE_COLUMN].astype(float),
        "COUNT": estimate[NOISY_COLUMN].astype(np.int64),
    })
    return out[columns(table)]


def truth_frame(table: str, exact: pd.DataFrame) -> pd.DataFrame:
    """An exact tabulation (domain + COUNT) in the ground-truth layout."""
    out = exact.rename(columns={"DATA_CELL": data_cell_column(table)})
    return out[columns(table, private=False)].reset_index(drop=True)


def write_tables(frames: Mapping[str, pd.DataFrame], output_path: str | Path) -> list[Path]:
    """Write ``<table>.csv`` files (pipe-delimited) atomically: all temp files first, then renames."""
    root = Path(output_path)
    root.mkdir(parents=True, exist_ok=True)
    tmps: list[tuple[Path, Path]] = []
    try:
        for table, frame in frames.items():
            final = root / f"{table}.csv"
            tmp = root / f".{table}.csv.tmp"
            frame.to_csv(tmp, sep="|", index=False, float_format=None)
            tmps.append((tmp, final))
    except BaseException:
        for tmp, _ in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, final in tmps:
        os.replace(tmp, final)
    return [final for _, final in tmps]


def expected_variances(config: PHSafeConfig) -> dict[str, dict[tuple[str, str], float]]:
    """Per output table: (REGION_TYPE, iteration level) -> the VARIANCE recomputed from config (R16)."""
    out: dict[str, dict[tuple[str, str], float]] = {}
    for spec in plan(config):
        table = str(spec.detail["table"])
        geo, it = spec.level.split("_", 1)
        out.setdefault(table, {})[("USA" if geo == "usa" else "STATE", it)] = float(spec.variance)
    for name, (source, _) in DERIVED.items():
        if source in out:
            out[name] = dict(out[source])
    return out


def _derived_variance(table: str, cell: npt.NDArray[np.int64], base: npt.NDArray[np.float64]
                      ) -> npt.NDArray[np.float64]:
    """Per row: PH8_num owner (cell 2) sums two PH7 cells, so its variance is twice the level's."""
    out: npt.NDArray[np.float64] = np.where((table == "PH8_num") & (cell == 2), base + base, base)
    return out


def validate_output(output_path: str | Path, config: PHSafeConfig) -> None:
    """R16: every expected file exists with the exact header, the exact public domain (row set and count), the
    configured NOISE_DISTRIBUTION, integer COUNT, and VARIANCE equal to the formula for the configured ρ/τ.

    Raises :class:`DasflowError` naming the file, row and column of the first problem.
    """
    root = Path(output_path)
    specs = plan(config)
    levels: dict[str, list[str]] = {}
    for spec in specs:
        levels.setdefault(str(spec.detail["table"]), []).append(spec.level)
    for name, (source, _) in DERIVED.items():
        if source in levels:
            levels[name] = levels[source]
    variances = expected_variances(config)
    for table in OUTPUT_TABLES:
        path = root / f"{table}.csv"
        if table not in levels:
            if path.exists():
                raise DasflowError(f"{path}: table has no budget but a file was written")
            continue
        if not path.exists():
            raise DasflowError(f"{path}: missing output file")
        df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)
        if list(df.columns) != columns(table):
            raise DasflowError(f"{path}: header {'|'.join(df.columns)} != {'|'.join(columns(table))}")
        src = DERIVED[table][0] if table in DERIVED else table
        cells = tuple(DERIVED[table][1]) if table in DERIVED else MEASURED[table].cells
        tdef = MEASURED[src]
        dom = pd.concat([domain_frame(tdef, lv, config.state_filter) for lv in levels[table]],
                        ignore_index=True)
        if table in DERIVED:
            dom = dom[dom["DATA_CELL"] == tdef.cells[0]]
            dom = pd.concat([dom.assign(DATA_CELL=c) for c in cells], ignore_index=True)
        if len(df) != len(dom):
            raise DasflowError(f"{path}: {len(df)} rows, expected {len(dom)}")
        cell_col = data_cell_column(table)
        # cell keys "REGION_ID|REGION_TYPE|cell[|ITERATION_CODE]", joined column-wise (vectorised)
        got = df["REGION_ID"].astype(str) + "|" + df["REGION_TYPE"].astype(str) + "|" + df[cell_col].astype(str)
        if has_iteration(table):
            got = got + "|" + df["ITERATION_CODE"]
        want = dom["REGION_ID"].astype(str) + "|" + dom["REGION_TYPE"].astype(str) + "|" + \
            dom["DATA_CELL"].astype(str)
        if has_iteration(table):
            want = want + "|" + dom["ITERATION_CODE"].astype(str)
        if got.duplicated().any():
            i = int(np.flatnonzero(got.duplicated().to_numpy())[0])
            raise DasflowError(f"{path}: row {i + 2}: duplicate cell {got.iloc[i]}")
        missing = sorted(set(want) - set(got))
        if missing:
            raise DasflowError(f"{path}: missing cell {missing[0]}")
        extra = ~got.isin(set(want))
        if extra.any():
            i = int(np.flatnonzero(extra.to_numpy())[0])
            raise DasflowError(f"{path}: row {i + 2}: cell {got.iloc[i]} outside the public domain")
        noise_name = NOISE_NAMES[config.privacy_defn]
        bad = df["NOISE_DISTRIBUTION"] != noise_name
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DasflowError(f"{path}: row {i + 2}, column NOISE_DISTRIBUTION: expected {noise_name!r}")
        ok_count = df["COUNT"].str.fullmatch(r"-?[0-9]+")
        if not ok_count.all():
            i = int(np.flatnonzero(~ok_count.to_numpy())[0])
            raise DasflowError(f"{path}: row {i + 2}, column COUNT: not an integer: {df['COUNT'].iloc[i]!r}")
        # the planned variance of each row's (region type, iteration level), looked up per distinct pair
        vmap = variances[table]
        if has_iteration(table):
            codes = df["ITERATION_CODE"]
            it_level = codes.map({c: _iteration_level(c) for c in pd.unique(codes)})
        else:
            it_level = pd.Series("*", index=df.index)
        planned = pd.MultiIndex.from_tuples(list(vmap), names=["REGION_TYPE", "LEVEL"])
        at = planned.get_indexer(pd.MultiIndex.from_arrays([df["REGION_TYPE"], it_level]))
        if (at < 0).any():
            i = int(np.flatnonzero(at < 0)[0])
            raise DasflowError(f"{path}: row {i + 2}, column REGION_TYPE: no planned variance for "
                               f"{df['REGION_TYPE'].iloc[i]!r}")
        base = np.array(list(vmap.values()), dtype=np.float64)[at]
        expect = _derived_variance(table, pd.to_numeric(df[cell_col]).to_numpy(np.int64), base)
        got_v = df["VARIANCE"].astype(float).to_numpy()
        bad_v = got_v != expect
        if bad_v.any():
            i = int(np.flatnonzero(bad_v)[0])
            raise DasflowError(f"{path}: row {i + 2}, column VARIANCE: {got_v[i]!r} != {expect[i]!r} "
                               "recomputed from the config")


def _iteration_level(code: str) -> str:
    if code == "*":
        return "*"
    if code in ("H", "I"):
        return "H,I"
    return "A-G"


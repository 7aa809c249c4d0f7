"""Output suites: every release file checked before it is published.

For each product's release files: the exact header (per the product's output spec), at least one row, integer
COUNT (text of an integer), VARIANCE a finite non-negative number, and no confidential column (record-level
attributes of the inputs, e.g. MAFID, QAGE, CENRACE, QRACE1..8). PHSafe outputs additionally go through the
product's own R16 check (``dasflow.products.phsafe.outputs.validate_output``: exact public row domain and row
counts per table, configured NOISE_DISTRIBUTION, VARIANCE equal to the formula for the planned ρ/τ) when its
config is given; and every VARIANCE value must be one of the plan's variances for that product (or a sum of
two, PHSafe's derived PH8 cell), so no file can claim an accuracy the plan does not have. Group sizes promise a
consistent, non-negative release: that is checked across the nation, state and county files.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import DasflowError, InputError
from validation import gx
from validation.domain import domain_frame
from validation.report import render_html
from validation.result import ExpectationRow, ValidationResult

#: record-level attributes of the confidential inputs; none may appear as a column of a release file
#: record identifiers and raw CEF response fields: never a column of a release file. Category names that are
#: legitimate dimensions of an aggregate table (CENRACE, HHGQ, HISPANIC, VOTINGAGE in TopDown and matrix
#: tables; public block GEOIDs) are not in this set.
CONFIDENTIAL_COLUMNS = frozenset({
    "MAFID", "PID", "EUID", "RTYPE", "QAGE", "QSEX", "QSPAN", "HOUSEHOLDER", "CENHISP", "RELSHIP",
    *(f"QRACE{i}" for i in range(1, 9)), "FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"})

#: products whose release files may have no rows (SafeTab-P publishes only what its adaptive thresholds allow)
MAY_BE_EMPTY = frozenset({"safetab-p"})

_INT = r"-?[0-9]+"
_FLOAT = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|inf"


def expected_header(product: str, file: str) -> list[str] | None:
    """The spec header of one release file (None: not a known file of the product)."""
    stem = Path(file).name.removesuffix(".csv")
    if product == "phsafe" and "/" in file:
        return None  # derived files in sub-folders (e.g. estimates/ with MOEs): generic checks only
    if product == "phsafe":
        from dasflow.products.phsafe.outputs import columns
        from dasflow.products.phsafe.tables import OUTPUT_TABLES

        return columns(stem) if stem in OUTPUT_TABLES else None
    if product == "safetab-p":
        from dasflow.products.safetab_p.outputs import T1_COLUMNS, T2_COLUMNS

        return {"t1": T1_COLUMNS, "t2": T2_COLUMNS}.get(stem.split("_")[0])
    if product == "groupsize":
        return {"groupsize_nation": ["STATE", "HOUSEHOLD_SIZE", "COUNT"],  # STATE "US"
                "groupsize_state": ["STATE", "HOUSEHOLD_SIZE", "COUNT"],
                "groupsize_county": ["STATE", "COUNTY", "HOUSEHOLD_SIZE", "COUNT"]}.get(stem)
    return None


def _read_release(root: Path) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or "/" not in rel:  # CERTIFICATE.md, ledger.csv, MANIFEST.json are not tables
            continue
        if p.suffix == ".parquet":
            out[rel] = pd.read_parquet(p).astype(str)
        elif p.suffix in (".csv", ".txt"):
            out[rel] = pd.read_csv(p, sep="|", dtype=str, keep_default_na=False)
    return out


def _planned_variances(plan_record: Mapping[str, Any], product: str) -> set[float]:
    vs = {float(Fraction(e["variance"])) if "/" in str(e["variance"]) else float(e["variance"])
          for e in plan_record.get("entries", []) if e["product"] == product}
    return vs | {a + b for a in vs for b in vs}


def groupsize_consistency(frames: Mapping[str, pd.DataFrame]) -> InputError | None:
    """Group sizes promise a consistent, valid release (hierarchical-groupsize.md H3/C4): every count ≥ 0, every
    region has the same household-size rows, and for every size the counties of a state sum to the state and
    the states to the nation."""
    names = {lvl: f"groupsize/groupsize_{lvl}.csv" for lvl in ("nation", "state", "county")}
    if not all(n in frames for n in names.values()):
        return None
    tables = {lvl: frames[n].astype(str) for lvl, n in names.items()}
    for lvl, t in tables.items():
        counts = pd.to_numeric(t["COUNT"], errors="coerce").to_numpy()
        bad = ~(counts >= 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return InputError(f"COUNT {t['COUNT'].iloc[i]!r} is not a valid (non-negative integer) count",
                              file=names[lvl], row=i + 2, column="COUNT")
    sizes = sorted(set(tables["nation"]["HOUSEHOLD_SIZE"]))
    for lvl, geo in (("state", ["STATE"]), ("county", ["STATE", "COUNTY"])):
        t = tables[lvl]
        per_region = t.groupby(geo)["HOUSEHOLD_SIZE"].apply(lambda s: sorted(s) == sizes)
        if not bool(per_region.all()):
            region = per_region.index[~per_region.to_numpy()][0]
            return InputError(f"region {region} does not have one row per household size {sizes}",
                              file=names[lvl], column="HOUSEHOLD_SIZE")
    for child, parent, geo in (("county", "state", ["STATE"]), ("state", "nation", [])):
        c, p = tables[child].copy(), tables[parent].copy()
        c["COUNT"], p["COUNT"] = c["COUNT"].astype(np.int64), p["COUNT"].astype(np.int64)
        sums = c.groupby([*geo, "HOUSEHOLD_SIZE"])["COUNT"].sum()
        key = [*geo, "HOUSEHOLD_SIZE"]
        joined = p.join(sums.rename("CHILDREN"), on=key)
        bad = (joined["CHILDREN"].fillna(0).astype(np.int64) != joined["COUNT"]).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return InputError(f"inconsistent: {parent} count {int(joined['COUNT'].iloc[i])} != sum of its "
                              f"{child} counts {int(joined['CHILDREN'].fillna(0).iloc[i])}", file=names[parent],
                              row=i + 2, column="COUNT")
    return None


def validate_outputs(release: str | Path | Mapping[str, pd.DataFrame], plan_record: Mapping[str, Any],
                     configs: Mapping[str, Any] | None = None) -> ValidationResult:
    """Validate every release table (``{product}/{file}`` → frame, or a ``runs/{id}/release`` directory).

    ``plan_record`` is ``ledger.plan_record()``; ``configs`` (product → loaded config) enables the products'
    own deep output checks. Returns a result whose ``error`` names file, row and column of the first problem.
    """
    root: Path | None = None
    if isinstance(release, str | Path):
        root = Path(release)
        frames = _read_release(root)
    else:
        frames = dict(release)
    rows: list[ExpectationRow] = []
    error: InputError | None = None
    files: dict[str, int] = {}
    for rel, frame in sorted(frames.items()):
        product, _, file = rel.partition("/")
        files[rel] = len(frame)
        frame = frame.astype(str)
        leaked = sorted(CONFIDENTIAL_COLUMNS & set(frame.columns))
        header = expected_header(product, file)
        checks = [gx.Check("ExpectColumnValuesToNotBeNull", {"column": c}) for c in frame.columns]
        if header is not None:
            checks.insert(0, gx.Check("ExpectTableColumnsToMatchOrderedList", {"column_list": header}))
        if "COUNT" in frame.columns:
            checks.append(gx.Check("ExpectColumnValuesToMatchRegex", {"column": "COUNT", "regex": f"^(?:{_INT})$"}))
        if "VARIANCE" in frame.columns:
            checks.append(gx.Check("ExpectColumnValuesToMatchRegex",
                                   {"column": "VARIANCE", "regex": f"^(?:{_FLOAT})$"}))
        out = gx.validate(f"output.{product}.{Path(file).name}.{'|'.join(frame.columns)}", checks,
                          domain_frame({c: frame[c] for c in frame.columns}))
        rows += [ExpectationRow(rel, r.expectation, r.column, r.success, r.unexpected, r.detail) for r in out.rows]
        if error is None and leaked:
            error = InputError(f"confidential column {leaked[0]} in a release file", file=rel, row=1,
                               column=leaked[0])
        if error is None and len(frame) == 0 and product not in MAY_BE_EMPTY:
            error = InputError("release file has no rows", file=rel, row=2)
        if error is None and not out.success:
            bad = next(r for r in out.rows if not r.success)
            row = None
            if bad.column is not None and out.first_failure and out.first_failure[2]:
                hit = np.flatnonzero(frame[bad.column].to_numpy() == str(out.first_failure[2][0]))
                row = int(hit[0]) + 2 if hit.size else None
            error = InputError(f"{bad.expectation} failed ({bad.detail})", file=rel, row=row or 1,
                               column=bad.column)
        # a VARIANCE beside NOISE_DISTRIBUTION is a noisy measurement's own (PHSafe publishes them): it must be a
        # planned variance; post-processed estimates (e.g. the matrix product's least squares) carry their own
        if (error is None and "VARIANCE" in frame.columns and "NOISE_DISTRIBUTION" in frame.columns
                and plan_record.get("entries") and "/" not in file):
            planned = _planned_variances(plan_record, product)
            got = frame["VARIANCE"].astype(float).to_numpy()
            known = np.array(sorted(planned))
            ok = np.isclose(got[:, None], known[None, :], rtol=1e-12, atol=0).any(axis=1) if known.size else \
                np.zeros(len(got), bool)
            if not ok.all():
                i = int(np.flatnonzero(~ok)[0])
                error = InputError(f"VARIANCE {got[i]!r} is not a planned variance of {product}", file=rel,
                                   row=i + 2, column="VARIANCE")
    if error is None:
        error = groupsize_consistency(frames)
    if error is None and root is not None and configs and "phsafe" in configs and (root / "phsafe").is_dir():
        from dasflow.products.phsafe.outputs import validate_output

        try:
            validate_output(root / "phsafe", configs["phsafe"])
        except DasflowError as exc:
            error = exc if isinstance(exc, InputError) else InputError(str(exc), file=str(root / "phsafe"))
    summary = {"files": files, "suite_version": gx.SUITE_VERSION,
               "expectations": {"evaluated": len(rows), "failed": sum(not r.success for r in rows)}}
    result = ValidationResult("outputs", error is None, summary, rows, error=error)
    result.html = render_html(result)
    return result

"""Output suites: every release file checked before it is published.

For each product's release files: the exact header (per the product's output spec), at least one row, integer
COUNT (text of an integer), VARIANCE a finite non-negative number, and no confidential column (record-level
attributes of the inputs, e.g. MAFID, QAGE, CENRACE, QRACE1..8); every VARIANCE value beside a
NOISE_DISTRIBUTION must be one of the plan's variances for that product (or a sum of two, PHSafe's derived PH8
cell), so no file can claim an accuracy the plan does not have.

What is product-specific comes from the product's plugin (``dasflow.registry.get_plugin``; an unregistered
product gets the generic checks only): the header of each file (``output_header``), whether a file may be empty
(``may_be_empty``), cross-file rules on its tables (``check_outputs``, e.g. group sizes consistent across nation,
states and counties) and, when its config is given and the release is a directory, its production output
validator on the files' bytes (``check_release_files``, e.g. PHSafe's R16 check).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from dasflow.errors import DasflowError, InputError
from dasflow.registry import get_plugin
from dasflow.validation import gx
from dasflow.validation.domain import domain_frame
from dasflow.validation.report import render_html
from dasflow.validation.result import ExpectationRow, ValidationResult

#: record-level attributes of the confidential inputs; none may appear as a column of a release file
#: record identifiers and raw CEF response fields: never a column of a release file. Category names that are
#: legitimate dimensions of an aggregate table (CENRACE, HHGQ, HISPANIC, VOTINGAGE in TopDown and matrix
#: tables; public block GEOIDs) are not in this set.
CONFIDENTIAL_COLUMNS = frozenset({
    "MAFID", "PID", "EUID", "RTYPE", "QAGE", "QSEX", "QSPAN", "HOUSEHOLDER", "CENHISP", "RELSHIP",
    *(f"QRACE{i}" for i in range(1, 9)), "FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"})

_INT = r"-?[0-9]+"
_FLOAT = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|inf"


class OutputPlugin(Protocol):
    """What output validation needs of a product plugin (``dasflow.products.plugin.ProductPlugin``)."""

    @property
    def name(self) -> str: ...

    @property
    def may_be_empty(self) -> bool: ...

    def output_header(self, file: str) -> list[str] | None: ...

    def check_outputs(self, frames: Mapping[str, pd.DataFrame]) -> InputError | None: ...

    def check_release_files(self, files: Mapping[str, bytes], config: Any) -> None: ...


def _plugin(product: str) -> OutputPlugin | None:
    """The product's plugin, or None for a product the registry does not know (generic checks only)."""
    try:
        return get_plugin(product)
    except InputError:
        return None


def _read_release(root: Path) -> dict[str, pd.DataFrame]:
    out: dict[str, pd.DataFrame] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if not p.is_file() or "/" not in rel:  # CERTIFICATE.md, ledger.csv, MANIFEST.json are not tables
            continue
        if p.suffix == ".parquet":
            out[rel] = pd.read_parquet(p)  # as text in ``validate_outputs``, missing values kept missing
        elif p.suffix in (".csv", ".txt"):
            out[rel] = pd.read_csv(p, sep="|", dtype=str, keep_default_na=False)
    return out


def _planned_variances(plan_record: Mapping[str, Any], product: str) -> set[float]:
    vs = {float(Fraction(e["variance"])) if "/" in str(e["variance"]) else float(e["variance"])
          for e in plan_record.get("entries", []) if e["product"] == product}
    return vs | {a + b for a in vs for b in vs}


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """A release table's values as text for the expectations, a missing value (NaN/None in a frame, an empty
    field in a file) kept missing, so that the not-null expectation sees it (``astype(str)`` alone would turn
    NaN into the text "nan")."""
    text = frame.astype(str)
    return text.mask(frame.isna().to_numpy() | (text == "").to_numpy())


def _file_checks(plugin: OutputPlugin | None, rel: str, frame: pd.DataFrame) -> list[gx.Check]:
    """The generic expectations of one release file: its product's header (if declared), no nulls, integer
    COUNT, numeric VARIANCE."""
    header = plugin.output_header(rel.partition("/")[2]) if plugin is not None else None
    checks = [gx.Check("ExpectColumnValuesToNotBeNull", {"column": c}) for c in frame.columns]
    if header is not None:
        checks.insert(0, gx.Check("ExpectTableColumnsToMatchOrderedList", {"column_list": header}))
    if "COUNT" in frame.columns:
        checks.append(gx.Check("ExpectColumnValuesToMatchRegex", {"column": "COUNT", "regex": f"^(?:{_INT})$"}))
    if "VARIANCE" in frame.columns:
        checks.append(gx.Check("ExpectColumnValuesToMatchRegex", {"column": "VARIANCE", "regex": f"^(?:{_FLOAT})$"}))
    return checks


def _passing_groups(frames: Mapping[str, pd.DataFrame], suites: Mapping[str, list[gx.Check]]
                    ) -> dict[str, gx.SuiteOutcome]:
    """One GX run per group of files with the same product, columns and expectations, on the distinct values
    of each column over the whole group; file → its outcome for the groups that pass.

    Every expectation here is per value (not null, matches a regex) or on the column list, which the group
    shares: it holds for the group's distinct values iff it holds for every file's rows, and a passing run's
    results (unexpected count 0, the observed column list) are each file's. A group that fails is left out and
    its files are validated one by one, so a failure is reported for its own file, row and column as before."""
    groups: dict[tuple[str, tuple[str, ...], str], list[str]] = {}
    for rel, frame in frames.items():
        key = (rel.partition("/")[0], tuple(frame.columns), repr(suites[rel]))
        groups.setdefault(key, []).append(rel)
    out: dict[str, gx.SuiteOutcome] = {}
    for (product, columns, _), members in sorted(groups.items()):
        if len(members) < 2:
            continue
        values = {c: pd.concat([frames[rel][c] for rel in members], ignore_index=True) for c in columns}
        res = gx.validate(f"output.{product}.group.{'|'.join(columns)}", suites[members[0]], domain_frame(values))
        if res.success:
            out.update(dict.fromkeys(members, res))
    return out


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
    plugins = {rel.partition("/")[0]: _plugin(rel.partition("/")[0]) for rel in frames}
    text = {rel: _as_text(frame) for rel, frame in frames.items()}
    suites = {rel: _file_checks(plugins[rel.partition("/")[0]], rel, frame) for rel, frame in text.items()}
    passed = _passing_groups(text, suites)
    for rel, frame in sorted(text.items()):
        product, _, file = rel.partition("/")
        plugin = plugins[product]
        files[rel] = len(frame)
        leaked = sorted(CONFIDENTIAL_COLUMNS & set(frame.columns))
        checks = suites[rel]
        out = passed.get(rel) or gx.validate(f"output.{product}.{Path(file).name}.{'|'.join(frame.columns)}",
                                             checks, domain_frame({c: frame[c] for c in frame.columns}))
        rows += [ExpectationRow(rel, r.expectation, r.column, r.success, r.unexpected, r.detail) for r in out.rows]
        if error is None and leaked:
            error = InputError(f"confidential column {leaked[0]} in a release file", file=rel, row=1,
                               column=leaked[0])
        if error is None and len(frame) == 0 and not (plugin is not None and plugin.may_be_empty):
            error = InputError("release file has no rows", file=rel, row=2)
        if error is None and not out.success:
            bad = next(r for r in out.rows if not r.success)
            row = None
            if bad.column is not None and bad.expectation in ("expect_column_values_to_not_be_null",
                                                              "ExpectColumnValuesToNotBeNull"):
                hit = np.flatnonzero(frame[bad.column].isna().to_numpy())
                row = int(hit[0]) + 2 if hit.size else None
            elif bad.column is not None and out.first_failure and out.first_failure[2]:
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
    for product, plugin in sorted(plugins.items()):
        if error is None and plugin is not None:
            error = plugin.check_outputs({rel.partition("/")[2]: f for rel, f in frames.items()
                                          if rel.partition("/")[0] == product})
    for product, plugin in sorted(plugins.items()):
        folder = root / product if root is not None else None
        if error is None and plugin is not None and configs and product in configs and folder is not None \
                and folder.is_dir():
            release_files = {p.relative_to(folder).as_posix(): p.read_bytes()
                             for p in sorted(folder.rglob("*")) if p.is_file()}
            try:
                plugin.check_release_files(release_files, configs[product])
            except DasflowError as exc:
                error = exc if isinstance(exc, InputError) else InputError(str(exc), file=str(folder))
    summary = {"files": files, "suite_version": gx.SUITE_VERSION,
               "expectations": {"evaluated": len(rows), "failed": sum(not r.success for r in rows)}}
    result = ValidationResult("outputs", error is None, summary, rows, error=error)
    result.html = render_html(result)
    return result

"""Input validation of one product: the product's own fail-closed check, the vectorised cross-file facts and
the GX suites, combined into one :class:`ValidationResult` (phases 1–3 of the specs).

This module is generic machinery: which suites, facts and own check a product has is the product's plugin's
``input_checks`` (``dasflow.products.<p>.checks``); the helpers here (:class:`InputSuite`, :func:`fact`,
:func:`scalar_fact`, :func:`fact_not_in`, :func:`not_in`, :func:`first_dup_mask`, :func:`per_state`) are what
those plugins build them from.

Order and fail-closed argument: every check here reads only validated-or-rejected data and draws no noise; a
failure is returned as ``result.error`` (an ``InputError`` naming file, row and column) and the caller raises it
before preprocessing, so nothing is measured and no ledger entry is written for data that failed.
Per-state partitions: row counts and rule violations are reported per state from one vectorised pass, and GX
validates the distinct-value domain of every column (exactly equivalent for membership rules, see
:mod:`dasflow.validation.domain`), which keeps 10 M persons well inside a minute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import InputError
from dasflow.validation import gx, suites
from dasflow.validation.domain import Column, domain_frame, facts_frame
from dasflow.validation.lookup import GeoidIndex
from dasflow.validation.report import render_html
from dasflow.validation.result import ExpectationRow, ValidationResult
from dasflow.validation.stream import StreamedSuite, first_index_of, locate, range_only, suite_rows


@dataclass(frozen=True)
class InputSuite:
    """One input file's suite: its name in messages, its (full) columns — or a loader of them, called when the
    suite runs, so a split input is held one file at a time — and its checks."""

    suite: str
    file: str
    columns: Mapping[str, Column] | Callable[[], Mapping[str, Column]]
    checks: Sequence[Check]

    def load(self) -> Mapping[str, Column]:
        return self.columns() if callable(self.columns) else self.columns


Check = gx.Check


def fact(rule: str, file: str, column: str, bad: np.ndarray) -> dict[str, object]:
    """A rule's violation count and first offending row (1-based, header = row 1; 0 when none)."""
    idx = np.flatnonzero(bad)
    return {"rule": rule, "file": file, "column": column, "violations": int(idx.size),
            "first_row": int(idx[0]) + 2 if idx.size else 0}


def scalar_fact(rule: str, file: str, column: str, holds: bool) -> dict[str, object]:
    """A whole-file rule (no row): one violation when it does not hold."""
    return {"rule": rule, "file": file, "column": column, "violations": int(not holds), "first_row": 0}


def not_in(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``~np.isin(values, allowed)`` by hashing (numpy sorts when the value range is wide, as MAFIDs are: 7x
    slower at 10 M rows)."""
    return ~np.asarray(pd.Series(values).isin(pd.unique(np.asarray(allowed))).to_numpy(), dtype=bool)


def fact_not_in(rule: str, file: str, column: str, values: pa.ChunkedArray,
                allowed: pa.Array | pa.ChunkedArray | GeoidIndex,
                where: pa.ChunkedArray | None = None) -> dict[str, object]:
    """A membership rule decided on the distinct values (cheap at 10 M rows); rows are scanned only to count
    and locate violations once a bad value is known to exist. ``allowed``: the values, or a :class:`GeoidIndex`
    built once over a large list (a national block list checked batch after batch)."""
    candidates = values if where is None else pc.filter(values, where)
    uniq = pc.unique(candidates)
    if isinstance(allowed, GeoidIndex):
        bad_values = pc.filter(uniq, pa.array(allowed.positions(uniq) < 0))
    else:
        bad_values = pc.filter(uniq, pc.invert(pc.is_in(uniq, value_set=allowed)))
    if len(bad_values) == 0:
        return {"rule": rule, "file": file, "column": column, "violations": 0, "first_row": 0}
    mask = pc.is_in(values, value_set=bad_values)
    if where is not None:
        mask = pc.and_(mask, where)
    return fact(rule, file, column, mask.to_numpy(zero_copy_only=False))


def first_dup_mask(values: np.ndarray) -> np.ndarray:
    """True on every row whose value occurred on an earlier row."""
    return np.asarray(pd.Series(values).duplicated(keep="first").to_numpy(), dtype=bool)


def per_state(codes: np.ndarray, fmt: Callable[[int], str]) -> dict[str, int]:
    """Row counts per (integer) state code, keyed by ``fmt(code)`` (a summary: counts only)."""
    values, counts = np.unique(codes, return_counts=True)
    return {fmt(int(v)): int(c) for v, c in zip(values, counts, strict=True)}


def table_columns(table: pa.Table) -> dict[str, Column]:
    """A pyarrow table's columns by name (an :class:`InputSuite`'s columns)."""
    return {c: table.column(c) for c in table.column_names}


def _first_row_of(col: Column, value: Any) -> int | None:
    """1-based row (header = 1) of the first occurrence of ``value`` in a column (vectorised)."""
    index = first_index_of(col, value)
    return None if index is None else index + 2


class InputPlugin(Protocol):
    """What input validation needs of a product plugin (``dasflow.products.plugin.ProductPlugin``): its name
    and its ``input_checks`` (an ``InputChecks``: suites, facts, summary, own check)."""

    @property
    def name(self) -> str: ...

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: Any) -> Any: ...


class StreamedInputPlugin(Protocol):
    """What streamed input validation needs of a product plugin: its name and ``stream_checks`` (an
    ``InputChecks`` whose suites may be :class:`~dasflow.validation.stream.StreamedSuite`, built in one chunked
    pass over the confidential files)."""

    @property
    def name(self) -> str: ...

    def stream_checks(self, store: Any, inputs: Mapping[str, str], public: Mapping[str, Any], config: Any,
                      chunk_rows: int) -> Any: ...


def _error_from_suite(s: InputSuite, columns: Mapping[str, Column], rows: list[ExpectationRow],
                      first: tuple[Check, list[Any], list[Any]] | None) -> InputError:
    check = first[0] if first else None
    bad = next(r for r in rows if not r.success)
    column = bad.column or (check.column if check else None)
    row = None
    if first is not None and first[2] and column is not None and column in columns:
        row = _first_row_of(columns[column], first[2][0])
    elif column is None:
        row = 1  # header-level expectation (column set, order)
    return InputError(f"{bad.expectation} failed ({bad.detail}) [suite {s.suite}]", file=s.file, row=row,
                      column=column)


def run_product_suite(plugin: InputPlugin, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: Any) -> ValidationResult:
    """Validate one product's inputs (phases 1–3) with its GX suites; never raises for bad data.

    ``confidential``/``public``/``config`` are what the product's plugin returns (``confidential_inputs``,
    ``public_inputs``, ``load_config``); ``plugin.input_checks`` says which suites, facts and own check run (a
    product without suites: its own ``validate`` and zero expectations). Call ``result.raise_for_failure()`` to
    fail closed.
    """
    return evaluate(plugin.name, lambda: plugin.input_checks(confidential, public, config))


def run_streamed_suite(plugin: StreamedInputPlugin, store: Any, inputs: Mapping[str, str],
                       public: Mapping[str, Any], config: Any, chunk_rows: int) -> ValidationResult:
    """:func:`run_product_suite` with the confidential inputs streamed: ``plugin.stream_checks`` reads them in
    chunks of at most ``chunk_rows`` rows (or one partition file at a time), keeping only the suites' domains,
    the rules' counts and first rows and the key sets cross-row rules need. Same verdict, summary and report
    as the whole-input path on the same inputs; errors name the file and its own row."""
    return evaluate(plugin.name, lambda: plugin.stream_checks(store, inputs, public, config, chunk_rows))


def evaluate(product: str, build: Callable[[], Any]) -> ValidationResult:
    """Run an ``InputChecks`` plan (``build()``: its suites, facts, summary and own check; an ``InputError``
    while building it is the result's error) into one :class:`ValidationResult`."""
    error: InputError | None = None
    rows: list[ExpectationRow] = []
    inputs: list[InputSuite | StreamedSuite] = []
    facts: list[dict[str, object]] = []
    summary: dict[str, Any] = {}
    own: Callable[[], None] | None = None
    try:
        checks = build()
        inputs, facts, summary, own = list(checks.suites), list(checks.facts), checks.summary, checks.own
    except InputError as exc:  # the inputs could not even be assembled (e.g. an iteration file is unreadable)
        error = exc
    if own is not None:
        try:
            own()  # the product's own fail-closed checks (authoritative first error)
        except InputError as exc:
            error = exc
    for s in inputs:
        if isinstance(s, StreamedSuite):
            new_rows, failure = _run_streamed(s)
            rows += new_rows
            if failure is not None and error is None:
                error = failure
            continue
        columns = s.load()
        out = gx.validate(s.suite, s.checks, domain_frame(columns, extremes_only=range_only(s.checks)))
        rows += out.rows
        if not out.success and error is None:
            error = _error_from_suite(s, columns, out.rows, out.first_failure)
        del columns
    if facts:
        ff = facts_frame(facts)
        out = gx.validate(f"{product}.cross_file", suites.FACTS_SUITE, ff)
        rows += out.rows
        if not out.success and error is None:
            bad = ff[ff.violations > 0].iloc[0]
            error = InputError(f"{bad.rule} violated", file=str(bad.file),
                               row=int(bad.first_row) or None, column=str(bad.column))
        summary["cross_file"] = ff.to_dict(orient="records")
    summary["suite_version"] = gx.SUITE_VERSION
    summary["expectations"] = {"evaluated": len(rows), "failed": sum(not r.success for r in rows)}
    result = ValidationResult(product=product, success=error is None, summary=summary, rows=rows, error=error)
    result.html = render_html(result)
    return result


def _run_streamed(s: StreamedSuite) -> tuple[list[ExpectationRow], InputError | None]:
    """A streamed suite: one GX run on the union of its parts' domains; only if that fails, one per part (in
    order), the first failing part's error located by reading that part again."""
    if not s.parts:
        return [], None
    out = gx.validate(s.suite, s.checks, s.union() if len(s.parts) > 1 else s.parts[0].frame())
    if out.success:
        return suite_rows(out, len(s.parts)), None
    rows: list[ExpectationRow] = []
    error: InputError | None = None
    for part in s.parts:
        o = out if len(s.parts) == 1 else gx.validate(s.suite, s.checks, part.frame())
        rows += o.rows
        if not o.success and error is None:
            check = o.first_failure[0] if o.first_failure else None
            bad = next(r for r in o.rows if not r.success)
            column = bad.column or (check.column if check else None)
            file, row = part.file, None
            if o.first_failure is not None and o.first_failure[2] and column is not None:
                where = locate(part.source, column, o.first_failure[2][0])
                if where is not None:
                    file, row = where
            elif column is None:
                row = 1  # header-level expectation (column set, order)
            error = InputError(f"{bad.expectation} failed ({bad.detail}) [suite {s.suite}]", file=file, row=row,
                               column=column)
    return rows, error

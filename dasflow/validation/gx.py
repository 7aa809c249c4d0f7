"""Great Expectations 1.x, code-defined and ephemeral: suites are plain data (:class:`Check` lists) versioned
in this repository and turned into ``gx.ExpectationSuite`` objects only when validated.

GX is imported lazily (the import costs seconds; :func:`warm_up` starts it in the background) and each suite is
validated as one batch (per-expectation validation costs ~0.4 s each; field notes §3). One ephemeral context per
process is reused, by one thread at a time: its batch definition takes the frame to validate as a batch
parameter, so every use of the context (creating it, registering a suite, one validation) holds ``_LOCK`` —
products validated side by side overlap their reading and checks, never their GX runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dasflow.validation.result import ExpectationRow

#: bump when any suite changes meaning; recorded in every result and report
SUITE_VERSION = "1"

_STATE: dict[str, Any] = {}
_LOCK = threading.RLock()


@dataclass(frozen=True)
class Check:
    """One expectation: a GX expectation class name (``great_expectations.expectations``) and its kwargs."""

    expectation: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def column(self) -> str | None:
        col = self.kwargs.get("column")
        return str(col) if col is not None else None


@dataclass(frozen=True)
class SuiteOutcome:
    success: bool
    rows: list[ExpectationRow]
    first_failure: tuple[Check, list[Any], list[Any]] | None  # check, partial unexpected indexes, values


def warm_up() -> threading.Thread:
    """Import GX and create the context in a daemon thread now (a command that will validate calls this while
    it waits for something else); the first :func:`validate` waits for it to finish. Only a head start: any
    failure here is dropped (no traceback on the operator's console), and the first validation creates the
    context itself and reports what fails."""

    def start() -> None:
        with contextlib.suppress(Exception):
            _context()

    thread = threading.Thread(target=start, name="gx-warm-up", daemon=True)
    thread.start()
    return thread


def _context() -> Any:
    with _LOCK:
        return _create()


def _create() -> Any:
    if "ctx" not in _STATE:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
        import great_expectations as gx

        logging.getLogger("great_expectations").setLevel(logging.ERROR)
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        bd = (ctx.data_sources.add_pandas(name="dasflow").add_dataframe_asset(name="frame")
              .add_batch_definition_whole_dataframe("whole"))
        _STATE.update(ctx=ctx, bd=bd, gx=gx, suites={})
    return _STATE


def build_suite(name: str, checks: Sequence[Check]) -> Any:
    """The GX suite of ``checks`` (cached per name; registered in the ephemeral context)."""
    with _LOCK:
        return _build_suite(name, checks)


def _build_suite(name: str, checks: Sequence[Check]) -> Any:
    st = _context()
    suites: dict[str, Any] = st["suites"]
    digest = hashlib.sha256(repr([(c.expectation, sorted(c.kwargs.items())) for c in checks]).encode()).hexdigest()
    key = f"{name}.{digest[:12]}"  # same name, different checks (e.g. another TopDown schema): another suite
    if key not in suites:
        import great_expectations.expectations as gxe

        gx = st["gx"]
        suite = gx.ExpectationSuite(name=f"{key}.v{SUITE_VERSION}", meta={"dasflow_suite_version": SUITE_VERSION})
        for c in checks:
            suite.add_expectation(getattr(gxe, c.expectation)(**c.kwargs))
        suites[key] = st["ctx"].suites.add(suite)
    return suites[key]


def _detail(result: dict[str, Any], expectation: str) -> str:
    """What failed, without a confidential value: a table's column names (the schema) are shown; values,
    observed statistics and unexpected-value samples never are (they would reach logs and the Prefect
    database through the error message)."""
    if "table_columns" in expectation and "observed_value" in result:
        return f"observed columns {result['observed_value']!r}"[:200]
    return "values outside the expected domain" if result.get("unexpected_count") else ""


def validate(name: str, checks: Sequence[Check], frame: pd.DataFrame) -> SuiteOutcome:
    """Validate the whole suite against ``frame`` in one batch.

    Result format BASIC first (≈ 40 % cheaper than SUMMARY: no partial unexpected index lists); its results hold
    every field a passing suite's rows are made of (success, unexpected count, observed value). A suite that
    fails is run again with SUMMARY, so its rows and first failure (indexes and values) are exactly as before."""
    with _LOCK:
        st = _context()
        suite = build_suite(name, checks)
        res = st["bd"].get_batch(batch_parameters={"dataframe": frame}).validate(suite, result_format="BASIC")
        if not res.success or any(r.exception_info and r.exception_info.get("raised_exception")
                                  for r in res.results):
            res = st["bd"].get_batch(batch_parameters={"dataframe": frame}).validate(suite,
                                                                                     result_format="SUMMARY")
    by_key = {(c.expectation, c.column): c for c in checks}
    rows: list[ExpectationRow] = []
    first: tuple[Check, list[Any], list[Any]] | None = None
    for r in res.results:
        cfg = r.expectation_config
        result = dict(r.result or {})
        col = cfg.kwargs.get("column")
        raised = bool(r.exception_info and r.exception_info.get("raised_exception"))
        ok = bool(r.success) and not raised
        cls = "".join(w.capitalize() for w in cfg.type.split("_"))
        rows.append(ExpectationRow(suite=name, expectation=cfg.type, column=col, success=ok,
                                   unexpected=result.get("unexpected_count"),
                                   detail=("expectation raised an exception" if raised
                                           else _detail(result, cfg.type))))
        if not ok and first is None:
            check = by_key.get((cls, col), Check(cls, {"column": col} if col else {}))
            first = (check, list(result.get("partial_unexpected_index_list") or []),
                     list(result.get("partial_unexpected_list") or []))
    # GX does not keep the suite order in results; report in suite order
    order = {(c.expectation.lower(), c.column): i for i, c in enumerate(checks)}
    rows.sort(key=lambda row: order.get((row.expectation.replace("_", ""), row.column), len(order)))
    return SuiteOutcome(success=all(r.success for r in rows), rows=rows, first_failure=first)

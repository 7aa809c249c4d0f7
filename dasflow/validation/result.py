"""The outcome of one validation run: success flag, JSON-able summary, GX results, Data Docs HTML, error."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dasflow.errors import InputError


@dataclass
class ExpectationRow:
    """One evaluated expectation (a row of the acceptance report)."""

    suite: str
    expectation: str
    column: str | None
    success: bool
    unexpected: int | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "expectation": self.expectation, "column": self.column,
                "success": self.success, "unexpected": self.unexpected, "detail": self.detail}


@dataclass
class ValidationResult:
    """What a product's validation produced.

    ``success`` is False iff ``error`` is set; ``error`` is the first failure as an :class:`InputError` naming
    file, row (1-based, header = row 1) and column. ``summary`` is JSON-able (the integrator writes it to
    ``runs/{id}/validation/{product}.json``); ``html`` is the self-contained Data Docs page.
    """

    product: str
    success: bool
    summary: dict[str, Any]
    rows: list[ExpectationRow] = field(default_factory=list)
    html: str = ""
    error: InputError | None = None

    def to_json(self) -> str:
        doc = {"product": self.product, "passed": self.success, **self.summary,
               "expectations": [r.as_dict() for r in self.rows],
               "error": None if self.error is None else error_record(self.error)}
        return json.dumps(doc, sort_keys=True, indent=1, default=str) + "\n"

    def raise_for_failure(self) -> None:
        """Fail closed: raise the recorded ``InputError`` (exit code 2) if validation failed."""
        if self.error is not None:
            raise self.error


def error_record(exc: InputError) -> dict[str, Any]:
    return {"message": str(exc), "file": exc.file, "row": exc.row, "column": exc.column}

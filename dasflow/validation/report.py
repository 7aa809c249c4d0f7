"""Data Docs: one self-contained HTML page per validation run (no external assets; safe to publish, since it
carries only expectation outcomes, counts and at most five example values of *failed* expectations).

GX's own Data Docs site builder needs a file-backed context and writes a multi-file site; a single page per
(release, product) stored next to the JSON result under ``runs/{release_id}/validation/`` is what an operator
opens from the Prefect artifact link, so it is rendered here from the same GX validation results.
"""

from __future__ import annotations

import html
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dasflow.validation.result import ValidationResult

_CSS = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:2px 6px;font-size:13px}.ok{color:#060}.bad{color:#a00;font-weight:bold}")


def render_html(result: ValidationResult) -> str:
    """The Data Docs page of one product's validation."""
    e = html.escape
    status = '<span class="ok">PASSED</span>' if result.success else '<span class="bad">FAILED</span>'
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>validation {e(result.product)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>Input validation: {e(result.product)} — {status}</h1>"]
    if result.error is not None:
        err = result.error
        parts.append(f"<p class='bad'>{e(str(err))}</p><p>file: {e(str(err.file))}, row: {e(str(err.row))}, "
                     f"column: {e(str(err.column))}</p>")
    summary = {k: v for k, v in result.summary.items() if k != "cross_file"}
    parts.append(f"<h2>Summary</h2><pre>{e(json.dumps(summary, indent=1, sort_keys=True, default=str))}</pre>")
    facts = result.summary.get("cross_file")
    if facts:
        parts.append("<h2>Cross-file and row-level rules</h2><table><tr><th>rule</th><th>file</th><th>column</th>"
                     "<th>violations</th><th>first row</th></tr>")
        for f in facts:
            cls = "ok" if not f["violations"] else "bad"
            parts.append(f"<tr class='{cls}'><td>{e(str(f['rule']))}</td><td>{e(str(f['file']))}</td>"
                         f"<td>{e(str(f['column']))}</td><td>{f['violations']}</td>"
                         f"<td>{f['first_row'] or ''}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Expectations</h2><table><tr><th>suite</th><th>expectation</th><th>column</th>"
                 "<th>result</th><th>unexpected</th><th>detail</th></tr>")
    for r in result.rows:
        cls, word = ("ok", "pass") if r.success else ("bad", "FAIL")
        detail = r.detail if not r.success else ""
        parts.append(f"<tr><td>{e(r.suite)}</td><td>{e(r.expectation)}</td><td>{e(str(r.column or ''))}</td>"
                     f"<td class='{cls}'>{word}</td><td>{'' if r.unexpected is None else r.unexpected}</td>"
                     f"<td>{e(detail)}</td></tr>")
    parts.append("</table></body></html>\n")
    return "".join(parts)

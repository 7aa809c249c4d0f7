"""A release's reports as Prefect artifacts, readable in place in the UI (no ``s3://`` or ``file://`` links, which
a browser cannot follow): the privacy certificate, an accuracy summary, the validation summary, the ledger with a
totals row, a per-stage timing table (Prefect's task runs) and the stages' own metrics (wall, CPU, peak RSS from
their manifests).

Everything shown is what the release folder publishes or what the plan fixes (budgets, analytic MOEs), plus the
validation summaries (pass/fail and row counts, operator-internal like the Prefect UI itself) and timings.
"""

from __future__ import annotations

import json
import re
from typing import Any
from uuid import UUID

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from dasflow.io.store import StoreError
from dasflow.pipeline.metrics import stage_metrics
from dasflow.pipeline.run import RunContext
from dasflow.release.accuracy import expected_moes


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")[:100]


def ledger_rows(ctx: RunContext) -> list[dict[str, Any]]:
    """The ledger audit, one row per planned key, and a last TOTAL row: planned and spent ρ (exact) and the
    committed / planned key counts."""
    rows = [{k: v for k, v in r.items() if k != "nmf_sha256"} for r in ctx.ledger.audit()]
    total = ctx.ledger.plan_record()["total"]
    spent = ctx.ledger.spent().as_record()
    rows.append({"product": "TOTAL", "key": f"{len(rows)} keys", "privacy_defn": "zcdp (composed)",
                 "mechanism": "", "budget": f"planned rho = {total['rho']}",
                 "noise": f"epsilon at 1e-10 = {total['epsilon_at_delta']}",
                 "state": f"{spent['entries']}/{len(rows)} committed, spent rho = {spent['rho']}"})
    return rows


def ledger_artifact(ctx: RunContext) -> None:
    create_table_artifact(key=artifact_key("ledger", ctx.release_id), table=ledger_rows(ctx),
                          description=f"privacy ledger of release {ctx.release_id} (last row: totals)")


def certificate_artifact(ctx: RunContext) -> None:
    """The privacy certificate exactly as published (``release/CERTIFICATE.md``)."""
    text = ctx.post_store().get_text(f"{ctx.root}/release/CERTIFICATE.md")
    create_markdown_artifact(key=artifact_key("certificate", ctx.release_id), markdown=text,
                             description=f"privacy certificate of release {ctx.release_id}")


def accuracy_rows(ctx: RunContext) -> list[dict[str, Any]]:
    """Per product and level: keys, cells and the analytic 90 % / 95 % MOE of one noisy cell (plan only)."""
    moes = expected_moes(ctx)
    if moes.empty:
        return []
    per_level = moes.groupby(["product", "level", "mechanism"], sort=False).agg(
        keys=("key", "size"), cells=("cells", "sum"), moe90_min=("moe90", "min"), moe90_max=("moe90", "max"),
        moe95_max=("moe95", "max")).reset_index()
    return [{"product": r["product"], "level": str(r["level"]), "mechanism": r["mechanism"], "keys": int(r["keys"]),
             "cells": int(r["cells"]), "90 % MOE": f"{r['moe90_min']}–{r['moe90_max']}",
             "95 % MOE (max)": str(r["moe95_max"])} for r in per_level.to_dict("records")]


def accuracy_artifact(ctx: RunContext) -> None:
    create_table_artifact(key=artifact_key("accuracy", ctx.release_id), table=accuracy_rows(ctx),
                          description=f"accuracy summary of {ctx.release_id}: analytic MOE of one noisy cell per "
                                      "product and level (the full report with plots: release/ACCURACY.html)")


def validation_rows(ctx: RunContext) -> list[dict[str, Any]]:
    """Per product: whether its inputs passed validation and the summary's other fields."""
    rows = []
    for p in ctx.config.products:
        try:
            summary = json.loads(ctx.store.get(f"{ctx.root}/validation/{p.name}.json"))
        except StoreError:
            rows.append({"product": p.name, "passed": "no summary", "details": ""})
            continue
        # only facts about the check itself reach Prefect's database: row and per-state counts of the confidential
        # files are confidential (they stay in validation/{product}.json on the confidential side)
        details = {k: v for k, v in summary.items() if k in ("universe", "gx", "suite_version")}
        rows.append({"product": p.name, "passed": summary.get("passed"),
                     "details": json.dumps(details, sort_keys=True)[:500]})
    return rows


def validation_artifact(ctx: RunContext) -> None:
    create_table_artifact(key=artifact_key("validation", ctx.release_id), table=validation_rows(ctx),
                          description=f"input validation of release {ctx.release_id}")


def timing_rows(flow_run_id: UUID) -> list[dict[str, Any]]:
    """Every task run of the release flow run and of its product subflows: name, state, start, seconds."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id])))
        names = {flow_run_id: "release", **{c.id: c.name for c in children}}
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(
            flow_run_id=TaskRunFilterFlowRunId(any_=list(names))))
    rows = []
    for run in sorted(runs, key=lambda r: (r.start_time is None, r.start_time)):
        rows.append({"flow run": names.get(run.flow_run_id, "") if run.flow_run_id else "", "task": run.name,
                     "state": run.state.name if run.state else "",
                     "started": run.start_time.isoformat(timespec="seconds") if run.start_time else "",
                     "seconds": round(run.total_run_time.total_seconds(), 2)})
    return rows


def timing_artifact(release_id: str, flow_run_id: UUID) -> None:
    create_table_artifact(key=artifact_key("timings", release_id), table=timing_rows(flow_run_id),
                          description=f"per-stage timings of release {release_id} (this flow run)")


def stage_metrics_artifact(ctx: RunContext) -> None:
    """Per stage and product: wall seconds, CPU seconds and peak RSS as the stage manifests recorded them."""
    create_table_artifact(key=artifact_key("stage-metrics", ctx.release_id), table=stage_metrics(ctx),
                          description=f"stage metrics of release {ctx.release_id}: wall and CPU seconds and peak "
                                      f"RSS of the process running each stage, from runs/{ctx.release_id}/manifests/ "
                                      "(a resumed stage keeps the metrics of the run that computed it)")


def release_reports(ctx: RunContext, flow_run_id: UUID | None) -> None:
    """Every report of a finished release as artifacts of the current run."""
    ledger_artifact(ctx)
    certificate_artifact(ctx)
    accuracy_artifact(ctx)
    validation_artifact(ctx)
    stage_metrics_artifact(ctx)
    if flow_run_id is not None:
        timing_artifact(ctx.release_id, flow_run_id)


def product_validation_artifact(ctx: RunContext, product: str) -> None:
    """The validation summary of one product, as soon as it is known (also when validation failed)."""
    rows = [r for r in validation_rows(ctx) if r["product"] == product]
    create_table_artifact(key=artifact_key("validation", ctx.release_id, product), table=rows,
                          description=f"input validation of {product} (Great Expectations; the full Data Docs page "
                                      f"is validation/{product}.html in the release store)")

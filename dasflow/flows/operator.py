"""Operator flows: resume a release, rerun post-processing + release from the stored noisy measurements (no new
spend, proven by the ledger), and a ledger report artifact."""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from dasflow.flows.release import run_release
from dasflow.pipeline.run import open_run
from dasflow.release.operator import rerun_postprocess
from dasflow.release.publish import publish
from dasflow.tasks.reports import artifact_key as _artifact_key
from dasflow.tasks.reports import ledger_artifact


@flow(name="dasflow-resume", log_prints=True)
def resume_flow(release_id: str, store: str) -> dict[str, Any]:
    """Resume a stopped release from its frozen config: committed measurements are reused, never redrawn."""
    return run_release(open_run(release_id, store).config)


@flow(name="dasflow-rerun-postprocess", log_prints=True)
def rerun_postprocess_flow(release_id: str, store: str) -> dict[str, Any]:
    """Post-processing and release again from the committed noisy measurements; the ledger must not change."""
    result = rerun_postprocess(open_run(release_id, store))
    print(f"release {release_id}: post-processing rerun, {result['files']} files; ledger unchanged "
          f"({result['ledger_objects']} objects, spent rho = {result['spent']['rho']})")
    return result


@flow(name="dasflow-ledger-report", log_prints=True)
def ledger_report_flow(release_id: str, store: str) -> dict[str, Any]:
    """The ledger as a table artifact (last row: totals) and the plan totals as a markdown artifact."""
    ctx = open_run(release_id, store)
    rows = ctx.ledger.audit()
    ledger_artifact(ctx)
    total = ctx.ledger.plan_record()["total"]
    spent = ctx.ledger.spent().as_record()
    create_markdown_artifact(key=_artifact_key("ledger-total", release_id), markdown=(
        f"# Ledger of `{release_id}`\n\n- planned: rho = {total['rho']} ({total['entries']} keys)\n"
        f"- spent: rho = {spent['rho']} ({spent['entries']} keys committed)\n"
        f"- epsilon at delta = 1e-10: {spent['epsilon_at_delta']} ({spent['conversion']})\n"))
    return {"planned": total, "spent": spent, "keys": len(rows)}


@flow(name="dasflow-publish", log_prints=True)
def publish_flow(release_id: str, store: str, target: str, test_publication: bool = False) -> dict[str, Any]:
    """Copy a finished release to a publication location separate from the confidential inputs (re-publishing is
    byte-identical; a test release can only be published as a marked test publication)."""
    result = publish(open_run(release_id, store), target, test_publication=test_publication)
    print(f"release {release_id} published to {target}")
    return result

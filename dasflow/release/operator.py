"""Operator actions on an existing release (no Prefect here; ``flows/operator.py`` wraps them)."""

from __future__ import annotations

from typing import Any

from dasflow.errors import LedgerRefusal
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext
from dasflow.release.stage import release_stage


def ledger_snapshot(ctx: RunContext) -> dict[str, Any]:
    """Every ledger object with its hash, plus the spent total: what "no new spend" is checked against."""
    keys = ctx.store.list(f"{ctx.root}/ledger/")
    return {"objects": {k: ctx.store.sha256(k) for k in keys}, "spent": ctx.ledger.spent().as_record()}


def rerun_postprocess(ctx: RunContext) -> dict[str, Any]:
    """Recompute post-processing and the release from the stored noisy measurements only.

    Refuses (``LedgerRefusal``) unless every planned key is committed; nothing is measured. The ledger is
    snapshotted before and after and must be unchanged, object for object: the proof that the rerun spent no
    privacy budget.
    """
    before = ledger_snapshot(ctx)
    for p in ctx.config.products:
        stages.committed_measurements(ctx, p.name)  # refuses if any planned key is not committed (nothing read)
    for p in ctx.config.products:
        stages.postprocess_stage(ctx, p.name, force=True)
    manifest = release_stage(ctx)
    after = ledger_snapshot(ctx)
    if after != before:
        raise LedgerRefusal("the ledger changed during a post-processing rerun; investigate before publishing")
    return {"release_id": ctx.release_id, "files": len(manifest["files"]), "ledger_unchanged": True,
            "ledger_objects": len(after["objects"]), "spent": after["spent"]}

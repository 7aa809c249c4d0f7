"""A small but complete release (the DAG's counts test product) for the release-stage tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config
from tests.dag.helpers import local_release


def released_context(tmp: Path, **kw: Any) -> RunContext:
    """Freeze, plan, validate, preprocess, measure, post-process and release the counts product."""
    store, cfg = local_release(tmp, **kw)
    ctx = freeze_config(cfg, store)
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    for p in ctx.config.products:
        stages.preprocess_stage(ctx, p.name)
        stages.measure_stage(ctx, p.name)
        stages.postprocess_stage(ctx, p.name)
    stages.release_stage(ctx)
    return ctx

"""A small but complete release (the DAG's counts test product) for the release-stage tests, and the counts
product's ground-truth twin (given to its plugin by the tests that need one)."""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dasflow.io.store import ObjectStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config
from dasflow.registry import get_plugin
from dasflow.release.stage import release_stage
from tests.dag import counts_product
from tests.dag.helpers import local_release

TruthFn = Callable[[ObjectStore], dict[str, pd.DataFrame]]


def postprocessed_context(tmp: Path, **kw: Any) -> RunContext:
    """Freeze, plan, validate, preprocess, measure and post-process the counts product (nothing released)."""
    store, cfg = local_release(tmp, **kw)
    ctx = freeze_config(cfg, store)
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    for p in ctx.config.products:
        stages.preprocess_stage(ctx, p.name)
        stages.measure_stage(ctx, p.name)
        stages.postprocess_stage(ctx, p.name)
    return ctx


def released_context(tmp: Path, **kw: Any) -> RunContext:
    """:func:`postprocessed_context`, then the release stage."""
    ctx = postprocessed_context(tmp, **kw)
    release_stage(ctx)
    return ctx


def counts_truth_frames(store: ObjectStore) -> dict[str, pd.DataFrame]:
    """Exact tabulation of the counts test product (its ground-truth twin), in its release layout."""
    persons = pd.read_csv(io.BytesIO(store.get(counts_product.PERSONS)), dtype=str)
    return {"state.csv": persons.groupby("STATE").size().rename("COUNT").reset_index(),
            "state_sex.csv": persons.groupby(["STATE", "SEX"]).size().rename("COUNT").reset_index()}


def give_counts_truth(monkeypatch: pytest.MonkeyPatch, fn: TruthFn = counts_truth_frames) -> None:
    """Give the counts product's plugin a ground-truth twin (its ``truth`` hook) until the test ends."""

    def truth(self: Any, store: ObjectStore, inputs: Mapping[str, str], config: Any,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
        return fn(store)

    monkeypatch.setattr(type(get_plugin("counts")), "truth", truth)


def take_counts_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counts product without a ground-truth twin (the plugin's default ``truth``) until the test ends."""
    cls = type(get_plugin("counts"))
    if "truth" in cls.__dict__:
        monkeypatch.delattr(cls, "truth")

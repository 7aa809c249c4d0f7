"""Where an accuracy experiment is recorded for a release *method*, and how a release's accuracy report finds it.

An experiment (``dasflow experiment``, :mod:`dasflow.experiment`) records ``metrics.csv``, ``report.html`` and
``experiment.json`` in the config's store under ``experiments/{method_sha256}/`` — the method being the
universe and the product configs (:func:`method_sha256`). The accuracy report of any release with that method
shows them. They are computed from synthetic inputs only (the experiment refuses any other input), so a
production release may show them. This module sits in the release layer so that the report needs nothing from
the experiment package above it.
"""

from __future__ import annotations

import hashlib
import io
import json
from typing import Any

import pandas as pd

from dasflow.config import ReleaseConfig
from dasflow.io.store import ObjectStore, StoreError

#: metrics.csv columns (definitions in :mod:`dasflow.experiment.metrics`)
COLUMNS = ("product", "table", "geolevel", "pop_bin", "budget_scale", "runs", "cells", "mae", "rmse",
           "mean_relative_error", "bias", "within_moe", "q90_abs_error")


def method_sha256(config: ReleaseConfig) -> str:
    """SHA-256 of what decides a release's accuracy: the universe and every product with its config text
    (budgets, splits, parameters) — not the inputs, store, release id or randomness. An experiment on synthetic
    inputs and a production release with the same method share it."""
    method = {"universe": config.universe,
              "products": [{"name": p.name, "config_text": p.config_text} for p in config.products]}
    return hashlib.sha256(json.dumps(method, sort_keys=True).encode()).hexdigest()


def prefix(method_sha256: str) -> str:
    """The store prefix of the experiment recorded for a method."""
    return f"experiments/{method_sha256}/"


def recorded(store: ObjectStore, method_sha256: str) -> tuple[dict[str, Any], pd.DataFrame] | None:
    """The experiment recorded in ``store`` for a method (its experiment.json and metrics), if any and
    complete; ``None`` otherwise."""
    key = prefix(method_sha256)
    try:
        meta = json.loads(store.get(key + "experiment.json"))
        table = pd.read_csv(io.BytesIO(store.get(key + "metrics.csv")))
    except (StoreError, ValueError):
        return None
    if meta.get("method_sha256") != method_sha256 or list(table.columns) != list(COLUMNS):
        return None
    return meta, table

"""Test fixtures are synthetic data: mark a release's confidential inputs as such (``dasflow.synth`` manifest
format), so that seeded test mode accepts them (``dasflow.pipeline.inputs.check_synthetic``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dasflow.io.store import ObjectStore
from dasflow.pipeline.inputs import input_layout, mark_synthetic


def mark_inputs(store: ObjectStore, raw: Mapping[str, Any], note: str = "test fixture") -> None:
    """Mark every confidential input of the release config ``raw`` as synthetic (after its files are written)."""
    layout = input_layout([p["name"] for p in raw["products"]], raw.get("inputs", {}))
    for prefix in layout.confidential.values():
        if store.list(prefix):
            mark_synthetic(store, prefix, generator_note=note)

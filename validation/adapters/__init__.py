"""Validated product adapters: ``install()`` puts the validation gate in front of every shipped product."""

from __future__ import annotations

from dasflow.pipeline.adapters import REGISTRY

MODULES = {"phsafe": "validation.adapters.phsafe", "safetab-p": "validation.adapters.safetab_p",
           "groupsize": "validation.adapters.groupsize", "topdown": "validation.adapters.topdown"}


def install() -> None:
    """Register the validated adapters in the DAG's adapter registry (idempotent)."""
    REGISTRY.update(MODULES)

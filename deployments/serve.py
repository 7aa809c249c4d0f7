"""The ``serve`` equivalent of ``prefect.yaml`` (one long-running process, no work pool), built from that very
file so the two can never disagree (names, entry points, parameters, schedules — inactive as declared)::

    .venv/bin/python deployments/serve.py            # against PREFECT_API_URL, from the repository root
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow, serve
from prefect.schedules import Cron

SPEC = Path(__file__).with_name("prefect.yaml")


def entries() -> list[dict[str, Any]]:
    """The deployment entries of ``prefect.yaml``."""
    spec: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    return list(spec["deployments"])


def deployments() -> list[Any]:
    """Every ``prefect.yaml`` entry as a served deployment."""
    built = []
    for entry in entries():
        path, name = entry["entrypoint"].split(":")
        flow_ = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
        assert isinstance(flow_, Flow), entry["entrypoint"]
        schedules = [Cron(s["cron"], timezone=s.get("timezone"), active=bool(s.get("active", True)))
                     for s in entry.get("schedules", [])]
        built.append(flow_.to_deployment(name=entry["name"], description=entry.get("description"),
                                         parameters=entry.get("parameters") or None, schedules=schedules or None,
                                         tags=entry.get("tags")))
    return built


if __name__ == "__main__":
    serve(*deployments())
